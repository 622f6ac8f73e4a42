#include "coordinator/job_logs.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/utf8.h"

namespace weft::coordinator {
namespace {

constexpr int32_t kDefaultMaxLines = 1000;
constexpr int32_t kMostMaxLines = 10000;

// What a line costs in memory beyond its strings, roughly (the message and its timestamp).
constexpr int64_t kLineOverheadBytes = 96;

int64_t LineBytes(const weft::v1::JobLogLine& line) {
  return static_cast<int64_t>(line.text().size() + line.worker_id().size() +
                              line.level().size()) +
         kLineOverheadBytes;
}

}  // namespace

JobLogs::JobLogs(const Options& options)
    : options_([&] {
        Options o = options;
        if (o.first_seq <= 0) o.first_seq = std::max<int64_t>(1, absl::ToUnixMicros(absl::Now()));
        return o;
      }()) {}

void JobLogs::Append(const weft::v1::HeartbeatRequest& request,
                     absl::FunctionRef<bool(const std::string& job_id)> job_exists) {
  // Lines come in runs of one job: ask about each job once per run.
  const std::string* last_job = nullptr;
  bool last_known = false;
  for (const weft::v1::WorkerLogLine& in : request.log_lines()) {
    if (last_job == nullptr || *last_job != in.job_id()) {
      last_job = &in.job_id();
      last_known = !in.job_id().empty() && job_exists(in.job_id());
    }
    if (!last_known) continue;
    auto [it, added] = logs_.try_emplace(in.job_id());
    Log& log = it->second;
    if (added) log.next_seq = options_.first_seq;
    const bool was_empty = log.lines.empty();
    weft::v1::JobLogLine& line = log.lines.emplace_back();
    line.set_seq(log.next_seq++);
    line.set_worker_id(request.worker_id());
    line.set_generation(in.generation());
    line.set_rank(in.rank());
    *line.mutable_time() = in.time();
    line.set_level(in.level());
    line.set_text(in.text().size() > static_cast<size_t>(options_.max_line_bytes)
                      ? ValidUtf8(in.text(), options_.max_line_bytes)
                      : in.text());
    log.bytes += LineBytes(line);
    log.last_append = ++appends_;
    TrimLog(log);
    if (was_empty) {
      ++active_;
      TrimJobs(in.job_id());
    }
  }
}

void JobLogs::TrimLog(Log& log) const {
  while (log.lines.size() > 1 &&
         (log.lines.size() > static_cast<size_t>(options_.max_lines_per_job) ||
          log.bytes > options_.max_bytes_per_job)) {
    log.bytes -= LineBytes(log.lines.front());
    log.lines.pop_front();
  }
}

void JobLogs::TrimJobs(const std::string& keep) {
  while (active_ > static_cast<size_t>(std::max(options_.max_active_jobs, 1))) {
    Log* oldest = nullptr;
    for (auto& [job_id, log] : logs_) {
      if (log.lines.empty() || job_id == keep) continue;
      if (oldest == nullptr || log.last_append < oldest->last_append) oldest = &log;
    }
    if (oldest == nullptr) return;
    oldest->lines.clear();
    oldest->bytes = 0;
    --active_;
  }
}

absl::StatusOr<weft::v1::GetJobLogsResponse> JobLogs::Read(
    const weft::v1::GetJobLogsRequest& request) const {
  std::vector<std::string> problems;
  if (request.has_rank() && request.rank() < 0) {
    problems.push_back(absl::StrCat("rank: ", request.rank(), " is negative"));
  }
  if (request.after_seq() < 0) {
    problems.push_back(absl::StrCat("after_seq: ", request.after_seq(), " is negative"));
  }
  if (request.max_lines() < 0) {
    problems.push_back(absl::StrCat("max_lines: ", request.max_lines(), " is negative"));
  }
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  const int32_t max_lines =
      request.max_lines() == 0 ? kDefaultMaxLines : std::min(request.max_lines(), kMostMaxLines);

  weft::v1::GetJobLogsResponse response;
  const int64_t after = request.after_seq();
  response.set_next_seq(after);
  auto it = logs_.find(request.job_id());
  if (it == logs_.end()) return response;
  const Log& log = it->second;
  // Seqs are dense: lines[i] has seq first_kept + i.
  const int64_t first_kept = log.lines.empty() ? log.next_seq : log.lines.front().seq();
  response.set_dropped(std::max<int64_t>(0, first_kept - std::max(after + 1, options_.first_seq)));
  int64_t covered = after;
  for (size_t i = static_cast<size_t>(std::clamp<int64_t>(
           after + 1 - first_kept, 0, static_cast<int64_t>(log.lines.size())));
       i < log.lines.size(); ++i) {
    const weft::v1::JobLogLine& line = log.lines[i];
    if (request.has_rank() && line.rank() != request.rank()) {
      covered = line.seq();  // nothing of the rank's up to here
      continue;
    }
    if (response.lines_size() >= max_lines) break;
    *response.add_lines() = line;
    covered = line.seq();
  }
  response.set_next_seq(std::max(after, covered));
  return response;
}

size_t JobLogs::active_jobs() const { return active_; }

}  // namespace weft::coordinator
