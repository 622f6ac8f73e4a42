// Blocking C++ client of the weft.v1.Coordinator service: what trainctl, workers, benchmarks
// and tests use instead of raw stubs, so that deadlines and error conversion are decided once.
//
// Every call returns absl::Status(Or); a gRPC failure keeps its canonical code and the
// server's message unchanged (see coordinator.proto for what each code means and whether to
// retry). The one addition: when the coordinator cannot be reached at all (UNAVAILABLE or
// DEADLINE_EXCEEDED while the channel is not connected), the message names the coordinator
// address, because gRPC's own text does not tell a user which of their flags was wrong.
//
// Thread-safe: calls may run concurrently from any number of threads on one client.
#ifndef WEFT_CLIENT_COORDINATOR_CLIENT_H_
#define WEFT_CLIENT_COORDINATOR_CLIENT_H_

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/rpc_call.h"
#include "common/rpc.h"
#include "grpcpp/channel.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace weft {

struct ClientOptions {
  // Deadline of every unary call that does not block by design (Join, held Heartbeat and
  // WatchJob take theirs from their arguments, see below).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // How long SubmitJob, GetJob, ListJobs, CancelJob, GetJobLogs and ListWorkers wait for an unreachable
  // coordinator to come back before they are sent, at most rpc_timeout (RunAttempts in
  // rpc_call.h); the reads, safe to send twice, also go again after an UNAVAILABLE failure.
  // A connection attempt lost on a loaded machine, or a coordinator restarted within the
  // wait, costs a delay instead of the call. SubmitJob and CancelJob are sent at most once: a
  // repeat of one that landed would submit the job twice or be refused. Zero: every call is
  // sent at once and fails fast. Join and the reports that end a generation wait and go again
  // too (see them). The worker's other calls (RegisterWorker, Heartbeat, step reports) never
  // wait here: their loops decide what an unreachable coordinator means.
  absl::Duration reconnect_wait = absl::Seconds(3);
  // Used only by the address constructor.
  ChannelOptions channel;
};

class CoordinatorClient {
 public:
  // Dials `address` ("host:port") through MakeChannel. Never fails here: an unreachable
  // coordinator shows up as UNAVAILABLE on the first call.
  explicit CoordinatorClient(const std::string& address, ClientOptions options = {});
  // Uses an existing channel (shared with a RemoteStore, or an in-process server's). Error
  // messages then cannot name the address.
  explicit CoordinatorClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});

  // INVALID_ARGUMENT lists every violation of the spec, one "field: problem" per line.
  absl::StatusOr<weft::v1::SubmitJobResponse> SubmitJob(const weft::v1::JobSpec& spec);
  absl::StatusOr<weft::v1::Job> GetJob(const std::string& job_id);
  // Newest first. Empty `states`: every state; `limit` 0: the server's default.
  absl::StatusOr<std::vector<weft::v1::JobStatus>> ListJobs(
      const std::vector<weft::v1::JobState>& states = {}, int limit = 0);
  // The status after cancelling. FAILED_PRECONDITION if the job had already ended.
  absl::StatusOr<weft::v1::JobStatus> CancelJob(const std::string& job_id,
                                                const std::string& reason = "");

  // Calls `on_update` with each status the server streams (the first at once). Returns OK
  // once an update with a final state (SUCCEEDED, FAILED, CANCELLED) has been delivered, or
  // as soon as `on_update` returns false; otherwise the stream's error. A stream the server
  // closes before the job ended is UNAVAILABLE (watch again). The stream has no deadline:
  // a job may run for days.
  absl::Status WatchJob(const std::string& job_id,
                        const std::function<bool(const weft::v1::JobStatus&)>& on_update);
  // What the job's ranks logged after request.after_seq (see coordinator.proto). A read:
  // goes again after a lost connection.
  absl::StatusOr<weft::v1::GetJobLogsResponse> GetJobLogs(
      const weft::v1::GetJobLogsRequest& request);

  // `session_token`: the process's WorkerSession::token() (empty: no session). `running`: the
  // generation the process still trains in, to attach to again (RegisterWorkerRequest.running).
  absl::StatusOr<weft::v1::RegisterWorkerResponse> RegisterWorker(
      const weft::v1::WorkerInfo& info, const std::string& session_token,
      const weft::v1::RunningGeneration* running = nullptr);
  // The server may hold the call for request.wait_for_command_ms, so the deadline is that
  // plus rpc_timeout.
  absl::StatusOr<weft::v1::HeartbeatResponse> Heartbeat(
      const weft::v1::HeartbeatRequest& request);
  absl::StatusOr<std::vector<weft::v1::WorkerStatus>> ListWorkers();

  // Blocks until the generation's group is complete, at most `timeout` (the call's deadline;
  // DEADLINE_EXCEEDED after it). ABORTED if the generation ends first. Goes again, within what
  // is left of `timeout`, when its connection is lost (UNAVAILABLE): the coordinator answers a
  // member's repeated Join like its first, so a connection reset while the call waits for the
  // other members costs no generation.
  absl::StatusOr<weft::v1::JoinResponse> Join(const weft::v1::JoinRequest& request,
                                              absl::Duration timeout);
  // A report that ends the generation (finished, or an error) waits for the coordinator and
  // goes again after a lost connection: lost, it would leave the generation to its stall
  // timeout and a restart, and the coordinator takes a repeat of one that landed as a report
  // on an ended generation (OK, continue_training false). Step reports are sent once, at
  // once: the next one supersedes a lost one, and waiting would back the training loop up
  // behind a coordinator that is away.
  absl::StatusOr<weft::v1::ReportProgressResponse> ReportProgress(
      const weft::v1::ReportProgressRequest& request);

  std::shared_ptr<grpc::Channel> channel() const { return server_.channel; }
  // The channel and the name errors give it ("coordinator <address>"), for a RemoteStore.
  const ServerName& server() const { return server_; }

 private:
  ClientOptions options_;
  // What options_.reconnect_wait asks for: reads repeat, SubmitJob and CancelJob are sent once.
  ReconnectPolicies reconnect_;
  // Names the address when built from one.
  ServerName server_;
  std::unique_ptr<weft::v1::Coordinator::Stub> stub_;
};

// True for SUCCEEDED, FAILED and CANCELLED: the job will not change again.
bool IsFinalJobState(weft::v1::JobState state);

}  // namespace weft

#endif  // WEFT_CLIENT_COORDINATOR_CLIENT_H_
