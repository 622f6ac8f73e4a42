// gRPC edge of checkpointd: weft.v1.Checkpoint over CheckpointStore. Handlers only translate.
// The synchronous API is used on purpose: every handler blocks on disk I/O anyway, and a
// streaming handler on its own thread keeps the write and read loops plain.
#ifndef WEFT_CHECKPOINTD_SERVICE_H_
#define WEFT_CHECKPOINTD_SERVICE_H_

#include "checkpointd/store.h"
#include "weft/v1/checkpoint.grpc.pb.h"

namespace weft::checkpointd {

class CheckpointService final : public weft::v1::Checkpoint::Service {
 public:
  explicit CheckpointService(CheckpointStore* store) : store_(store) {}

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
  CheckpointStore* store_;
};

}  // namespace weft::checkpointd

#endif  // WEFT_CHECKPOINTD_SERVICE_H_
