// The coordinator's copy of what jobs' ranks logged (their workers send it with their
// heartbeats, see HeartbeatRequest.log_lines), for GetJobLogs and `trainctl logs`.
//
// Part of the coordinator's state: a JobLogs is a member of Coordinator guarded by its one lock,
// so every method runs with that lock held. In memory only, and bounded: each job keeps its
// newest max_lines_per_job lines (and max_bytes_per_job of text), and only the
// max_active_jobs jobs that received lines most recently keep any (a job's lines go as a whole
// when another job needs its place). A coordinator restart forgets every line; each worker's
// own log keeps everything.
//
// Sequence numbers: a job's lines are numbered in the order they arrive, without gaps, from
// Options::first_seq, which a coordinator takes from the wall clock in microseconds: a restarted
// coordinator numbers above whatever its predecessor handed out (short of a million lines a
// second), so that a follower's after_seq from before the restart skips nothing.
#ifndef WEFT_COORDINATOR_JOB_LOGS_H_
#define WEFT_COORDINATOR_JOB_LOGS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "weft/v1/coordinator.pb.h"

namespace weft::coordinator {

class JobLogs {
 public:
  struct Options {
    int32_t max_lines_per_job = 5000;
    int64_t max_bytes_per_job = 2 << 20;
    int32_t max_active_jobs = 64;
    // A longer line is cut (at a character boundary, ending in "…"), whatever the worker sent.
    int32_t max_line_bytes = 4096;
    // The seq of each job's first line; 0: microseconds since the Unix epoch at construction.
    int64_t first_seq = 0;
  };

  JobLogs() : JobLogs(Options()) {}
  explicit JobLogs(const Options& options);

  // Keeps each line of the heartbeat `request` whose job `job_exists` says is known (another's
  // lines, e.g. of a job deleted since, are dropped), tagged with the request's worker_id. A
  // line's job is the one it names, not the heartbeat's: a worker sends its last lines of a
  // job once it is idle again.
  void Append(const weft::v1::HeartbeatRequest& request,
              absl::FunctionRef<bool(const std::string& job_id)> job_exists);

  // Job `job_id`'s lines for `request` (every field but `state`, which is the job table's):
  // INVALID_ARGUMENT naming the field for a negative rank, after_seq or max_lines. Knows
  // nothing of which jobs exist: a job without lines answers empty.
  absl::StatusOr<weft::v1::GetJobLogsResponse> Read(const weft::v1::GetJobLogsRequest& request) const;

  // Jobs holding lines now (tests).
  size_t active_jobs() const;

 private:
  struct Log {
    std::deque<weft::v1::JobLogLine> lines;
    int64_t bytes = 0;
    // The seq the next line gets; first_seq before the first.
    int64_t next_seq = 0;
    // When the job last received a line, in Append calls (the oldest loses its lines first).
    uint64_t last_append = 0;
  };

  // Drops the oldest lines of `log` until it is within the per-job bounds.
  void TrimLog(Log& log) const;
  // Empties the logs of the least recently appended jobs until at most max_active_jobs, `keep`
  // among them, hold lines.
  void TrimJobs(const std::string& keep);

  const Options options_;
  // Every job that received a line since this coordinator started (an emptied one keeps its
  // next_seq, so that its numbering and `dropped` stay right).
  absl::flat_hash_map<std::string, Log> logs_;
  // Logs holding lines.
  size_t active_ = 0;
  uint64_t appends_ = 0;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_JOB_LOGS_H_
