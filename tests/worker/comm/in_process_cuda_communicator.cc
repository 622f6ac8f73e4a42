#include "tests/worker/comm/in_process_cuda_communicator.h"

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/reduce.h"

namespace weft::comm::testing {

// Holds `stream` for `us` microseconds on the GPU (in_process_cuda_delay.cu).
cudaError_t LaunchDelay(int64_t us, cudaStream_t stream);

namespace {

using engine::cuda::CudaStatus;

constexpr int kMaxRanks = 8;

enum class Op { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kReduce, kBarrier };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllGather: return "AllGather";
    case Op::kReduceScatter: return "ReduceScatter";
    case Op::kAllReduce: return "AllReduce";
    case Op::kBroadcast: return "Broadcast";
    case Op::kReduce: return "Reduce";
    case Op::kBarrier: return "Barrier";
  }
  return "?";
}

// One rank's call.
struct Posted {
  Op op = Op::kBarrier;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType type = DataType::kFloat32;
  int root = 0;
};

// The ranks of one group: where they meet, and the stream their collectives run on.
class Group {
 public:
  Group(int size, InProcessOptions options)
      : size_(size), options_(options), posted_(size), ready_(size) {}
  ~Group() {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  absl::Status Init() {
    WEFT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
    return absl::OkStatus();
  }
  int size() const { return size_; }
  const InProcessOptions& options() const { return options_; }

  // Rank `rank`'s part of one collective: its inputs are ready at `ready` (recorded on
  // `rank_stream`), which waits for the collective's end on return (OK) whatever the host did.
  absl::Status Meet(int rank, const Posted& call, cudaEvent_t ready, cudaStream_t rank_stream) {
    absl::Status status;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!aborted_.ok()) return aborted_;
      posted_[rank] = call;
      ready_[rank] = ready;
      const uint64_t round = round_;
      if (++arrived_ == size_) {
        round_status_ = Enqueue();
        if (round_status_.ok() && options_.synchronous) {
          round_status_ = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
        }
        arrived_ = 0;
        ++round_;
        met_.notify_all();
      } else if (!met_.wait_for(lock, std::chrono::milliseconds(options_.timeout_ms), [&] {
                   return round_ != round || !aborted_.ok();
                 })) {
        return absl::DeadlineExceededError(absl::StrCat(
            "in-process ", OpName(call.op), ": rank ", rank, " waited ", options_.timeout_ms,
            " ms for the other ranks"));
      }
      if (round_ == round) return aborted_;
      // The next round needs this rank, so neither the status nor done_ has moved on yet.
      status = round_status_;
    }
    WEFT_RETURN_IF_ERROR(status);
    return CudaStatus(cudaStreamWaitEvent(rank_stream, done_, 0), "cudaStreamWaitEvent");
  }

  void Abort(absl::Status reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_.ok()) aborted_ = std::move(reason);
    met_.notify_all();
  }

 private:
  // Under mu_, by the last rank to arrive: checks that the ranks agree, then enqueues the
  // collective on stream_ behind every rank's ready event and records done_.
  absl::Status Enqueue() {
    const Posted& first = posted_[0];
    for (int r = 1; r < size_; ++r) {
      const Posted& p = posted_[r];
      if (p.op != first.op || p.count != first.count || p.type != first.type ||
          p.root != first.root) {
        return absl::InvalidArgumentError(absl::StrCat(
            "in-process collective: rank ", r, " called ", OpName(p.op), " of ", p.count,
            " elements (root ", p.root, ") where rank 0 called ", OpName(first.op), " of ",
            first.count, " (root ", first.root, ")"));
      }
    }
    for (int r = 0; r < size_; ++r) {
      WEFT_RETURN_IF_ERROR(
          CudaStatus(cudaStreamWaitEvent(stream_, ready_[r], 0), "cudaStreamWaitEvent"));
    }
    if (options_.late_us > 0) {
      WEFT_RETURN_IF_ERROR(CudaStatus(LaunchDelay(options_.late_us, stream_), "LaunchDelay"));
    }
    WEFT_RETURN_IF_ERROR(Run(first));
    return CudaStatus(cudaEventRecord(done_, stream_), "cudaEventRecord");
  }

  absl::Status Copy(void* dst, const void* src, size_t bytes) {
    if (dst == src) return absl::OkStatus();
    return CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                      "cudaMemcpyAsync");
  }

  // out = the sum of the ranks' `in` at element offset `at`, in rank order, except that an
  // `out` which is one of them (in place) is where the sum starts.
  absl::Status Sum(float* out, const std::vector<const void*>& in, size_t at, size_t count) {
    const auto part = [&](int r) { return static_cast<const float*>(in[r]) + at; };
    int start = 0;
    for (int r = 0; r < size_; ++r) {
      if (part(r) == out) start = r;
    }
    WEFT_RETURN_IF_ERROR(Copy(out, part(start), count * sizeof(float)));
    for (int r = 0; r < size_; ++r) {
      if (r == start) continue;
      WEFT_RETURN_IF_ERROR(engine::cuda::AccumulateInto(out, part(r), count, stream_));
    }
    return absl::OkStatus();
  }

  absl::Status Run(const Posted& call) {
    const size_t bytes = call.count * DataTypeSize(call.type);
    std::vector<const void*> sends(size_);
    for (int r = 0; r < size_; ++r) sends[r] = posted_[r].send;
    switch (call.op) {
      case Op::kAllGather:
        for (int dst = 0; dst < size_; ++dst) {
          for (int src = 0; src < size_; ++src) {
            WEFT_RETURN_IF_ERROR(
                Copy(static_cast<char*>(posted_[dst].recv) + src * bytes, sends[src], bytes));
          }
        }
        return absl::OkStatus();
      case Op::kReduceScatter:
        for (int dst = 0; dst < size_; ++dst) {
          WEFT_RETURN_IF_ERROR(Sum(static_cast<float*>(posted_[dst].recv), sends,
                                   dst * call.count, call.count));
        }
        return absl::OkStatus();
      case Op::kAllReduce: {
        WEFT_RETURN_IF_ERROR(Scratch(call.count));
        WEFT_RETURN_IF_ERROR(Sum(scratch_, sends, 0, call.count));
        for (int r = 0; r < size_; ++r) {
          WEFT_RETURN_IF_ERROR(Copy(posted_[r].recv, scratch_, bytes));
        }
        return absl::OkStatus();
      }
      case Op::kBroadcast:
        for (int r = 0; r < size_; ++r) {
          WEFT_RETURN_IF_ERROR(Copy(posted_[r].recv, posted_[call.root].recv, bytes));
        }
        return absl::OkStatus();
      case Op::kReduce:
        return Sum(static_cast<float*>(posted_[call.root].recv), sends, 0, call.count);
      case Op::kBarrier:
        return absl::OkStatus();
    }
    return absl::InternalError("in-process collective: unknown op");
  }

  // A device buffer of at least `count` floats in scratch_. Growing it (cudaMalloc) may wait
  // for the device, which holds nothing back for the host: no deadlock.
  absl::Status Scratch(size_t count) {
    if (count <= scratch_floats_) return absl::OkStatus();
    if (scratch_ != nullptr) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
      WEFT_CUDA_RETURN_IF_ERROR(cudaFree(scratch_));
      scratch_ = nullptr;
    }
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaMalloc(reinterpret_cast<void**>(&scratch_), count * sizeof(float)));
    scratch_floats_ = count;
    return absl::OkStatus();
  }

  const int size_;
  const InProcessOptions options_;
  std::mutex mu_;
  std::condition_variable met_;
  int arrived_ = 0;
  uint64_t round_ = 0;
  absl::Status round_status_;
  absl::Status aborted_;
  std::vector<Posted> posted_;
  std::vector<cudaEvent_t> ready_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  float* scratch_ = nullptr;
  size_t scratch_floats_ = 0;
};

// The groups by name, while any of their ranks lives.
std::mutex groups_mu;
std::map<std::string, std::weak_ptr<Group>>& Groups() {
  static auto* groups = new std::map<std::string, std::weak_ptr<Group>>;
  return *groups;
}

absl::StatusOr<std::shared_ptr<Group>> JoinGroup(const std::string& name, int size,
                                                 const InProcessOptions& options) {
  std::lock_guard<std::mutex> lock(groups_mu);
  std::erase_if(Groups(), [](const auto& entry) { return entry.second.expired(); });
  std::weak_ptr<Group>& slot = Groups()[name];
  if (std::shared_ptr<Group> group = slot.lock()) {
    if (group->size() != size) {
      return absl::InvalidArgumentError(absl::StrCat("in-process group ", name, " has ",
                                                     group->size(), " ranks, not ", size));
    }
    return group;
  }
  auto group = std::make_shared<Group>(size, options);
  WEFT_RETURN_IF_ERROR(group->Init());
  slot = group;
  return group;
}

class InProcessCudaCommunicator final : public CudaCommunicator {
 public:
  InProcessCudaCommunicator(std::shared_ptr<Group> group, int rank)
      : group_(std::move(group)), rank_(rank) {}
  ~InProcessCudaCommunicator() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);
      cudaStreamDestroy(stream_);
    }
    if (ready_ != nullptr) cudaEventDestroy(ready_);
  }

  absl::Status Init() {
    WEFT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int world_size() const override { return group_->size(); }
  cudaStream_t stream() const override { return stream_; }

  absl::Status WaitEvent(cudaEvent_t event) override {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::milliseconds(group_->options().timeout_ms);
    while (true) {
      const cudaError_t e = cudaEventQuery(event);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaStatus(e, "cudaEventQuery");
      if (std::chrono::steady_clock::now() > deadline) {
        return absl::DeadlineExceededError("in-process WaitEvent: timed out");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  absl::Status health() override { return absl::OkStatus(); }
  void Abort(absl::Status reason) override {
    group_->Abort(reason.ok() ? absl::AbortedError("aborted") : std::move(reason));
  }

  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t count,
                                  DataType type) override {
    return Call({Op::kAllGather, send, recv, count, type, 0});
  }
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t count,
                                      DataType type) override {
    return Call({Op::kReduceScatter, send, recv, count, type, 0});
  }
  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DataType type) override {
    return Call({Op::kAllReduce, buf, buf, count, type, 0});
  }
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DataType type, int root) override {
    return Call({Op::kBroadcast, buf, buf, count, type, root});
  }
  std::shared_ptr<Work> Reduce(const void* send, void* recv, size_t count, DataType type,
                               int root) override {
    return Call({Op::kReduce, send, recv, count, type, root});
  }
  std::shared_ptr<Work> Barrier() override {
    absl::Status s = Meet({Op::kBarrier, nullptr, nullptr, 0, DataType::kFloat32, 0});
    if (s.ok()) s = CudaStatus(cudaEventRecord(ready_, stream_), "cudaEventRecord");
    if (s.ok()) s = WaitEvent(ready_);
    return MakeCompletedWork(s);
  }

 private:
  std::shared_ptr<Work> Call(const Posted& call) {
    const bool sums = call.op == Op::kReduceScatter || call.op == Op::kAllReduce ||
                      call.op == Op::kReduce;
    if (sums && call.type != DataType::kFloat32) {
      return MakeCompletedWork(absl::UnimplementedError(
          absl::StrCat("in-process ", OpName(call.op), ": float32 only")));
    }
    if (call.root < 0 || call.root >= world_size()) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("in-process ", OpName(call.op), ": root ", call.root, " out of range")));
    }
    if (call.count == 0) return MakeCompletedWork(absl::OkStatus());
    // Only a Reduce's root receives.
    const bool receives = call.op != Op::kReduce || rank_ == call.root;
    if (call.send == nullptr || (receives && call.recv == nullptr)) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("in-process ", OpName(call.op), ": null buffer")));
    }
    for (const void* p : {call.send, static_cast<const void*>(call.recv)}) {
      cudaPointerAttributes attributes{};
      if (p != nullptr && (cudaPointerGetAttributes(&attributes, p) != cudaSuccess ||
                           attributes.type != cudaMemoryTypeDevice)) {
        cudaGetLastError();  // an unregistered host pointer leaves an error behind
        return MakeCompletedWork(absl::UnimplementedError(
            absl::StrCat("in-process ", OpName(call.op), ": device buffers only")));
      }
    }
    return MakeCompletedWork(Meet(call));
  }

  absl::Status Meet(const Posted& call) {
    WEFT_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(ready_, stream_), "cudaEventRecord"));
    return group_->Meet(rank_, call, ready_, stream_);
  }

  std::shared_ptr<Group> group_;
  const int rank_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaCommunicator>> CreateInProcessCudaCommunicator(
    const std::string& name, int rank, int size, const InProcessOptions& options) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("in-process group ", name, ": rank ", rank,
                                                   " of ", size, " (1 to ", kMaxRanks, ")"));
  }
  WEFT_ASSIGN_OR_RETURN(std::shared_ptr<Group> group, JoinGroup(name, size, options));
  auto comm = std::make_unique<InProcessCudaCommunicator>(std::move(group), rank);
  WEFT_RETURN_IF_ERROR(comm->Init());
  return comm;
}

}  // namespace weft::comm::testing
