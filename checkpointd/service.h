// gRPC edge of checkpointd: weft.v1.Checkpoint over CheckpointStore. Handlers only translate,
// after checking the caller's bearer token when the daemon was given --auth-tokens-file.
// The synchronous API is used on purpose: every handler blocks on disk I/O anyway, and a
// streaming handler on its own thread keeps the write and read loops plain.
#ifndef WEFT_CHECKPOINTD_SERVICE_H_
#define WEFT_CHECKPOINTD_SERVICE_H_

#include <memory>
#include <utility>

#include "checkpointd/store.h"
#include "common/security.h"
#include "weft/v1/checkpoint.grpc.pb.h"

namespace weft::checkpointd {

class CheckpointService final : public weft::v1::Checkpoint::Service {
 public:
  // `auth` null: every caller is accepted (the transport's client certificates aside).
  explicit CheckpointService(CheckpointStore* store,
                             std::shared_ptr<const TokenAuthorizer> auth = nullptr)
      : store_(store), auth_(std::move(auth)) {}

  grpc::Status WriteShard(grpc::ServerContext* context,
                          grpc::ServerReader<weft::v1::WriteShardRequest>* reader,
                          weft::v1::WriteShardResponse* response) override;
  grpc::Status CommitCheckpoint(grpc::ServerContext* context,
                                const weft::v1::CommitCheckpointRequest* request,
                                weft::v1::CommitCheckpointResponse* response) override;
  grpc::Status ListCheckpoints(grpc::ServerContext* context,
                               const weft::v1::ListCheckpointsRequest* request,
                               weft::v1::ListCheckpointsResponse* response) override;
  grpc::Status GetManifest(grpc::ServerContext* context,
                           const weft::v1::GetManifestRequest* request,
                           weft::v1::CheckpointManifest* response) override;
  grpc::Status ReadRange(grpc::ServerContext* context, const weft::v1::ReadRangeRequest* request,
                         grpc::ServerWriter<weft::v1::ReadRangeResponse>* writer) override;
  grpc::Status SetPinned(grpc::ServerContext* context, const weft::v1::SetPinnedRequest* request,
                         weft::v1::SetPinnedResponse* response) override;
  grpc::Status DeleteCheckpoint(grpc::ServerContext* context,
                                const weft::v1::DeleteCheckpointRequest* request,
                                weft::v1::DeleteCheckpointResponse* response) override;

 private:
  // OK, or the UNAUTHENTICATED refusal to return before touching the store.
  grpc::Status Authorize(const grpc::ServerContext& context) const;

  CheckpointStore* store_;
  std::shared_ptr<const TokenAuthorizer> auth_;
};

}  // namespace weft::checkpointd

#endif  // WEFT_CHECKPOINTD_SERVICE_H_
