// trainctl logs JOB [--rank N] [-f]: what a job's ranks logged, as the coordinator keeps it
// (GetJobLogs: the newest lines of each job, relayed by the workers with their heartbeats).
#ifndef WEFT_TRAINCTL_TRAINCTL_LOGS_H_
#define WEFT_TRAINCTL_TRAINCTL_LOGS_H_

#include <string>

#include "client/coordinator_client.h"

namespace weft::trainctl {

struct LogsFlags {
  int rank = -1;  // -1: every rank's lines
  bool follow = false;
};

// What the job's ranks logged, oldest first: everything the coordinator keeps, or with
// `follow`, then new lines as they come (polled every 500 ms) until the job has ended and its
// workers' last lines are in (exit 0 if it SUCCEEDED, like watch; 130 when SIGINT or SIGTERM
// stops it). `json`: one GetJobLogsResponse holding every line; with `follow`, one JobLogLine
// per line. Lines the coordinator no longer kept are said on stderr. Returns the exit status.
int Logs(CoordinatorClient& client, bool json, const std::string& job_id,
         const LogsFlags& flags);

}  // namespace weft::trainctl

#endif  // WEFT_TRAINCTL_TRAINCTL_LOGS_H_
