#include "client/checkpoint_client.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/rpc_call.h"
#include "common/crc32c.h"
#include "common/rpc.h"
#include "common/status.h"
#include "grpcpp/client_context.h"

namespace weft {
namespace {

using weft::v1::CheckpointManifest;
using weft::v1::DType;
using Stub = weft::v1::Checkpoint::Stub;

// A stream's deadline: rpc_timeout plus its bytes at this floor rate, so a shard of any size can
// finish on a working link (18.7 GB at checkpointd's measured 0.31 GB/s takes a minute) while a
// stalled stream still ends. Far below what loopback or a datacenter network gives.
constexpr double kStreamFloorBytesPerSecond = 20e6;

absl::Duration StreamTimeout(absl::Duration rpc_timeout, double bytes) {
  if (rpc_timeout == absl::InfiniteDuration()) return rpc_timeout;
  return rpc_timeout + absl::Seconds(bytes / kStreamFloorBytesPerSecond);
}

// The daemon's naming rule (checkpoint.proto: 1 to 512 bytes, no '/' or NUL), checked here so
// a bad name fails before a shard is streamed.
absl::Status CheckName(const std::string& name, const char* what) {
  if (name.empty() || name.size() > 512) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", name.substr(0, 64), "\": must be 1 to 512 bytes"));
  }
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " \"", name, "\": must not contain '/' or NUL"));
  }
  return absl::OkStatus();
}

absl::Status CheckStep(int64_t step) {
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, ": must be >= 0"));
  }
  return absl::OkStatus();
}

// The first message of a WriteShard stream: every tensor's layout and each non-empty range,
// after the checks the daemon would make at the end of the stream.
absl::StatusOr<weft::v1::WriteShardRequest> ShardHeaderMessage(
    const std::string& job_id, int64_t step, int32_t rank, int32_t world_size,
    const std::vector<ShardTensor>& tensors) {
  weft::v1::WriteShardRequest first;
  weft::v1::ShardHeader* header = first.mutable_header();
  header->set_job_id(job_id);
  header->set_step(step);
  header->set_rank(rank);
  header->set_world_size(world_size);
  std::set<std::string> seen;
  for (const ShardTensor& t : tensors) {
    WEFT_RETURN_IF_ERROR(CheckName(t.name, "tensor name"));
    if (!seen.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": listed twice"));
    }
    if (DTypeSize(t.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": no element type"));
    }
    const int64_t numel = NumElements(t.shape);
    if (numel < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": every shape dimension must be >= 1"));
    }
    if (t.begin < 0 || t.begin > t.end || t.end > numel) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": range [", t.begin, ", ",
                                                     t.end, ") not within [0, ", numel, "]"));
    }
    if (t.end > t.begin && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": no data"));
    }
    weft::v1::TensorLayout* layout = header->add_tensors();
    layout->set_name(t.name);
    layout->set_dtype(t.dtype);
    for (int64_t d : t.shape) layout->add_shape(d);
    // The protocol wants only non-empty ranges; a rank that holds none of this tensor still
    // declares its layout so that every rank's header agrees with the manifest.
    if (t.end == t.begin) continue;
    weft::v1::ShardRange* range = header->add_ranges();
    range->set_tensor(t.name);
    range->set_begin(t.begin);
    range->set_end(t.end);
  }
  return first;
}

}  // namespace

int DTypeSize(DType dtype) {
  switch (dtype) {
    case weft::v1::DTYPE_F32:
      return 4;
    case weft::v1::DTYPE_BF16:
      return 2;
    case weft::v1::DTYPE_U8:
      return 1;
    default:
      return 0;
  }
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 1 || n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

bool CheckpointClient::Unreachable() const {
  // CONNECTING also covers a first attempt that has not failed yet: calls in flight for long
  // (the only ones asked about) are past it, READY on a reachable daemon.
  const grpc_connectivity_state state = server_.channel->GetState(/*try_to_connect=*/false);
  return state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_CONNECTING;
}

CheckpointClient::CheckpointClient(const std::string& address, absl::Duration rpc_timeout,
                                   absl::Duration reconnect_wait)
    : address_(address),
      rpc_timeout_(rpc_timeout),
      reconnect_(reconnect_wait, rpc_timeout) {
  // A connection of its own: concurrent writers in one process (ranks in tests, the bench)
  // would otherwise share one TCP stream and its flow-control window.
  ChannelOptions options;
  options.private_connection = true;
  server_ = {MakeChannel(address, options), absl::StrCat("checkpointd ", address)};
  stub_ = weft::v1::Checkpoint::NewStub(server_.channel);
}

absl::StatusOr<int64_t> CheckpointClient::WriteShard(const std::string& job_id, int64_t step,
                                                     int32_t rank, int32_t world_size,
                                                     const std::vector<ShardTensor>& tensors,
                                                     size_t chunk_bytes) {
  WEFT_RETURN_IF_ERROR(CheckName(job_id, "job id"));
  WEFT_RETURN_IF_ERROR(CheckStep(step));
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world size ", world_size, ": must be >= 1"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": must be in [0, ", world_size, ")"));
  }
  if (chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes: must be >= 1");

  WEFT_ASSIGN_OR_RETURN(const weft::v1::WriteShardRequest first,
                        ShardHeaderMessage(job_id, step, rank, world_size, tensors));

  double bytes = 0;
  for (const ShardTensor& t : tensors) {
    bytes += static_cast<double>(t.end - t.begin) * DTypeSize(t.dtype);
  }
  const absl::Duration timeout = StreamTimeout(rpc_timeout_, bytes);
  weft::v1::WriteShardResponse response;
  // Sent again if need be: the daemon replaces whatever an earlier stream of this rank left.
  grpc::Status status = RunAttempts(
      [&] {
        grpc::ClientContext context;
        SetTimeoutUnlessInfinite(&context, timeout);
        response.Clear();
        std::unique_ptr<grpc::ClientWriter<weft::v1::WriteShardRequest>> writer =
            stub_->WriteShard(&context, &response);
        // A failed Write means the daemon already ended the stream (usually with a refusal):
        // stop sending and let Finish report why.
        bool open = writer->Write(first);
        weft::v1::WriteShardRequest message;
        weft::v1::ShardChunk* chunk = message.mutable_chunk();
        for (const ShardTensor& t : tensors) {
          if (!open) break;
          const int es = DTypeSize(t.dtype);
          const int64_t per_chunk = std::max<int64_t>(
              1, static_cast<int64_t>(std::min(chunk_bytes, kMaxCheckpointChunkBytes)) / es);
          const char* base = static_cast<const char*>(t.data);
          chunk->set_tensor(t.name);
          for (int64_t b = t.begin; b < t.end && open; b += per_chunk) {
            const int64_t n = std::min(per_chunk, t.end - b);
            const char* p = base + (b - t.begin) * es;
            chunk->set_offset_elements(b);
            chunk->mutable_data()->assign(p, static_cast<size_t>(n * es));
            // Checksum of the copy we send, not of the caller's memory: it covers the wire only.
            chunk->set_crc32c(Crc32c(chunk->data().data(), chunk->data().size()));
            open = writer->Write(message);
          }
        }
        if (open) writer->WritesDone();
        return writer->Finish();
      },
      reconnect_.repeated, server_);
  if (!status.ok()) return ConvertNamingServer(status, server_);
  return response.bytes_written();
}

absl::Status CheckpointClient::Commit(const CheckpointManifest& manifest) {
  weft::v1::CommitCheckpointRequest request;
  *request.mutable_manifest() = manifest;
  const auto send = [&] {
    return CallUnary(*stub_, &Stub::CommitCheckpoint, request, rpc_timeout_, server_,
                     reconnect_.sent_once)
        .status();
  };
  // Whether the step is committed as this manifest says: a step is committed once, so a
  // committed manifest with this world size and optimizer step is this commit's.
  const auto landed = [&] {
    auto committed = GetManifest(manifest.job_id(), manifest.step());
    return committed.ok() && committed->world_size() == manifest.world_size() &&
           committed->optimizer_step() == manifest.optimizer_step();
  };
  const absl::Status first = send();
  // Only a lost connection leaves the outcome unknown: the daemon's own answers stand.
  if (first.code() != absl::StatusCode::kUnavailable) return first;
  if (landed()) return absl::OkStatus();
  // Not visible: it did not reach the commit point, so sending it again is safe. A first
  // attempt that lands meanwhile makes this one ALREADY_EXISTS, which the read settles.
  const absl::Status second = send();
  if (second.code() == absl::StatusCode::kAlreadyExists && landed()) return absl::OkStatus();
  return second.ok() ? second : first;
}

absl::StatusOr<std::vector<CheckpointManifest>> CheckpointClient::List(const std::string& job_id) {
  WEFT_RETURN_IF_ERROR(CheckName(job_id, "job id"));
  weft::v1::ListCheckpointsRequest request;
  request.set_job_id(job_id);
  WEFT_ASSIGN_OR_RETURN(weft::v1::ListCheckpointsResponse response,
                        CallUnary(*stub_, &Stub::ListCheckpoints, request, rpc_timeout_, server_,
                                  reconnect_.repeated));
  return std::vector<CheckpointManifest>(
      std::make_move_iterator(response.mutable_checkpoints()->begin()),
      std::make_move_iterator(response.mutable_checkpoints()->end()));
}

absl::StatusOr<CheckpointManifest> CheckpointClient::GetManifest(const std::string& job_id,
                                                                 int64_t step) {
  WEFT_RETURN_IF_ERROR(CheckName(job_id, "job id"));
  WEFT_RETURN_IF_ERROR(CheckStep(step));
  weft::v1::GetManifestRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  return CallUnary(*stub_, &Stub::GetManifest, request, rpc_timeout_, server_, reconnect_.repeated);
}

absl::StatusOr<std::pair<int64_t, DType>> CheckpointClient::ResolveTensor(
    const std::string& job_id, int64_t step, const std::string& tensor) {
  auto find = [&](const std::map<std::string, DType>& dtypes, int64_t at)
      -> absl::StatusOr<std::pair<int64_t, DType>> {
    auto it = dtypes.find(tensor);
    if (it == dtypes.end()) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint ", job_id, " step ", at, " has no tensor ", tensor));
    }
    return std::make_pair(at, it->second);
  };
  if (step > 0) {
    absl::MutexLock lock(&mu_);
    auto it = dtypes_.find({job_id, step});
    if (it != dtypes_.end()) return find(it->second, step);
  }
  WEFT_ASSIGN_OR_RETURN(CheckpointManifest manifest, GetManifest(job_id, step));
  std::map<std::string, DType> dtypes;
  for (const auto& t : manifest.tensors()) dtypes[t.name()] = t.dtype();
  auto found = find(dtypes, manifest.step());
  absl::MutexLock lock(&mu_);
  dtypes_[{job_id, manifest.step()}] = std::move(dtypes);
  return found;
}

absl::Status CheckpointClient::ReadRange(const std::string& job_id, int64_t step,
                                         const std::string& tensor, int64_t begin, int64_t end,
                                         void* out) {
  WEFT_RETURN_IF_ERROR(CheckName(job_id, "job id"));
  WEFT_RETURN_IF_ERROR(CheckName(tensor, "tensor name"));
  WEFT_RETURN_IF_ERROR(CheckStep(step));
  if (begin < 0 || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("range [", begin, ", ", end, ") of tensor ",
                                                   tensor, ": need 0 <= begin <= end"));
  }
  if (end > begin && out == nullptr) {
    return absl::InvalidArgumentError("ReadRange: no output buffer");
  }
  WEFT_ASSIGN_OR_RETURN(auto resolved, ResolveTensor(job_id, step, tensor));
  const auto [at_step, dtype] = resolved;
  const int es = DTypeSize(dtype);
  if (es == 0) {
    return absl::DataLossError(
        absl::StrCat("tensor ", tensor, " of checkpoint ", job_id, " step ", at_step,
                     ": manifest names no element type"));
  }
  auto loss = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("tensor ", tensor, " of checkpoint ", job_id,
                                            " step ", at_step, ": ", why));
  };

  weft::v1::ReadRangeRequest request;
  request.set_job_id(job_id);
  request.set_step(at_step);
  request.set_tensor(tensor);
  request.set_begin(begin);
  request.set_end(end);
  const absl::Duration timeout =
      StreamTimeout(rpc_timeout_, static_cast<double>(end - begin) * es);
  char* dst = static_cast<char*>(out);
  int64_t pos = begin;
  absl::Status bad;
  // A repeat starts over at `begin` and overwrites what an interrupted attempt copied.
  grpc::Status status = RunAttempts(
      [&] {
        grpc::ClientContext context;
        SetTimeoutUnlessInfinite(&context, timeout);
        std::unique_ptr<grpc::ClientReader<weft::v1::ReadRangeResponse>> reader =
            stub_->ReadRange(&context, request);
        weft::v1::ReadRangeResponse response;
        pos = begin;
        while (reader->Read(&response)) {
          const weft::v1::ShardChunk& c = response.chunk();
          const std::string& data = c.data();
          // Each check keeps the copy inside the caller's (end - begin) * es bytes, whatever
          // the daemon sends.
          if (c.tensor() != tensor) {
            bad = loss(absl::StrCat("daemon sent data of tensor ", c.tensor()));
          } else if (c.offset_elements() != pos) {
            bad = loss(
                absl::StrCat("daemon sent element ", c.offset_elements(), ", expected ", pos));
          } else if (data.size() % es != 0 ||
                     static_cast<int64_t>(data.size() / es) > end - pos) {
            bad = loss(absl::StrCat("daemon sent a chunk of ", data.size(), " bytes at element ",
                                    pos, " (", es, "-byte elements, range ends at ", end, ")"));
          } else if (Crc32c(data.data(), data.size()) != c.crc32c()) {
            bad = loss(absl::StrCat("CRC32C mismatch in the chunk at element ", pos,
                                    " as received"));
          }
          if (!bad.ok()) break;
          std::memcpy(dst + (pos - begin) * es, data.data(), data.size());
          pos += static_cast<int64_t>(data.size()) / es;
        }
        if (!bad.ok()) {
          context.TryCancel();
          reader->Finish();  // CANCELLED by our own hand; `bad` says why, and ends the attempts
          return grpc::Status(grpc::StatusCode::CANCELLED, "");
        }
        return reader->Finish();
      },
      reconnect_.repeated, server_);
  if (!bad.ok()) return bad;
  if (!status.ok()) return ConvertNamingServer(status, server_);
  if (pos != end) {
    return loss(absl::StrCat("stream ended at element ", pos, ", expected ", end));
  }
  return absl::OkStatus();
}

absl::Status CheckpointClient::SetPinned(const std::string& job_id, int64_t step, bool pinned) {
  WEFT_RETURN_IF_ERROR(CheckName(job_id, "job id"));
  WEFT_RETURN_IF_ERROR(CheckStep(step));
  weft::v1::SetPinnedRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  request.set_pinned(pinned);
  return CallUnary(*stub_, &Stub::SetPinned, request, rpc_timeout_, server_, reconnect_.repeated)
      .status();
}

absl::Status CheckpointClient::Delete(const std::string& job_id, int64_t step) {
  WEFT_RETURN_IF_ERROR(CheckName(job_id, "job id"));
  WEFT_RETURN_IF_ERROR(CheckStep(step));
  weft::v1::DeleteCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  WEFT_RETURN_IF_ERROR(CallUnary(*stub_, &Stub::DeleteCheckpoint, request, rpc_timeout_, server_,
                                 reconnect_.sent_once)
                           .status());
  // The step may be written again with other tensors: forget what we knew of it.
  absl::MutexLock lock(&mu_);
  dtypes_.erase({job_id, step});
  return absl::OkStatus();
}

}  // namespace weft
