// The NCCL (GPU) backend of weft::comm::Communicator.
//
// Shape: CreateNcclCommunicator rendezvouses through the generation's weft::Store (rank 0
// publishes the ncclUniqueId), then creates a non-blocking NCCL communicator and polls its
// init so that a missing peer, a timeout or the end of the generation can stop it. Every
// collective is enqueued on the caller's thread onto the communicator's own stream and gets
// a CUDA event recorded behind it; its Work polls that event. Nothing else runs on a thread of
// ours: NCCL's own threads do the networking.
//
// State shared with Works lives in Core (held by shared_ptr), so a Work may outlive its
// communicator: it then reports the op's outcome, or CANCELLED if the op never finished.
//
// Locks: enqueue_mu_ serialises the enqueue path (one NCCL call sequence at a time, and the
// staging buffers); comm_mu_ guards the ncclComm_t handle, taken around each NCCL call and
// never across a wait, so Abort from another thread gets it within one NCCL call and the
// handle is never used after ncclCommAbort freed it; status_mu_ guards the first failure.
// Order: enqueue_mu_ before comm_mu_; status_mu_ is never held while taking another lock.
//
// Host buffers: NCCL needs device memory, so host buffers go through a pinned host buffer and
// a device scratch buffer, all on the comm stream, and the call waits (with the same abort and
// timeout checks as Work::Wait) before copying the result into the caller's buffer. Pinned
// staging matters: a cudaMemcpyAsync into pageable memory blocks the host until the copy is
// done, i.e. until the collective is, with no way to abort that wait.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_context.h"
#include "common/store.h"
#include "worker/comm/communicator.h"
#include "worker/comm/work.h"

namespace weft::comm {
namespace {

using Clock = std::chrono::steady_clock;

// How often init and waits ask NCCL for an asynchronous error, and init asks the store
// whether the generation is still alive (a RemoteStore call is a gRPC round trip).
constexpr auto kAsyncErrorInterval = std::chrono::milliseconds(1);
constexpr auto kStoreCheckInterval = std::chrono::milliseconds(200);
// The most a healthy communicator's destructor waits for ncclCommFinalize before aborting.
constexpr int64_t kFinalizeLimitMs = 10000;

ncclDataType_t NcclType(DataType type) {
  if (type == DataType::kUInt8) return ncclUint8;
  return type == DataType::kBFloat16 ? ncclBfloat16 : ncclFloat32;
}

// Sets the calling thread's current device for a scope and restores it: Abort, Work::Wait and
// the destructor run on threads (the heartbeat thread, a data loader) whose device is not ours.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

// Backs off from spinning to short sleeps: a collective usually ends within microseconds of
// being waited on, but a wait for a slow peer must not burn a core.
class Backoff {
 public:
  void Pause() {
    if (++spins_ < 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{20};
};

std::string CudaErrorText(cudaError_t error) {
  return absl::StrCat(cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
}

absl::StatusCode NcclCode(ncclResult_t result) {
  switch (result) {
    case ncclSystemError:
    case ncclRemoteError:
      // The network or a peer failed (NCCL reports a dead peer's socket this way).
      return absl::StatusCode::kUnavailable;
    default:
      return absl::StatusCode::kInternal;
  }
}

bool IsHostPointer(const void* ptr, int* device) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    // Old drivers fail on unregistered memory; clear the sticky-free error it leaves behind.
    cudaGetLastError();
    return true;
  }
  *device = attr.device;
  return attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged;
}

// ---------------------------------------------------------------------------------------------

// Everything a Work needs after enqueue, shared so that Works may outlive the communicator.
class Core {
 public:
  Core(int rank, int world, const NcclOptions& options)
      : rank_(rank),
        world_(world),
        device_(options.device),
        timeout_(std::chrono::milliseconds(options.timeout_ms)) {}

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Takes ownership of an initialised communicator.
  void SetComm(ncclComm_t comm) {
    absl::MutexLock lock(&comm_mu_);
    comm_ = comm;
  }

  // Whether a failure was recorded (cheap: checked on every enqueue and poll).
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  absl::Status health() {
    absl::MutexLock lock(&status_mu_);
    return error_;
  }

  // The recorded failure, with the op it now fails named in the message (the code stays, so
  // callers can tell an abort from a timeout); OK while healthy.
  absl::Status HealthFor(absl::string_view what) {
    absl::Status status = health();
    if (status.ok() || absl::StrContains(status.message(), what)) return status;
    return Annotate(status, absl::StrCat("NCCL ", what, " on rank ", rank_, " of ", world_));
  }

  // Records `status` as the failure unless one is already recorded (the first wins), aborts
  // the NCCL communicator, and returns the recorded failure.
  absl::Status Fail(absl::Status status) {
    {
      absl::MutexLock lock(&status_mu_);
      if (error_.ok()) {
        error_ = std::move(status);
        failed_.store(true, std::memory_order_release);
      }
    }
    AbortComm();
    return health();
  }

  // Frees the NCCL communicator with ncclCommAbort, which makes this rank's in-flight kernels
  // return. Idempotent.
  void AbortComm() {
    ScopedDevice device(device_);
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return;
    // A non-blocking communicator may answer ncclInProgress: the rest of the teardown runs in
    // NCCL's background, and the handle must not be used any more either way.
    ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Marks the communicator destroyed: Works of ops that never finished report CANCELLED.
  void Close() { closed_.store(true, std::memory_order_release); }
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // The communicator's asynchronous error (OK while healthy or in progress); records and
  // returns a failure if NCCL reports one.
  absl::Status CheckAsyncError(absl::string_view what) {
    ncclResult_t state = ncclSuccess;
    std::string detail;
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_ == nullptr) return absl::OkStatus();  // aborted: failed() says so
      const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) state = r;
      if (state != ncclSuccess && state != ncclInProgress) detail = ncclGetLastError(comm_);
    }
    if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
    return Fail(absl::Status(
        NcclCode(state), absl::StrCat("NCCL ", what, " on rank ", rank_, " of ", world_,
                                      ": asynchronous error ", ncclGetErrorString(state),
                                      detail.empty() ? "" : ": ", detail)));
  }

  // Blocks until `event` completes. Fails (aborting the communicator) on a NCCL asynchronous
  // error or after timeout_ms; returns the recorded failure if the communicator fails
  // meanwhile, and CANCELLED if it is destroyed first. `what` names the op in messages.
  absl::Status AwaitEvent(cudaEvent_t event, absl::string_view what) {
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + timeout_;
    Clock::time_point next_async_check = start;
    Backoff backoff;
    while (true) {
      const cudaError_t query = cudaEventQuery(event);
      // The event is read first: an abort makes the kernels return early, so a completed
      // event only means success if no failure was recorded before it was seen.
      if (query == cudaSuccess) return HealthFor(what);
      if (failed()) return HealthFor(what);
      if (query != cudaErrorNotReady) {
        cudaGetLastError();
        return Fail(absl::InternalError(absl::StrCat("NCCL ", what, " on rank ", rank_, " of ",
                                                     world_, ": CUDA event query failed: ",
                                                     CudaErrorText(query))));
      }
      if (closed()) {
        return absl::CancelledError(
            absl::StrCat("NCCL ", what, ": the communicator was destroyed"));
      }
      const Clock::time_point now = Clock::now();
      if (now >= next_async_check) {
        absl::Status async = CheckAsyncError(what);
        if (!async.ok()) return async;
        next_async_check = now + kAsyncErrorInterval;
      }
      if (now >= deadline) {
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            "NCCL ", what, " on rank ", rank_, " of ", world_, " did not complete within ",
            timeout_.count(), " ms (a peer is missing or stalled); the communicator was "
            "aborted")));
      }
      backoff.Pause();
    }
  }

  // Runs `call` (one NCCL call) on the communicator under comm_mu_, then, if NCCL answers
  // ncclInProgress, polls until the call has gone through: NCCL forbids other calls, and
  // recording an event, until then. This happens on the first use of an algorithm (NCCL
  // connects lazily, NCCL_RUNTIME_CONNECT), and that connection needs the peers to enter the
  // same op: the enqueue then blocks until they do, bounded by Abort and timeout_ms.
  template <typename Call>
  absl::Status RunNccl(absl::string_view what, const Call& call) {
    ncclResult_t result;
    std::string detail;
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_ == nullptr) return AbortedHealth(what);
      result = call(comm_);
      if (result != ncclSuccess && result != ncclInProgress) detail = ncclGetLastError(comm_);
    }
    if (result == ncclInProgress) return AwaitReady(what);
    if (result == ncclSuccess) return absl::OkStatus();
    return Fail(absl::Status(NcclCode(result),
                             absl::StrCat("NCCL ", what, " on rank ", rank_, " of ", world_,
                                          " failed: ", ncclGetErrorString(result),
                                          detail.empty() ? "" : ": ", detail)));
  }

  // Polls the communicator's state until it leaves ncclInProgress, with abort and timeout
  // checks.
  absl::Status AwaitReady(absl::string_view what) {
    const Clock::time_point deadline = Clock::now() + timeout_;
    Backoff backoff;
    while (true) {
      if (failed()) return HealthFor(what);
      ncclResult_t state = ncclSuccess;
      std::string detail;
      {
        absl::MutexLock lock(&comm_mu_);
        if (comm_ == nullptr) return AbortedHealth(what);
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) detail = ncclGetLastError(comm_);
      }
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) {
        return Fail(absl::Status(
            NcclCode(state), absl::StrCat("NCCL ", what, " on rank ", rank_, " of ", world_,
                                          " failed: ", ncclGetErrorString(state),
                                          detail.empty() ? "" : ": ", detail)));
      }
      if (Clock::now() >= deadline) {
        return Fail(absl::DeadlineExceededError(absl::StrCat(
            "NCCL ", what, " on rank ", rank_, " of ", world_, " could not be launched within ",
            timeout_.count(), " ms (NCCL connects on an algorithm's first use, which needs "
            "every peer to enter the op; one has not); the communicator was aborted")));
      }
      backoff.Pause();
    }
  }

  // Destructor path: finalises a healthy, idle communicator (bounded), otherwise aborts it.
  void Shutdown(bool idle) {
    ScopedDevice device(device_);
    if (failed() || !idle) {
      Fail(absl::CancelledError("the communicator was destroyed with ops pending")).IgnoreError();
      return;
    }
    {
      absl::MutexLock lock(&comm_mu_);
      if (comm_ == nullptr) return;
      const ncclResult_t r = ncclCommFinalize(comm_);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        return;
      }
    }
    // Finalize may need the peers (it waits for global quiescence); peers that vanished must
    // not make the destructor hang, so give it a bounded time and abort after that.
    const auto limit = std::chrono::milliseconds(std::min<int64_t>(timeout_.count(),
                                                                    kFinalizeLimitMs));
    const Clock::time_point deadline = Clock::now() + limit;
    Backoff backoff;
    while (true) {
      {
        absl::MutexLock lock(&comm_mu_);
        if (comm_ == nullptr) return;  // aborted meanwhile
        ncclResult_t state = ncclSuccess;
        const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
        if (r != ncclSuccess) state = r;
        if (state == ncclSuccess) {
          ncclCommDestroy(comm_);
          comm_ = nullptr;
          return;
        }
        if (state != ncclInProgress || Clock::now() >= deadline) {
          ncclCommAbort(comm_);
          comm_ = nullptr;
          return;
        }
      }
      backoff.Pause();
    }
  }

 private:
  // The recorded failure, or ABORTED for a handle freed without one (cannot happen: every
  // path that frees it outside Shutdown records a failure first).
  absl::Status AbortedHealth(absl::string_view what) {
    absl::Status status = HealthFor(what);
    if (status.ok()) status = absl::AbortedError("the NCCL communicator was aborted");
    return status;
  }

  const int rank_;
  const int world_;
  const int device_;
  const std::chrono::milliseconds timeout_;

  absl::Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;

  absl::Mutex status_mu_;
  absl::Status error_ ABSL_GUARDED_BY(status_mu_);
  std::atomic<bool> failed_{false};
  std::atomic<bool> closed_{false};
};

// The Work of a device-buffer op: done when the event recorded behind the op completes.
class EventWork final : public Work {
 public:
  EventWork(std::shared_ptr<Core> core, cudaEvent_t event, std::string what)
      : core_(std::move(core)), event_(event), what_(std::move(what)) {}
  ~EventWork() override {
    // Destroying a pending event is allowed: its resources go when it completes.
    ScopedDevice device(core_->device());
    cudaEventDestroy(event_);
  }

  absl::Status Wait() override {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return status_;
    }
    absl::Status status = core_->AwaitEvent(event_, what_);
    return Resolve(std::move(status));
  }

  bool IsCompleted() override {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return true;
    }
    const cudaError_t query = cudaEventQuery(event_);
    if (query == cudaSuccess || core_->failed()) {
      Resolve(core_->HealthFor(what_)).IgnoreError();
      return true;
    }
    if (query == cudaErrorNotReady && !core_->closed()) return false;
    // A failed query or a destroyed communicator: Wait reports which without blocking.
    Wait().IgnoreError();
    return true;
  }

 private:
  // The first outcome seen is kept, so every later Wait agrees with it.
  absl::Status Resolve(absl::Status status) {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      done_ = true;
      status_ = std::move(status);
    }
    return status_;
  }

  const std::shared_ptr<Core> core_;
  const cudaEvent_t event_;
  const std::string what_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------

class NcclCommunicator final : public CudaCommunicator {
 public:
  NcclCommunicator(std::shared_ptr<Core> core, cudaStream_t stream, void* barrier_buf)
      : core_(std::move(core)), stream_(stream), barrier_buf_(barrier_buf) {}

  ~NcclCommunicator() override {
    ScopedDevice device(core_->device());
    bool idle;
    {
      absl::MutexLock lock(&enqueue_mu_);
      idle = cudaStreamQuery(stream_) == cudaSuccess;
    }
    cudaGetLastError();
    // Ops still running may wait for peers that are gone: they are cancelled (abort) rather
    // than waited for. An idle, healthy communicator is finalised cleanly.
    core_->Shutdown(idle);
    core_->Close();
    absl::MutexLock lock(&enqueue_mu_);
    // Stream-ordered frees: they wait for nothing but this stream (a plain cudaFree would
    // synchronise the whole device, including other communicators' kernels).
    if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
    if (barrier_buf_ != nullptr) cudaFreeAsync(barrier_buf_, stream_);
    cudaStreamDestroy(stream_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (staging_event_ != nullptr) cudaEventDestroy(staging_event_);
    cudaGetLastError();
  }

  int rank() const override { return core_->rank(); }
  int world_size() const override { return core_->world(); }
  cudaStream_t stream() const override { return stream_; }

  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t count_per_rank,
                                  DataType type) override {
    return Submit(OpKind::kAllGather, send, recv, count_per_rank, type, 0);
  }
  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t count_per_rank,
                                      DataType type) override {
    return Submit(OpKind::kReduceScatter, send, recv, count_per_rank, type, 0);
  }
  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DataType type) override {
    return Submit(OpKind::kAllReduce, buf, buf, count, type, 0);
  }
  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DataType type, int root) override {
    if (root < 0 || root >= core_->world()) {
      return MakeCompletedWork(absl::InvalidArgumentError(absl::StrCat(
          "NCCL Broadcast: root ", root, " is not a rank of a world of ", core_->world())));
    }
    return Submit(OpKind::kBroadcast, buf, buf, count, type, root);
  }
  std::shared_ptr<Work> Reduce(const void* send, void* recv, size_t count, DataType type,
                               int root) override {
    if (root < 0 || root >= core_->world()) {
      return MakeCompletedWork(absl::InvalidArgumentError(absl::StrCat(
          "NCCL Reduce: root ", root, " is not a rank of a world of ", core_->world())));
    }
    // NCCL reads recvbuff on the root only; elsewhere `send` stands in for it, so that the
    // checks and the staging below see one buffer.
    if (core_->rank() != root) recv = const_cast<void*>(send);
    return Submit(OpKind::kReduce, send, recv, count, type, root);
  }
  std::shared_ptr<Work> Barrier() override {
    return Submit(OpKind::kBarrier, barrier_buf_, barrier_buf_, 1, DataType::kFloat32, 0);
  }
  std::shared_ptr<Work> AllToAll(const void* send, void* recv, size_t count_per_rank,
                                 DataType type) override {
    return Submit(OpKind::kAllToAll, send, recv, count_per_rank, type, 0);
  }
  int64_t sent_bytes() const override { return sent_bytes_.load(std::memory_order_relaxed); }

  void Abort(absl::Status reason) override {
    if (reason.ok()) reason = absl::AbortedError("the communicator was aborted");
    core_->Fail(std::move(reason)).IgnoreError();
  }

  absl::Status WaitEvent(cudaEvent_t event) override {
    if (core_->failed()) return core_->health();
    return core_->AwaitEvent(event, "WaitEvent");
  }

  absl::Status health() override { return core_->health(); }

 private:
  std::shared_ptr<Work> Submit(OpKind kind, const void* send, void* recv, size_t count,
                               DataType type, int root) {
    const char* name = OpName(kind);
    if (Sums(kind) && type == DataType::kUInt8) {
      return MakeCompletedWork(absl::UnimplementedError(absl::StrCat(
          "NCCL ", name, ": sums float32 or bfloat16, not ", std::string(DataTypeName(type)))));
    }
    if (count == 0) return MakeCompletedWork(absl::OkStatus());
    if (send == nullptr || recv == nullptr) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("NCCL ", name, ": null buffer with count ", count)));
    }
    const size_t world = static_cast<size_t>(core_->world());
    const size_t elem = DataTypeSize(type);
    if (count > SIZE_MAX / (elem * world)) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("NCCL ", name, ": count ", count, " is too large")));
    }
    size_t send_bytes = count * elem;
    size_t recv_bytes = count * elem;
    if (kind == OpKind::kAllGather || kind == OpKind::kAllToAll) recv_bytes *= world;
    if (kind == OpKind::kReduceScatter || kind == OpKind::kAllToAll) send_bytes *= world;
    const bool same = send == recv;
    const size_t rank_offset = static_cast<size_t>(core_->rank()) * count * elem;
    const bool in_place_gather =
        kind == OpKind::kAllGather && send == static_cast<const char*>(recv) + rank_offset;
    const bool in_place_scatter =
        kind == OpKind::kReduceScatter && recv == static_cast<const char*>(send) + rank_offset;
    if (!same && !in_place_gather && !in_place_scatter &&
        Overlap(send, send_bytes, recv, recv_bytes)) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("NCCL ", name,
                       ": send and recv overlap (only in-place AllGather and ReduceScatter may "
                       "alias)")));
    }
    int send_device = core_->device();
    int recv_device = core_->device();
    const bool send_host = IsHostPointer(send, &send_device);
    const bool recv_host = IsHostPointer(recv, &recv_device);
    for (const auto& [host, dev, which] : {std::tuple(send_host, send_device, "send"),
                                            std::tuple(recv_host, recv_device, "recv")}) {
      if (!host && dev != core_->device()) {
        return MakeCompletedWork(absl::InvalidArgumentError(absl::StrCat(
            "NCCL ", name, ": the ", which, " buffer is on device ", dev,
            " but the communicator of rank ", core_->rank(), " uses device ", core_->device())));
      }
    }

    ScopedDevice device(core_->device());
    absl::MutexLock lock(&enqueue_mu_);
    const uint64_t seq = next_seq_++;
    const std::string what = absl::StrCat(name, " #", seq);
    if (core_->failed()) return MakeCompletedWork(core_->HealthFor(what));
    sent_bytes_.fetch_add(RingSentBytes(kind, count, elem, core_->world()),
                          std::memory_order_relaxed);
    if (!send_host && !recv_host) {
      absl::Status status = Launch(kind, send, recv, count, type, root, what);
      if (!status.ok()) return MakeCompletedWork(std::move(status));
      cudaEvent_t event = nullptr;
      cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
      if (err == cudaSuccess) err = cudaEventRecord(event, stream_);
      if (err != cudaSuccess) {
        if (event != nullptr) cudaEventDestroy(event);
        cudaGetLastError();
        return MakeCompletedWork(core_->Fail(absl::InternalError(absl::StrCat(
            "NCCL ", what, ": cannot record its completion event: ", CudaErrorText(err)))));
      }
      return std::make_shared<EventWork>(core_, event, what);
    }
    return MakeCompletedWork(
        RunStaged(kind, send, recv, count, type, root, what, send_host, recv_host, send_bytes,
                  recv_bytes, same || in_place_gather));
  }

  // Host buffers: copy in, run the op on device copies, copy out, and wait for all of it.
  // Layout of both staging buffers: [recv block][send block]; a send that aliases recv (in
  // place) lives inside the recv block at its offset.
  absl::Status RunStaged(OpKind kind, const void* send, void* recv, size_t count,
                         DataType type, int root, const std::string& what, bool send_host,
                         bool recv_host, size_t send_bytes, size_t recv_bytes, bool aliased)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(enqueue_mu_) {
    const size_t send_offset = aliased ? static_cast<const char*>(send) -
                                             static_cast<const char*>(recv)
                                       : recv_bytes;
    const size_t total = aliased ? recv_bytes : recv_bytes + send_bytes;
    if (absl::Status s = EnsureStaging(total, what); !s.ok()) return s;
    char* dev = static_cast<char*>(scratch_);
    char* host = static_cast<char*>(pinned_);
    const void* dev_send = send_host ? dev + send_offset : send;
    void* dev_recv = recv_host ? dev : recv;
    // A Reduce's recv is the root's alone (elsewhere it stands for `send`, which stays as is).
    const bool copy_out = recv_host && !(kind == OpKind::kReduce && core_->rank() != root);
    cudaError_t err = cudaSuccess;
    if (send_host) {
      std::memcpy(host + send_offset, send, send_bytes);
      err = cudaMemcpyAsync(dev + send_offset, host + send_offset, send_bytes,
                            cudaMemcpyHostToDevice, stream_);
    }
    if (err != cudaSuccess) return CudaFailure(what, "copy to the device", err);
    if (absl::Status s = Launch(kind, dev_send, dev_recv, count, type, root, what); !s.ok()) {
      return s;
    }
    if (copy_out) {
      err = cudaMemcpyAsync(host, dev, recv_bytes, cudaMemcpyDeviceToHost, stream_);
      if (err != cudaSuccess) return CudaFailure(what, "copy to the host", err);
    }
    if (staging_event_ == nullptr) {
      err = cudaEventCreateWithFlags(&staging_event_, cudaEventDisableTiming);
      if (err != cudaSuccess) {
        staging_event_ = nullptr;
        return CudaFailure(what, "create an event", err);
      }
    }
    err = cudaEventRecord(staging_event_, stream_);
    if (err != cudaSuccess) return CudaFailure(what, "record an event", err);
    if (absl::Status s = core_->AwaitEvent(staging_event_, what); !s.ok()) return s;
    if (copy_out) std::memcpy(recv, host, recv_bytes);
    return absl::OkStatus();
  }

  // Grows the device scratch and pinned host buffers to `bytes`.
  absl::Status EnsureStaging(size_t bytes, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(enqueue_mu_) {
    if (bytes <= staging_bytes_) return absl::OkStatus();
    // The old buffers may still be read by queued copies: free them in stream order (device)
    // or after the stream drained (host; staged ops always wait, so it has).
    if (scratch_ != nullptr) cudaFreeAsync(scratch_, stream_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    scratch_ = nullptr;
    pinned_ = nullptr;
    staging_bytes_ = 0;
    cudaError_t err = cudaMallocAsync(&scratch_, bytes, stream_);
    if (err != cudaSuccess) {
      scratch_ = nullptr;
      return CudaFailure(what, "allocate device staging memory", err);
    }
    err = cudaMallocHost(&pinned_, bytes);
    if (err != cudaSuccess) {
      pinned_ = nullptr;
      return CudaFailure(what, "allocate pinned staging memory", err);
    }
    staging_bytes_ = bytes;
    return absl::OkStatus();
  }

  absl::Status CudaFailure(const std::string& what, absl::string_view action, cudaError_t err) {
    cudaGetLastError();
    return core_->Fail(absl::InternalError(absl::StrCat("NCCL ", what, " on rank ",
                                                        core_->rank(), ": cannot ", action,
                                                        ": ", CudaErrorText(err))));
  }

  // Enqueues the NCCL call itself on stream_.
  absl::Status Launch(OpKind kind, const void* send, void* recv, size_t count, DataType type,
                      int root, const std::string& what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(enqueue_mu_) {
    const ncclDataType_t dtype = NcclType(type);
    cudaStream_t stream = stream_;
    return core_->RunNccl(what, [&](ncclComm_t comm) {
      switch (kind) {
        case OpKind::kAllGather:
          return ncclAllGather(send, recv, count, dtype, comm, stream);
        case OpKind::kReduceScatter:
          return ncclReduceScatter(send, recv, count, dtype, ncclSum, comm, stream);
        case OpKind::kAllReduce:
        case OpKind::kBarrier:
          return ncclAllReduce(send, recv, count, dtype, ncclSum, comm, stream);
        case OpKind::kBroadcast:
          return ncclBroadcast(send, recv, count, dtype, root, comm, stream);
        case OpKind::kReduce:
          return ncclReduce(send, recv, count, dtype, ncclSum, root, comm, stream);
        case OpKind::kAllToAll:
          return AllToAllCall(send, recv, count * DataTypeSize(type), count, dtype, comm);
      }
      return ncclInvalidArgument;
    });
  }

  // A send to and a receive from every rank (itself included: NCCL copies that block), as
  // one group.
  ncclResult_t AllToAllCall(const void* send, void* recv, size_t block_bytes, size_t count,
                            ncclDataType_t dtype, ncclComm_t comm) {
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    for (int r = 0; r < core_->world() && result == ncclSuccess; ++r) {
      const size_t at = static_cast<size_t>(r) * block_bytes;
      result = ncclSend(static_cast<const char*>(send) + at, count, dtype, r, comm, stream_);
      if (result == ncclSuccess) {
        result = ncclRecv(static_cast<char*>(recv) + at, count, dtype, r, comm, stream_);
      }
    }
    const ncclResult_t ended = ncclGroupEnd();
    return result != ncclSuccess ? result : ended;
  }

  const std::shared_ptr<Core> core_;
  const cudaStream_t stream_;
  // One device float the Barrier's AllReduce runs on.
  void* const barrier_buf_;

  absl::Mutex enqueue_mu_;
  uint64_t next_seq_ ABSL_GUARDED_BY(enqueue_mu_) = 0;
  void* scratch_ ABSL_GUARDED_BY(enqueue_mu_) = nullptr;
  void* pinned_ ABSL_GUARDED_BY(enqueue_mu_) = nullptr;
  size_t staging_bytes_ ABSL_GUARDED_BY(enqueue_mu_) = 0;
  cudaEvent_t staging_event_ ABSL_GUARDED_BY(enqueue_mu_) = nullptr;
  std::atomic<int64_t> sent_bytes_{0};
};

// ---------------------------------------------------------------------------------------------
// Creation.

// The ranks whose arrival key is missing from the store (for timeout messages).
std::string MissingRanks(PrefixStore& store, int world) {
  std::vector<int> missing;
  for (int r = 0; r < world; ++r) {
    absl::StatusOr<std::string> v = store.Get(absl::StrCat("arrived/", r));
    if (!v.ok() && absl::IsNotFound(v.status())) missing.push_back(r);
  }
  if (missing.empty()) return "every rank reached init; a peer is stalled";
  return absl::StrCat("rank(s) [", absl::StrJoin(missing, ", "), "] never arrived");
}

absl::StatusOr<ncclUniqueId> ExchangeUniqueId(PrefixStore* store, int rank, int world,
                                              Clock::time_point deadline) {
  ncclUniqueId id{};
  if (world == 1 || rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) {
      return absl::InternalError(
          absl::StrCat("NCCL: ncclGetUniqueId failed: ", ncclGetErrorString(r)));
    }
    if (world == 1) return id;
    WEFT_RETURN_IF_ERROR_CONTEXT(
        store->Set("unique_id", std::string_view(id.internal, sizeof(id))),
        "NCCL rank 0: cannot publish the unique id");
    return id;
  }
  const auto left = std::max(deadline - Clock::now(), Clock::duration::zero());
  WEFT_RETURN_IF_ERROR_CONTEXT(
      store->Wait({"unique_id"}, absl::FromChrono(left)),
      absl::StrCat("NCCL rank ", rank, " of ", world, ": waiting for rank 0's unique id"));
  WEFT_ASSIGN_OR_RETURN_CONTEXT(const std::string value, store->Get("unique_id"),
                                absl::StrCat("NCCL rank ", rank, ": reading the unique id"));
  if (value.size() != sizeof(id)) {
    return absl::InternalError(absl::StrCat("NCCL rank ", rank, ": the unique id in the store has ",
                                            value.size(), " bytes, expected ", sizeof(id)));
  }
  std::memcpy(id.internal, value.data(), sizeof(id));
  return id;
}

// Polls a non-blocking init until it finishes; aborts the half-made communicator on failure.
absl::Status AwaitInit(ncclComm_t comm, PrefixStore* store, int rank, int world,
                       Clock::time_point deadline, int64_t timeout_ms) {
  Clock::time_point next_store_check = Clock::now() + kStoreCheckInterval;
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) state = r;
    if (state == ncclSuccess) return absl::OkStatus();
    absl::Status failure;
    if (state != ncclInProgress) {
      failure = absl::Status(NcclCode(state),
                             absl::StrCat("NCCL init of rank ", rank, " of ", world, " failed: ",
                                          ncclGetErrorString(state), ": ",
                                          ncclGetLastError(comm)));
    } else if (Clock::now() >= deadline) {
      failure = absl::DeadlineExceededError(absl::StrCat(
          "NCCL init of rank ", rank, " of ", world, " did not complete within ", timeout_ms,
          " ms: ", store != nullptr ? MissingRanks(*store, world) : "single rank"));
    } else if (store != nullptr && Clock::now() >= next_store_check) {
      // The generation may end while NCCL waits for a peer that will never come: the store
      // then fails every call (ABORTED), which is our cue to give up at once.
      absl::StatusOr<std::string> alive = store->Get("unique_id");
      if (!alive.ok()) {
        failure = Annotate(alive.status(), absl::StrCat("NCCL init of rank ", rank, " of ", world,
                                                        ": the store failed"));
      }
      next_store_check = Clock::now() + kStoreCheckInterval;
    }
    if (!failure.ok()) {
      ncclCommAbort(comm);
      return failure;
    }
    backoff.Pause();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaCommunicator>> CreateNcclCommunicator(
    Store* store, int rank, int world_size, const NcclOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL: rank ", rank, " is not a rank of a world of ", world_size));
  }
  if (world_size > 1 && store == nullptr) {
    return absl::InvalidArgumentError("NCCL: a store is required for world size > 1");
  }
  if (options.timeout_ms <= 0) {
    return absl::InvalidArgumentError("NCCL: timeout_ms must be positive");
  }
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(options.timeout_ms);
  // Left set on purpose (the header promises it): the caller's thread works on this device.
  if (cudaError_t err = cudaSetDevice(options.device); err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat("NCCL rank ", rank, ": cannot use device ",
                                                   options.device, ": ", CudaErrorText(err)));
  }

  std::unique_ptr<PrefixStore> prefixed;
  if (world_size > 1) {
    prefixed = std::make_unique<PrefixStore>(options.store_prefix, store);
    // Arrival marks, so that a timeout can name the ranks that never came.
    WEFT_RETURN_IF_ERROR_CONTEXT(prefixed->Set(absl::StrCat("arrived/", rank), "1"),
                                 absl::StrCat("NCCL rank ", rank, ": store"));
  }
  absl::StatusOr<ncclUniqueId> id = ExchangeUniqueId(prefixed.get(), rank, world_size, deadline);
  if (!id.ok()) return id.status();

  cudaStream_t stream = nullptr;
  if (cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      err != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("NCCL rank ", rank, ": cannot create a stream: ", CudaErrorText(err)));
  }
  void* barrier_buf = nullptr;
  cudaError_t err = cudaMallocAsync(&barrier_buf, sizeof(float), stream);
  if (err == cudaSuccess) err = cudaMemsetAsync(barrier_buf, 0, sizeof(float), stream);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (barrier_buf != nullptr) cudaFreeAsync(barrier_buf, stream);
    cudaStreamDestroy(stream);
    return absl::InternalError(absl::StrCat("NCCL rank ", rank,
                                            ": cannot allocate device memory: ",
                                            CudaErrorText(err)));
  }
  auto release_cuda = [&] {
    cudaFreeAsync(barrier_buf, stream);
    cudaStreamDestroy(stream);
    cudaGetLastError();
  };

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking, so that init and every later call can be abandoned (see the header).
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&comm, world_size, *id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    std::string detail = ncclGetLastError(comm);
    if (comm != nullptr) ncclCommAbort(comm);
    release_cuda();
    return absl::Status(NcclCode(r), absl::StrCat("NCCL init of rank ", rank, " of ", world_size,
                                                  " failed: ", ncclGetErrorString(r), ": ",
                                                  detail));
  }
  if (absl::Status s =
          AwaitInit(comm, prefixed.get(), rank, world_size, deadline, options.timeout_ms);
      !s.ok()) {
    release_cuda();
    return s;
  }
  auto core = std::make_shared<Core>(rank, world_size, options);
  core->SetComm(comm);
  return std::make_unique<NcclCommunicator>(std::move(core), stream, barrier_buf);
}

}  // namespace weft::comm
