#include "trainctl/trainctl_logs.h"

#include <signal.h>

#include <atomic>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "common/time_util.h"
#include "trainctl/trainctl_output.h"

namespace weft::trainctl {
namespace {

// Set by SIGINT and SIGTERM while `logs -f` runs: it stops between polls.
std::atomic<bool> g_interrupted{false};

extern "C" void OnInterrupt(int) { g_interrupted.store(true); }

// "2024-05-01T12:00:00.123Z rank 1 info text": UTC, so that lines of ranks on hosts in
// other time zones sort; without the rank when only one rank's lines are asked for.
std::string LogLineText(const v1::JobLogLine& line, bool with_rank) {
  std::string text = absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", FromProtoTime(line.time()),
                                      absl::UTCTimeZone());
  if (with_rank) absl::StrAppend(&text, " rank ", line.rank());
  absl::StrAppend(&text, " ", line.level(), " ", line.text());
  return text;
}

// One page of lines after `after_seq`, as many as the coordinator gives at once.
absl::StatusOr<v1::GetJobLogsResponse> LogsAfter(CoordinatorClient& client,
                                                  const std::string& job_id,
                                                  const LogsFlags& flags, int64_t after_seq) {
  v1::GetJobLogsRequest request;
  request.set_job_id(job_id);
  if (flags.rank >= 0) request.set_rank(flags.rank);
  request.set_after_seq(after_seq);
  request.set_max_lines(10000);
  return client.GetJobLogs(request);
}

// Lines that were gone before they were read; said on stderr (stdout holds only lines).
void NoteDropped(const std::string& job_id, int64_t dropped, bool first) {
  if (dropped <= 0) return;
  std::cerr << "trainctl: " << dropped << (first ? " older" : "") << " line"
            << (dropped == 1 ? "" : "s") << " of job " << job_id
            << (first ? " are no longer kept" : " were dropped before they could be read")
            << " (the coordinator keeps the newest of each job; each worker's own log has "
               "them all)\n";
}

}  // namespace

int Logs(CoordinatorClient& client, bool json, const std::string& job_id,
         const LogsFlags& flags) {
  const bool with_rank = flags.rank < 0;
  auto print = [&](const v1::GetJobLogsResponse& page) -> absl::Status {
    for (const v1::JobLogLine& line : page.lines()) {
      if (json) {
        WEFT_RETURN_IF_ERROR(PrintJsonLine(line));
      } else {
        std::cout << LogLineText(line, with_rank) << "\n";
      }
    }
    std::cout.flush();
    return absl::OkStatus();
  };
  if (!flags.follow) {
    v1::GetJobLogsResponse all;
    for (bool first = true;; first = false) {
      absl::StatusOr<v1::GetJobLogsResponse> page =
          LogsAfter(client, job_id, flags, all.next_seq());
      if (!page.ok()) return Fail(page.status());
      if (first) all.set_dropped(page->dropped());
      const bool progress = page->next_seq() > all.next_seq();
      all.set_next_seq(page->next_seq());
      all.set_state(page->state());
      if (!json) {
        if (first) NoteDropped(job_id, page->dropped(), true);
        if (absl::Status s = print(*page); !s.ok()) return Fail(s);
      } else {
        for (v1::JobLogLine& line : *page->mutable_lines()) *all.add_lines() = std::move(line);
      }
      if (!progress) break;
    }
    return json ? PrintJsonExit(all) : 0;
  }

  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  int64_t after = 0;
  // Once the job has ended, its workers' last lines still come with their next heartbeats:
  // the follow goes on until a poll this long after the end finds nothing new.
  std::optional<absl::Time> last_lines_by;
  v1::JobStatus ended;
  for (bool first = true; !g_interrupted.load(); first = false) {
    absl::StatusOr<v1::GetJobLogsResponse> page = LogsAfter(client, job_id, flags, after);
    if (!page.ok()) return Fail(page.status());
    NoteDropped(job_id, page->dropped(), first);
    if (absl::Status s = print(*page); !s.ok()) return Fail(s);
    const bool progress = page->next_seq() > after;
    after = page->next_seq();
    if (IsFinalJobState(page->state()) && !last_lines_by) {
      absl::StatusOr<v1::Job> job = client.GetJob(job_id);
      if (!job.ok()) return Fail(job.status());
      ended = job->status();
      // From the end itself: following a job that ended long ago waits for nothing.
      const absl::Time end =
          HasTime(ended.end_time()) ? FromProtoTime(ended.end_time()) : absl::Now();
      last_lines_by =
          end + absl::Milliseconds(job->spec().fault().heartbeat_interval_ms()) + absl::Seconds(1);
    }
    if (progress) continue;  // more may be waiting
    if (last_lines_by && absl::Now() >= *last_lines_by) break;
    for (int i = 0; i < 10 && !g_interrupted.load(); ++i) absl::SleepFor(absl::Milliseconds(50));
  }
  if (g_interrupted.load()) return 130;  // stopped by the user: quietly, as a signal would
  if (ended.state() == v1::SUCCEEDED) return 0;
  return Fail(absl::AbortedError(absl::StrCat("job ", job_id, " ", StateName(ended.state()),
                                              ended.error().empty() ? "" : ": ", ended.error())));
}

}  // namespace weft::trainctl
