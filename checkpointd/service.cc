#include "checkpointd/service.h"

#include "common/status.h"

namespace weft::checkpointd {

grpc::Status CheckpointService::Authorize(const grpc::ServerContext& context) const {
  return auth_ == nullptr ? grpc::Status::OK : ToGrpcStatus(auth_->Check(context));
}

grpc::Status CheckpointService::WriteShard(grpc::ServerContext* context,
                                           grpc::ServerReader<weft::v1::WriteShardRequest>* reader,
                                           weft::v1::WriteShardResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  weft::v1::WriteShardRequest request;
  if (!reader->Read(&request)) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "empty WriteShard stream");
  }
  if (!request.has_header()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first WriteShard message must carry the header");
  }
  auto writer = store_->BeginShard(request.header());
  if (!writer.ok()) return ToGrpcStatus(writer.status());
  // On any early return the writer's destructor drops everything this stream stored.
  while (reader->Read(&request)) {
    if (!request.has_chunk()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "only the first WriteShard message may carry a header");
    }
    if (absl::Status s = (*writer)->AddChunk(request.chunk()); !s.ok()) return ToGrpcStatus(s);
  }
  if (context->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
  absl::StatusOr<int64_t> bytes = (*writer)->Finish();
  if (!bytes.ok()) return ToGrpcStatus(bytes.status());
  response->set_bytes_written(*bytes);
  return grpc::Status::OK;
}

grpc::Status CheckpointService::CommitCheckpoint(grpc::ServerContext* context,
                                                 const weft::v1::CommitCheckpointRequest* request,
                                                 weft::v1::CommitCheckpointResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  return ToGrpcStatus(store_->Commit(request->manifest()).status());
}

grpc::Status CheckpointService::ListCheckpoints(grpc::ServerContext* context,
                                                const weft::v1::ListCheckpointsRequest* request,
                                                weft::v1::ListCheckpointsResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto list = store_->List(request->job_id());
  if (!list.ok()) return ToGrpcStatus(list.status());
  for (auto& m : *list) *response->add_checkpoints() = std::move(m);
  return grpc::Status::OK;
}

grpc::Status CheckpointService::GetManifest(grpc::ServerContext* context,
                                            const weft::v1::GetManifestRequest* request,
                                            weft::v1::CheckpointManifest* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  auto m = store_->GetManifest(request->job_id(), request->step());
  if (!m.ok()) return ToGrpcStatus(m.status());
  *response = std::move(*m);
  return grpc::Status::OK;
}

grpc::Status CheckpointService::ReadRange(
    grpc::ServerContext* context, const weft::v1::ReadRangeRequest* request,
    grpc::ServerWriter<weft::v1::ReadRangeResponse>* writer) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  weft::v1::ReadRangeResponse response;
  return ToGrpcStatus(store_->ReadRange(*request, [&](const weft::v1::ShardChunk& chunk) {
    *response.mutable_chunk() = chunk;
    return !context->IsCancelled() && writer->Write(response);
  }));
}

grpc::Status CheckpointService::SetPinned(grpc::ServerContext* context,
                                          const weft::v1::SetPinnedRequest* request,
                                          weft::v1::SetPinnedResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  return ToGrpcStatus(store_->SetPinned(request->job_id(), request->step(), request->pinned()));
}

grpc::Status CheckpointService::DeleteCheckpoint(grpc::ServerContext* context,
                                                 const weft::v1::DeleteCheckpointRequest* request,
                                                 weft::v1::DeleteCheckpointResponse* response) {
  if (grpc::Status s = Authorize(*context); !s.ok()) return s;
  return ToGrpcStatus(store_->Delete(request->job_id(), request->step()));
}

}  // namespace weft::checkpointd
