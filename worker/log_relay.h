// What a worker process logs while it is in a job, on its way to the coordinator, so that
// `trainctl logs JOB` shows every rank's output without a login on the rank's host.
//
// LogRelay is an spdlog sink. While the agent has a generation run (SetRun ... ClearRun) it
// keeps each line logged at info or above, tagged with that run's job, generation and rank, in
// a ring of at most max_lines; past that the oldest lines go, and one note line ("... N lines
// dropped ...") stands in their place, so that a reader sees where output is missing. The
// agent moves the oldest lines into each heartbeat (FillHeartbeat) and says whether the
// heartbeat got through (HeartbeatDone): lines of a failed one are put back in front, so a
// transient error loses nothing (a heartbeat that arrived but whose answer was lost sends its
// lines twice). The worker's own log keeps everything, with or without a coordinator.
//
// Logging never waits on the agent: a line costs one copy under the sink's mutex (which spdlog
// takes around sink_it_), and the agent holds that mutex only to move a batch's entries. Never
// log from inside the sink: spdlog calls it under that mutex.
#ifndef WEFT_WORKER_LOG_RELAY_H_
#define WEFT_WORKER_LOG_RELAY_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "spdlog/logger.h"
#include "spdlog/sinks/base_sink.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::worker {

class LogRelay final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  struct Options {
    // Lines kept before the oldest go (the note standing in for them counts as one). >= 2.
    size_t max_lines = 4096;
    // A longer line is cut (at a character boundary, ending in "…").
    size_t max_line_bytes = 4096;
    // What one heartbeat carries: at most this many lines, and about this many bytes of them
    // (at least one line, however long).
    size_t batch_lines = 256;
    size_t batch_bytes = 64 << 10;
  };

  explicit LogRelay(Options options);
  // A relay added to `logger`'s sinks. Call it before other threads log through `logger`:
  // spdlog does not guard a logger's sink list.
  static std::shared_ptr<LogRelay> Attach(spdlog::logger& logger, Options options);
  static std::shared_ptr<LogRelay> Attach(spdlog::logger& logger);

  // Lines logged from now on belong to rank `rank` of generation `generation` of `job_id`,
  // until ClearRun or the next SetRun; outside a run nothing is kept.
  void SetRun(const std::string& job_id, int64_t generation, int32_t rank);
  void ClearRun();

  // Moves the oldest lines kept (see Options' batch limits) into request->log_lines and holds
  // them until HeartbeatDone. One batch at a time: a batch still held is put back first. Call
  // FillHeartbeat and HeartbeatDone from one thread (the agent's).
  void FillHeartbeat(weft::v1::HeartbeatRequest* request);
  // `delivered`: the coordinator has the held batch, which is forgotten. Otherwise it goes
  // back in front of the lines logged since, the oldest of them dropped (and counted in a
  // note) past max_lines.
  void HeartbeatDone(bool delivered);

  // Lines waiting to be sent, a note counting as one (tests).
  size_t pending();

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override;
  void flush_() override {}

 private:
  struct Run {
    std::string job_id;
    int64_t generation = 0;
    int32_t rank = 0;
  };
  struct Entry {
    std::shared_ptr<const Run> run;
    std::chrono::system_clock::time_point time;
    spdlog::level::level_enum level = spdlog::level::info;
    std::string text;
    // > 0: the note that stands for this many dropped lines (text and level unused).
    int64_t dropped = 0;
  };

  // Drops the oldest entries until at most `limit` remain, a note for them among those (the
  // oldest entry). Requires mutex_ and limit >= 1.
  void TrimLocked(size_t limit);
  static weft::v1::WorkerLogLine ToProto(const Entry& entry);

  const Options options_;
  // Guarded by mutex_ (base_sink's, held by spdlog around sink_it_).
  std::shared_ptr<const Run> run_;
  std::deque<Entry> ring_;
  // The batch FillHeartbeat handed out; only the agent's thread touches it.
  std::vector<Entry> in_flight_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_LOG_RELAY_H_
