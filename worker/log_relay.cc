#include "worker/log_relay.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/time_util.h"
#include "common/utf8.h"

namespace weft::worker {

LogRelay::LogRelay(Options options) : options_(std::move(options)) {
  set_level(spdlog::level::info);
}

std::shared_ptr<LogRelay> LogRelay::Attach(spdlog::logger& logger, Options options) {
  auto relay = std::make_shared<LogRelay>(std::move(options));
  logger.sinks().push_back(relay);
  return relay;
}

std::shared_ptr<LogRelay> LogRelay::Attach(spdlog::logger& logger) {
  return Attach(logger, Options());
}

void LogRelay::SetRun(const std::string& job_id, int64_t generation, int32_t rank) {
  auto run = std::make_shared<const Run>(Run{job_id, generation, rank});
  std::lock_guard<std::mutex> lock(mutex_);
  run_ = std::move(run);
}

void LogRelay::ClearRun() {
  std::lock_guard<std::mutex> lock(mutex_);
  run_.reset();
}

void LogRelay::sink_it_(const spdlog::details::log_msg& msg) {
  if (run_ == nullptr || msg.level < spdlog::level::info) return;
  TrimLocked(options_.max_lines - 1);
  ring_.push_back(Entry{.run = run_,
                        .time = msg.time,
                        .level = msg.level,
                        .text = ValidUtf8(absl::string_view(msg.payload.data(), msg.payload.size()),
                                          options_.max_line_bytes)});
}

void LogRelay::TrimLocked(size_t limit) {
  if (ring_.size() <= limit) return;
  Entry note;
  // The note takes one of the `limit` places.
  while (!ring_.empty() && ring_.size() + 1 > limit) {
    Entry& oldest = ring_.front();
    note.dropped += oldest.dropped > 0 ? oldest.dropped : 1;
    note.run = std::move(oldest.run);  // the newest dropped line's run tags the note
    note.time = oldest.time;
    ring_.pop_front();
  }
  ring_.push_front(std::move(note));
}

weft::v1::WorkerLogLine LogRelay::ToProto(const Entry& entry) {
  weft::v1::WorkerLogLine line;
  line.set_job_id(entry.run->job_id);
  line.set_generation(entry.run->generation);
  line.set_rank(entry.run->rank);
  ToProtoTime(absl::FromChrono(entry.time), line.mutable_time());
  if (entry.dropped > 0) {
    line.set_level("warning");
    line.set_text(absl::StrCat("... ", entry.dropped, " line", entry.dropped == 1 ? "" : "s",
                               " dropped: logged faster than heartbeats carried them (the "
                               "worker's own log has them)"));
  } else {
    const spdlog::string_view_t level = spdlog::level::to_string_view(entry.level);
    line.set_level(std::string(level.data(), level.size()));
    line.set_text(entry.text);
  }
  return line;
}

void LogRelay::FillHeartbeat(weft::v1::HeartbeatRequest* request) {
  if (!in_flight_.empty()) HeartbeatDone(false);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t bytes = 0;
    while (!ring_.empty() && in_flight_.size() < options_.batch_lines) {
      // About what the line costs on the wire: its text, its job id and a few small fields.
      const size_t cost = ring_.front().text.size() + ring_.front().run->job_id.size() + 32;
      if (!in_flight_.empty() && bytes + cost > options_.batch_bytes) break;
      bytes += cost;
      in_flight_.push_back(std::move(ring_.front()));
      ring_.pop_front();
    }
  }
  // Built outside the lock: logging goes on meanwhile.
  for (const Entry& entry : in_flight_) *request->add_log_lines() = ToProto(entry);
}

void LogRelay::HeartbeatDone(bool delivered) {
  if (delivered || in_flight_.empty()) {
    in_flight_.clear();
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // A note among the lines logged since stands for lines newer than the batch: the batch goes
  // in front of it, and a trim then drops the batch's oldest lines first.
  for (auto it = in_flight_.rbegin(); it != in_flight_.rend(); ++it) {
    ring_.push_front(std::move(*it));
  }
  in_flight_.clear();
  TrimLocked(options_.max_lines);
}

size_t LogRelay::pending() {
  std::lock_guard<std::mutex> lock(mutex_);
  return ring_.size();
}

}  // namespace weft::worker
