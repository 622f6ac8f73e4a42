#include "client/coordinator_client.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/rpc_call.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace weft {

using weft::v1::JobState;
using Stub = weft::v1::Coordinator::Stub;

bool IsFinalJobState(JobState state) {
  return state == weft::v1::SUCCEEDED || state == weft::v1::FAILED ||
         state == weft::v1::CANCELLED;
}

CoordinatorClient::CoordinatorClient(const std::string& address, ClientOptions options)
    : options_(std::move(options)),
      reconnect_(options_.reconnect_wait, options_.rpc_timeout),
      server_{MakeChannel(address, options_.channel), absl::StrCat("coordinator ", address)},
      stub_(weft::v1::Coordinator::NewStub(server_.channel)) {}

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)),
      reconnect_(options_.reconnect_wait, options_.rpc_timeout),
      server_{std::move(channel), "coordinator"},
      stub_(weft::v1::Coordinator::NewStub(server_.channel)) {}

absl::StatusOr<weft::v1::SubmitJobResponse> CoordinatorClient::SubmitJob(
    const weft::v1::JobSpec& spec) {
  weft::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  return CallUnary(*stub_, &Stub::SubmitJob, request, options_.rpc_timeout, server_,
                   reconnect_.sent_once);
}

absl::StatusOr<weft::v1::Job> CoordinatorClient::GetJob(const std::string& job_id) {
  weft::v1::GetJobRequest request;
  request.set_job_id(job_id);
  return CallUnary(*stub_, &Stub::GetJob, request, options_.rpc_timeout, server_,
                   reconnect_.repeated);
}

absl::StatusOr<std::vector<weft::v1::JobStatus>> CoordinatorClient::ListJobs(
    const std::vector<JobState>& states, int limit) {
  weft::v1::ListJobsRequest request;
  for (JobState state : states) request.add_states(state);
  request.set_limit(limit);
  WEFT_ASSIGN_OR_RETURN(weft::v1::ListJobsResponse response,
                        CallUnary(*stub_, &Stub::ListJobs, request, options_.rpc_timeout, server_,
                                  reconnect_.repeated));
  return std::vector<weft::v1::JobStatus>(std::make_move_iterator(response.mutable_jobs()->begin()),
                                          std::make_move_iterator(response.mutable_jobs()->end()));
}

absl::StatusOr<weft::v1::JobStatus> CoordinatorClient::CancelJob(const std::string& job_id,
                                                                 const std::string& reason) {
  weft::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  return CallUnary(*stub_, &Stub::CancelJob, request, options_.rpc_timeout, server_,
                   reconnect_.sent_once);
}

absl::Status CoordinatorClient::WatchJob(
    const std::string& job_id, const std::function<bool(const weft::v1::JobStatus&)>& on_update) {
  weft::v1::WatchJobRequest request;
  request.set_job_id(job_id);
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<weft::v1::JobStatus>> reader =
      stub_->WatchJob(&context, request);
  weft::v1::JobStatus update;
  bool stop = false;
  while (reader->Read(&update)) {
    // Stop at a final state ourselves rather than trusting the server to close the stream
    // right after it; the caller has everything it will ever get.
    if (!on_update(update) || IsFinalJobState(update.state())) {
      stop = true;
      break;
    }
  }
  if (stop) {
    context.TryCancel();
    reader->Finish();  // CANCELLED by our own hand; nothing to report
    return absl::OkStatus();
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) return ConvertNamingServer(status, server_);
  return absl::UnavailableError(
      absl::StrCat("watch of job ", job_id, " ended before the job did; watch again"));
}

absl::StatusOr<weft::v1::GetJobLogsResponse> CoordinatorClient::GetJobLogs(
    const weft::v1::GetJobLogsRequest& request) {
  return CallUnary(*stub_, &Stub::GetJobLogs, request, options_.rpc_timeout, server_,
                   reconnect_.repeated);
}

absl::StatusOr<weft::v1::RegisterWorkerResponse> CoordinatorClient::RegisterWorker(
    const weft::v1::WorkerInfo& info, const std::string& session_token,
    const weft::v1::RunningGeneration* running) {
  weft::v1::RegisterWorkerRequest request;
  *request.mutable_info() = info;
  request.set_session_token(session_token);
  if (running != nullptr) *request.mutable_running() = *running;
  return CallUnary(*stub_, &Stub::RegisterWorker, request, options_.rpc_timeout, server_);
}

absl::StatusOr<weft::v1::HeartbeatResponse> CoordinatorClient::Heartbeat(
    const weft::v1::HeartbeatRequest& request) {
  // The server may hold the call for wait_for_command_ms.
  const absl::Duration hold =
      absl::Milliseconds(std::max<int64_t>(0, request.wait_for_command_ms()));
  return CallUnary(*stub_, &Stub::Heartbeat, request, hold + options_.rpc_timeout, server_);
}

absl::StatusOr<std::vector<weft::v1::WorkerStatus>> CoordinatorClient::ListWorkers() {
  const weft::v1::ListWorkersRequest request;
  WEFT_ASSIGN_OR_RETURN(
      weft::v1::ListWorkersResponse response,
      CallUnary(*stub_, &Stub::ListWorkers, request, options_.rpc_timeout, server_,
                reconnect_.repeated));
  return std::vector<weft::v1::WorkerStatus>(
      std::make_move_iterator(response.mutable_workers()->begin()),
      std::make_move_iterator(response.mutable_workers()->end()));
}

absl::StatusOr<weft::v1::JoinResponse> CoordinatorClient::Join(
    const weft::v1::JoinRequest& request, absl::Duration timeout) {
  // Each attempt gets only what is left of the caller's timeout.
  const absl::Time deadline = absl::Now() + std::max(timeout, absl::ZeroDuration());
  weft::v1::JoinResponse response;
  const grpc::Status status = RunAttempts(
      [&] {
        grpc::ClientContext context;
        SetTimeoutUnlessInfinite(&context, std::max(deadline - absl::Now(), absl::ZeroDuration()));
        response.Clear();
        return stub_->Join(&context, request, &response);
      },
      reconnect_.repeated, server_);
  if (!status.ok()) return ConvertNamingServer(status, server_);
  return response;
}

absl::StatusOr<weft::v1::ReportProgressResponse> CoordinatorClient::ReportProgress(
    const weft::v1::ReportProgressRequest& request) {
  const bool ends_generation = request.finished() || !request.error().empty();
  return CallUnary(*stub_, &Stub::ReportProgress, request, options_.rpc_timeout, server_,
                   ends_generation ? reconnect_.repeated : Reconnect{});
}

}  // namespace weft
