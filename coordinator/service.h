// gRPC edge of the coordinator: weft.v1.Coordinator and weft.v1.Store over the Coordinator
// state machine. Handlers only translate requests into coordinator calls and Status into gRPC
// codes; blocking calls (Heartbeat holds, Join, Store.Wait) are parked by the coordinator and
// the two streams (OpenSession, WatchJob) are state machines in streams.h, so a waiting
// caller holds no thread.
#ifndef WEFT_COORDINATOR_SERVICE_H_
#define WEFT_COORDINATOR_SERVICE_H_

#include "common/security.h"
#include "coordinator/coordinator.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace weft::coordinator {

class CoordinatorService final : public weft::v1::Coordinator::CallbackService {
 public:
  // `auth`: when set, every call must carry one of its bearer tokens (UNAUTHENTICATED
  // otherwise).
  explicit CoordinatorService(Coordinator* coordinator,
                              std::shared_ptr<const TokenAuthorizer> auth = nullptr)
      : coordinator_(coordinator), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const weft::v1::SubmitJobRequest* request,
                                      weft::v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const weft::v1::GetJobRequest* request,
                                   weft::v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const weft::v1::ListJobsRequest* request,
                                     weft::v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const weft::v1::CancelJobRequest* request,
                                      weft::v1::JobStatus* response) override;
  grpc::ServerWriteReactor<weft::v1::JobStatus>* WatchJob(
      grpc::CallbackServerContext* context, const weft::v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const weft::v1::RegisterWorkerRequest* request,
                                           weft::v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const weft::v1::HeartbeatRequest* request,
                                      weft::v1::HeartbeatResponse* response) override;
  grpc::ServerWriteReactor<weft::v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext* context, const weft::v1::OpenSessionRequest* request) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const weft::v1::ListWorkersRequest* request,
                                        weft::v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* Join(grpc::CallbackServerContext* context,
                                 const weft::v1::JoinRequest* request,
                                 weft::v1::JoinResponse* response) override;
  grpc::ServerUnaryReactor* ReportProgress(grpc::CallbackServerContext* context,
                                           const weft::v1::ReportProgressRequest* request,
                                           weft::v1::ReportProgressResponse* response) override;
  grpc::ServerUnaryReactor* GetJobLogs(grpc::CallbackServerContext* context,
                                       const weft::v1::GetJobLogsRequest* request,
                                       weft::v1::GetJobLogsResponse* response) override;

 private:
  Coordinator* coordinator_;
  std::shared_ptr<const TokenAuthorizer> auth_;
};

class StoreService final : public weft::v1::Store::CallbackService {
 public:
  explicit StoreService(Coordinator* coordinator,
                        std::shared_ptr<const TokenAuthorizer> auth = nullptr)
      : coordinator_(coordinator), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const weft::v1::StoreSetRequest* request,
                                weft::v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const weft::v1::StoreGetRequest* request,
                                weft::v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const weft::v1::StoreAddRequest* request,
                                weft::v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const weft::v1::StoreCompareSetRequest* request,
                                       weft::v1::StoreCompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const weft::v1::StoreWaitRequest* request,
                                 weft::v1::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* Delete(grpc::CallbackServerContext* context,
                                   const weft::v1::StoreDeleteRequest* request,
                                   weft::v1::StoreDeleteResponse* response) override;

 private:
  Coordinator* coordinator_;
  std::shared_ptr<const TokenAuthorizer> auth_;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_SERVICE_H_
