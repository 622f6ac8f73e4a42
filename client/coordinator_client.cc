#include "client/coordinator_client.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace weft {
namespace {

using weft::v1::JobState;

// An infinite timeout means no deadline at all: now + infinity would overflow the clock.
void SetTimeoutUnlessInfinite(grpc::ClientContext* context, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  SetTimeout(context, timeout);
}

}  // namespace

bool IsFinalJobState(JobState state) {
  return state == weft::v1::SUCCEEDED || state == weft::v1::FAILED ||
         state == weft::v1::CANCELLED;
}

CoordinatorClient::CoordinatorClient(const std::string& address, ClientOptions options)
    : address_(address),
      options_(std::move(options)),
      channel_(MakeChannel(address, options_.channel)),
      stub_(weft::v1::Coordinator::NewStub(channel_)) {}

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                     ClientOptions options)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(weft::v1::Coordinator::NewStub(channel_)) {}

absl::Status CoordinatorClient::Convert(const grpc::Status& status) const {
  absl::Status converted = FromGrpcStatus(status);
  const bool connection_failure = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                  status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  // A READY channel means the server itself answered with this code (a Join that timed out,
  // a transient refusal): its message is already the right one.
  if (!connection_failure || channel_->GetState(false) == GRPC_CHANNEL_READY) return converted;
  const std::string who = address_.empty() ? "coordinator" : absl::StrCat("coordinator ", address_);
  return absl::Status(converted.code(),
                      absl::StrCat(who, " unreachable: ", converted.message()));
}

absl::StatusOr<weft::v1::SubmitJobResponse> CoordinatorClient::SubmitJob(
    const weft::v1::JobSpec& spec) {
  weft::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  weft::v1::SubmitJobResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->SubmitJob(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<weft::v1::Job> CoordinatorClient::GetJob(const std::string& job_id) {
  weft::v1::GetJobRequest request;
  request.set_job_id(job_id);
  weft::v1::Job response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->GetJob(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<std::vector<weft::v1::JobStatus>> CoordinatorClient::ListJobs(
    const std::vector<JobState>& states, int limit) {
  weft::v1::ListJobsRequest request;
  for (JobState state : states) request.add_states(state);
  request.set_limit(limit);
  weft::v1::ListJobsResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->ListJobs(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return std::vector<weft::v1::JobStatus>(std::make_move_iterator(response.mutable_jobs()->begin()),
                                          std::make_move_iterator(response.mutable_jobs()->end()));
}

absl::StatusOr<weft::v1::JobStatus> CoordinatorClient::CancelJob(const std::string& job_id,
                                                                 const std::string& reason) {
  weft::v1::CancelJobRequest request;
  request.set_job_id(job_id);
  request.set_reason(reason);
  weft::v1::JobStatus response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->CancelJob(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
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
  if (!status.ok()) return Convert(status);
  return absl::UnavailableError(
      absl::StrCat("watch of job ", job_id, " ended before the job did; watch again"));
}

absl::StatusOr<weft::v1::RegisterWorkerResponse> CoordinatorClient::RegisterWorker(
    const weft::v1::WorkerInfo& info, const std::string& session_token) {
  weft::v1::RegisterWorkerRequest request;
  *request.mutable_info() = info;
  request.set_session_token(session_token);
  weft::v1::RegisterWorkerResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<weft::v1::HeartbeatResponse> CoordinatorClient::Heartbeat(
    const weft::v1::HeartbeatRequest& request) {
  weft::v1::HeartbeatResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(
      &context,
      absl::Milliseconds(std::max<int64_t>(0, request.wait_for_command_ms())) +
          options_.rpc_timeout);
  grpc::Status status = stub_->Heartbeat(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<std::vector<weft::v1::WorkerStatus>> CoordinatorClient::ListWorkers() {
  weft::v1::ListWorkersRequest request;
  weft::v1::ListWorkersResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->ListWorkers(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return std::vector<weft::v1::WorkerStatus>(
      std::make_move_iterator(response.mutable_workers()->begin()),
      std::make_move_iterator(response.mutable_workers()->end()));
}

absl::StatusOr<weft::v1::JoinResponse> CoordinatorClient::Join(
    const weft::v1::JoinRequest& request, absl::Duration timeout) {
  weft::v1::JoinResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, timeout);
  grpc::Status status = stub_->Join(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

absl::StatusOr<weft::v1::ReportProgressResponse> CoordinatorClient::ReportProgress(
    const weft::v1::ReportProgressRequest& request) {
  weft::v1::ReportProgressResponse response;
  grpc::ClientContext context;
  SetTimeoutUnlessInfinite(&context, options_.rpc_timeout);
  grpc::Status status = stub_->ReportProgress(&context, request, &response);
  if (!status.ok()) return Convert(status);
  return response;
}

}  // namespace weft
