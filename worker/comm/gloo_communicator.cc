// The Gloo (TCP, CPU) backend of weft::comm::Communicator.
//
// Shape: CreateGlooCommunicator rendezvouses through the generation's weft::Store (adapted to
// gloo::rendezvous::Store below) and connects a full mesh of TCP pairs. Collectives are queued
// and run one at a time, in call order, on one communication thread per communicator, using
// Gloo's own algorithms: allgather (ring), broadcast (binomial tree), barrier (dissemination),
// AllreduceHalvingDoubling and ReduceScatterHalvingDoubling. Each op gets its own Gloo tag
// (its sequence number), so a rank that runs ahead never mixes messages of two ops.
//
// Exceptions: Gloo reports every failure by throwing (gloo::IoException for I/O and timeouts,
// gloo::EnforceNotMet for broken invariants) and expects its Store to throw too. Weft errors
// raised inside Gloo's rendezvous travel as StoreError (carrying the absl::Status); every Gloo
// call is wrapped so that no exception leaves this file: the op's Work gets an absl::Status.
//
// Abort: this Gloo version (0.5.0, 2022) has no communicator abort, and closing the pairs
// (Context::closeConnections) only closes the sockets: a thread blocked in a Gloo wait is not
// woken and sleeps until its timeout (30 s by default). UnboundBuffer::abortWait{Recv,Send}
// wakes one wait, but the algorithm then carries on (it ignores the result), and it cannot
// reach buffers the algorithms create themselves (the halving-doubling algorithms' bound
// buffers, gloo::allreduce's scratch). What does work is Gloo's own reaction to an application timeout: when a wait on
// an unbound buffer times out, Gloo fails every pair of the transport context
// (tcp::Context::signalException): each pair stores an IoException, hands it to every buffer
// with a pending operation on it (bound buffers, posted unbound sends and receives), wakes
// their waiters and closes its socket, so the peers see EOF at once and fail too. Abort
// triggers exactly that through the public API: it creates an empty unbound buffer on the
// context and waits 1 ms for a receive that was never posted (FailPairs). The tcp::Pair
// members that would do it directly are protected, and Debian's libgloo-dev lacks
// gloo/common/memory.h, so gloo/transport/tcp/pair.h cannot even be included.
// Abort(reason) = remember the reason, FailPairs, and abortWait* the unbound buffers of the
// running op (this covers a receive whose payload was partly read when the abort came: it is
// no longer "pending" on its pair; bound buffers are woken in that case too). The running op
// throws within milliseconds; its Work and every queued op complete with `reason`, in order.
//
// Failures: a lost connection (EOF, reset) makes Gloo throw at once: UNAVAILABLE, naming the
// peer ranks whose connections failed (FailedPeersNote). A wait past timeout_ms throws:
// DEADLINE_EXCEEDED. After any failed op the communicator is broken (the ranks' op streams
// are out of step), so it fails its pairs as well: peers blocked on this rank fail at once
// with UNAVAILABLE instead of waiting for their timeout, and the failure spreads through the
// group in milliseconds.
//
// Performance note: see PresizeSendBuffers (a Gloo quirk that otherwise makes every
// collective after a small ReduceScatter ~100x slower).
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/status_context.h"
#include "common/store.h"
#include "gloo/allgather.h"
#include "gloo/allreduce_halving_doubling.h"
#include "gloo/alltoall.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/buffer.h"
#include "gloo/transport/tcp/attr.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "worker/comm/communicator.h"
#include "worker/comm/work.h"

namespace weft::comm {
namespace {

using ::gloo::transport::UnboundBuffer;

// ---------------------------------------------------------------------------------------------
// Store adapter.

// A Weft store error thrown through Gloo's rendezvous code.
class StoreError : public ::gloo::Exception {
 public:
  explicit StoreError(absl::Status status)
      : ::gloo::Exception(status.ToString()), status_(std::move(status)) {}
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
};

// gloo::rendezvous::Store over a weft::Store, under "<prefix>/". Gloo's get() is expected to
// block until the key exists; weft's Get does not, so get() waits first.
class GlooStore : public ::gloo::rendezvous::Store {
 public:
  GlooStore(weft::Store* base, const std::string& prefix, std::chrono::milliseconds timeout)
      : store_(prefix, base), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_.Set(key, std::string_view(data.data(), data.size())));
  }

  std::vector<char> get(const std::string& key) override {
    Check(store_.Wait({key}, absl::FromChrono(timeout_)));
    absl::StatusOr<std::string> value = store_.Get(key);
    Check(value.status());
    return std::vector<char>(value->begin(), value->end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    // Gloo passes 0 (kNoTimeout) for "no limit"; ours always has one.
    const auto limit = timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_;
    Check(store_.Wait(keys, absl::FromChrono(limit)));
  }

 private:
  static void Check(const absl::Status& status) {
    if (!status.ok()) throw StoreError(status);
  }

  PrefixStore store_;
  const std::chrono::milliseconds timeout_;
};

// Gloo writes with writev(2), which raises SIGPIPE on a socket the peer has reset; the
// default action would kill the worker when a peer dies. Ignore it (writes then fail with
// EPIPE, which Gloo handles) unless the program installed its own handler.
void IgnoreSigpipe() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

bool LooksLikeTimeout(const std::string& message) {
  const std::string lower = absl::AsciiStrToLower(message);
  return absl::StrContains(lower, "timeout") || absl::StrContains(lower, "timed out");
}

// BarrierOptions keeps its (empty) unbound buffer protected; expose it for abortWait*.
class BarrierOpts : public ::gloo::BarrierOptions {
 public:
  using ::gloo::BarrierOptions::BarrierOptions;
  UnboundBuffer* unbound_buffer() { return buffer.get(); }
};

struct Op {
  OpKind kind = OpKind::kBarrier;
  uint64_t seq = 0;
  const void* send = nullptr;
  void* recv = nullptr;  // the buffer of AllReduce / Broadcast
  size_t count = 0;      // per rank for AllGather / ReduceScatter / AllToAll
  DataType type = DataType::kFloat32;
  int root = 0;
  size_t bytes() const { return count * DataTypeSize(type); }
  std::shared_ptr<CompletionWork> work;
};

// ---------------------------------------------------------------------------------------------

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, int world_size, const GlooOptions& options)
      : rank_(rank),
        world_(world_size),
        options_(options),
        timeout_(std::chrono::milliseconds(options.timeout_ms)) {}

  ~GlooCommunicator() override {
    bool busy;
    {
      absl::MutexLock lock(&mu_);
      busy = running_ || !queue_.empty();
    }
    // Pending ops are cancelled: they may wait for peers that are gone, and a destructor must
    // not hang. This also closes the connections, so the peers fail at once rather than at
    // their timeout.
    if (busy) Abort(absl::CancelledError("the communicator was destroyed"));
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    // Dropping the context closes the remaining sockets (peers see EOF); dropping the device
    // stops its event loop thread.
    try {
      context_.reset();
      device_.reset();
    } catch (...) {
      // Gloo destructors are not expected to throw; never let it escape a destructor.
    }
  }

  absl::Status Connect(Store* store) {
    IgnoreSigpipe();
    try {
      ::gloo::transport::tcp::attr attr;
      attr.hostname = options_.hostname;
      device_ = ::gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("Gloo: cannot create a TCP device on \"",
                                                     options_.hostname, "\": ", e.what()));
    }
    try {
      auto context = std::make_shared<::gloo::rendezvous::Context>(rank_, world_);
      context->setTimeout(timeout_);
      GlooStore store_adapter(store, options_.store_prefix, timeout_);
      context->connectFullMesh(store_adapter, device_);
      context_ = std::move(context);
    } catch (const StoreError& e) {
      return Annotate(e.status(),
                      absl::StrCat(SetupPrefix(), "rendezvous through the store failed"));
    } catch (const ::gloo::IoException& e) {
      return absl::Status(
          LooksLikeTimeout(e.what()) ? absl::StatusCode::kDeadlineExceeded
                                     : absl::StatusCode::kUnavailable,
          absl::StrCat(SetupPrefix(), "connecting to the peers failed: ", e.what()));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(SetupPrefix(), "out of memory"));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(SetupPrefix(), "Gloo error: ", e.what()));
    }
    return PresizeSendBuffers();
  }

  // Gloo's bound-buffer path (tcp::Pair::send, used by ReduceScatterHalvingDoubling) sets
  // SO_SNDBUF of a pair's socket to the size of the largest bound message sent on it so far,
  // which also switches off the kernel's send buffer autotuning. A small first message (a
  // 4-byte notification, a small reduce-scatter) thus leaves the socket with a ~4 KB send
  // buffer for good, and every later collective on that pair crawls (measured on loopback: a
  // 4 MB all-gather over 4 ranks goes from ~20 ms to ~7 s after one small ReduceScatter).
  // One 1 MiB bound message on every pair at setup fixes the buffer at 1 MiB (or the
  // system's wmem_max) before any collective runs.
  absl::Status PresizeSendBuffers() {
    constexpr size_t kBytes = size_t{1} << 20;
    try {
      std::vector<char> out(kBytes), in(kBytes);
      const int slot = context_->nextSlot();
      std::vector<std::unique_ptr<::gloo::transport::Buffer>> recvs, sends;
      // Every receive buffer is registered before anyone sends (the barrier): a message for
      // an unregistered slot would make the receiver's event loop spin.
      for (int i = 0; i < world_; ++i) {
        if (i == rank_) continue;
        recvs.push_back(context_->getPair(i)->createRecvBuffer(slot, in.data(), kBytes));
      }
      RunBarrier(std::numeric_limits<uint32_t>::max());
      for (int i = 0; i < world_; ++i) {
        if (i == rank_) continue;
        sends.push_back(context_->getPair(i)->createSendBuffer(slot, out.data(), kBytes));
        sends.back()->send();
      }
      for (auto& buffer : recvs) buffer->waitRecv();
      for (auto& buffer : sends) buffer->waitSend();
      return absl::OkStatus();
    } catch (const ::gloo::IoException& e) {
      return absl::Status(
          LooksLikeTimeout(e.what()) ? absl::StatusCode::kDeadlineExceeded
                                     : absl::StatusCode::kUnavailable,
          absl::StrCat(SetupPrefix(), "warming up the connections failed: ", e.what()));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(SetupPrefix(), "Gloo error: ", e.what()));
    }
  }

  void Start() {
    thread_ = std::thread([this] { Loop(); });
    const std::string name = absl::StrCat("weft-gloo-", rank_).substr(0, 15);
    pthread_setname_np(thread_.native_handle(), name.c_str());
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  std::shared_ptr<Work> AllGather(const void* send, void* recv, size_t count_per_rank,
                                  DataType type) override {
    return Submit({.kind = OpKind::kAllGather, .send = send, .recv = recv, .count = count_per_rank},
                  type);
  }

  std::shared_ptr<Work> ReduceScatter(const void* send, void* recv, size_t count_per_rank,
                                      DataType type) override {
    return Submit(
        {.kind = OpKind::kReduceScatter, .send = send, .recv = recv, .count = count_per_rank},
        type);
  }

  std::shared_ptr<Work> AllReduce(void* buf, size_t count, DataType type) override {
    return Submit({.kind = OpKind::kAllReduce, .send = buf, .recv = buf, .count = count}, type);
  }

  std::shared_ptr<Work> Broadcast(void* buf, size_t count, DataType type, int root) override {
    if (root < 0 || root >= world_) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("Gloo Broadcast: root ", root, " is not a rank of a world of ", world_)));
    }
    return Submit(
        {.kind = OpKind::kBroadcast, .send = buf, .recv = buf, .count = count, .root = root}, type);
  }

  std::shared_ptr<Work> Reduce(const void* send, void* recv, size_t count, DataType type,
                               int root) override {
    if (root < 0 || root >= world_) {
      return MakeCompletedWork(absl::InvalidArgumentError(
          absl::StrCat("Gloo Reduce: root ", root, " is not a rank of a world of ", world_)));
    }
    // Only the root writes `recv`; the null check below wants a buffer on every rank.
    if (rank_ != root) recv = const_cast<void*>(send);
    return Submit(
        {.kind = OpKind::kReduce, .send = send, .recv = recv, .count = count, .root = root}, type);
  }

  std::shared_ptr<Work> Barrier() override {
    return Submit({.kind = OpKind::kBarrier, .count = 1}, DataType::kFloat32);
  }

  std::shared_ptr<Work> AllToAll(const void* send, void* recv, size_t count_per_rank,
                                 DataType type) override {
    const size_t all = count_per_rank * DataTypeSize(type) * static_cast<size_t>(world_);
    if (send != nullptr && recv != nullptr && Overlap(send, all, recv, all)) {
      return MakeCompletedWork(
          absl::InvalidArgumentError("Gloo AllToAll: send and recv overlap (they must be apart)"));
    }
    return Submit({.kind = OpKind::kAllToAll, .send = send, .recv = recv, .count = count_per_rank},
                  type);
  }

  int64_t sent_bytes() const override { return sent_bytes_.load(std::memory_order_relaxed); }

  void Abort(absl::Status reason) override {
    if (reason.ok()) reason = absl::AbortedError("the communicator was aborted");
    {
      absl::MutexLock lock(&mu_);
      if (!aborted_.ok()) return;
      aborted_ = reason;
    }
    FailPairs();
    absl::MutexLock lock(&mu_);
    for (UnboundBuffer* buffer : live_buffers_) {
      buffer->abortWaitRecv();
      buffer->abortWaitSend();
    }
  }

 private:
  // Registers the unbound buffers of the running op for Abort; unregisters on destruction,
  // which must come before the buffers are destroyed (declare it after their owner).
  class LiveBuffers {
   public:
    LiveBuffers(GlooCommunicator* comm, std::vector<UnboundBuffer*> buffers) : comm_(comm) {
      absl::MutexLock lock(&comm_->mu_);
      comm_->live_buffers_ = std::move(buffers);
      // An abort that came before the buffers existed already failed the pairs; the first
      // Gloo call on them throws.
    }
    ~LiveBuffers() {
      absl::MutexLock lock(&comm_->mu_);
      comm_->live_buffers_.clear();
    }
    LiveBuffers(const LiveBuffers&) = delete;
    LiveBuffers& operator=(const LiveBuffers&) = delete;

   private:
    GlooCommunicator* comm_;
  };

  std::shared_ptr<Work> Submit(Op op, DataType type) {
    // Sums run on float32; the ops that only move data move any type's bytes.
    if (Sums(op.kind) && type != DataType::kFloat32) {
      return MakeCompletedWork(absl::UnimplementedError(
          absl::StrCat("Gloo ", OpName(op.kind), ": data type ", std::string(DataTypeName(type)),
                       " is not supported by the Gloo backend's sums (float32 only)")));
    }
    op.type = type;
    if (op.kind != OpKind::kBarrier) {
      if (op.count == 0) return MakeCompletedWork(absl::OkStatus());
      if (op.send == nullptr || op.recv == nullptr) {
        return MakeCompletedWork(absl::InvalidArgumentError(
            absl::StrCat("Gloo ", OpName(op.kind), ": null buffer with count ", op.count)));
      }
      const size_t limit = SIZE_MAX / (DataTypeSize(type) * static_cast<size_t>(world_));
      if (op.count > limit) {
        return MakeCompletedWork(absl::InvalidArgumentError(
            absl::StrCat("Gloo ", OpName(op.kind), ": count ", op.count, " is too large")));
      }
    }
    auto work = std::make_shared<CompletionWork>();
    op.work = work;
    sent_bytes_.fetch_add(RingSentBytes(op.kind, op.count, DataTypeSize(type), world_),
                          std::memory_order_relaxed);
    absl::MutexLock lock(&mu_);
    op.seq = next_seq_++;
    queue_.push_back(std::move(op));
    return work;
  }

  bool HasWorkOrStop() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); }

  // The communication thread: runs queued ops in order until stopped and drained.
  void Loop() {
    for (;;) {
      Op op;
      absl::Status earlier;  // abort or earlier failure: the op is not run
      bool aborted = false;
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &GlooCommunicator::HasWorkOrStop));
        if (queue_.empty()) return;  // stopped and drained
        op = std::move(queue_.front());
        queue_.pop_front();
        if (!aborted_.ok()) {
          earlier = aborted_;
          aborted = true;
        } else if (!broken_.ok()) {
          earlier = broken_;
        }
        running_ = earlier.ok();
      }
      absl::Status status;
      if (aborted) {
        status = Annotate(earlier, absl::StrCat(Describe(op), " aborted"));
      } else if (!earlier.ok()) {
        status = Annotate(earlier,
                          absl::StrCat(Describe(op), " not run: the communicator failed earlier"));
      } else {
        status = Execute(op);
        bool fail_pairs = false;
        {
          absl::MutexLock lock(&mu_);
          running_ = false;
          if (!aborted_.ok()) {
            // Aborted while running: the reason wins, whatever Gloo reported (after an abort
            // an op may even "finish" with partial data).
            status = Annotate(aborted_, absl::StrCat(Describe(op), " aborted"));
          } else if (!status.ok()) {
            broken_ = status;
            fail_pairs = true;
          }
        }
        if (fail_pairs) {
          FailPairs();
        }
      }
      op.work->Complete(std::move(status));
    }
  }

  // Runs one op; never throws.
  absl::Status Execute(const Op& op) {
    if (world_ == 1) {
      RunLocal(op);
      return absl::OkStatus();
    }
    try {
      RunGloo(op);
      return absl::OkStatus();
    } catch (const StoreError& e) {
      return Annotate(e.status(), absl::StrCat(Describe(op), " failed: store error"));
    } catch (const ::gloo::IoException& e) {
      const bool timeout = LooksLikeTimeout(e.what());
      return absl::Status(
          timeout ? absl::StatusCode::kDeadlineExceeded : absl::StatusCode::kUnavailable,
          absl::StrCat(Describe(op), timeout ? " timed out" : " failed",
                       timeout ? std::string() : FailedPeersNote(), " (timeout ",
                       options_.timeout_ms, " ms): ", e.what()));
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(Describe(op), " failed: out of memory"));
    } catch (const std::exception& e) {
      // gloo::EnforceNotMet and friends: a broken invariant, e.g. ranks disagreeing on sizes.
      return absl::InternalError(absl::StrCat(Describe(op), " failed: Gloo error: ", e.what()));
    } catch (...) {
      return absl::UnknownError(absl::StrCat(Describe(op), " failed: unknown exception"));
    }
  }

  // World size 1: no Gloo, only the copies the semantics ask for.
  void RunLocal(const Op& op) {
    if ((op.kind == OpKind::kAllGather || op.kind == OpKind::kReduceScatter ||
         op.kind == OpKind::kReduce || op.kind == OpKind::kAllToAll) &&
        op.send != op.recv) {
      std::memmove(op.recv, op.send, op.bytes());
    }
  }

  void RunGloo(const Op& op) {
    const uint32_t tag = static_cast<uint32_t>(op.seq);
    const size_t bytes = op.bytes();
    switch (op.kind) {
      case OpKind::kAllGather: {
        ::gloo::AllgatherOptions opts(context_);
        std::unique_ptr<UnboundBuffer> out = context_->createUnboundBuffer(op.recv, bytes * world_);
        std::unique_ptr<UnboundBuffer> in;
        // In place when `send` is this rank's block of `recv`.
        if (op.send != static_cast<char*>(op.recv) + bytes * rank_) {
          in = context_->createUnboundBuffer(const_cast<void*>(op.send), bytes);
        }
        std::vector<UnboundBuffer*> live = {out.get()};
        if (in) live.push_back(in.get());
        SetElements(opts, op.type, std::move(in), std::move(out));
        RunAlgorithm(::gloo::allgather, opts, tag, std::move(live));
        return;
      }
      case OpKind::kAllToAll: {
        ::gloo::AlltoallOptions opts(context_);
        std::unique_ptr<UnboundBuffer> out = context_->createUnboundBuffer(op.recv, bytes * world_);
        std::unique_ptr<UnboundBuffer> in =
            context_->createUnboundBuffer(const_cast<void*>(op.send), bytes * world_);
        std::vector<UnboundBuffer*> live = {out.get(), in.get()};
        SetElements(opts, op.type, std::move(in), std::move(out));
        RunAlgorithm(::gloo::alltoall, opts, tag, std::move(live));
        return;
      }
      case OpKind::kAllReduce:
        RunAllReduce(op, tag);
        return;
      case OpKind::kBroadcast: {
        ::gloo::BroadcastOptions opts(context_);
        std::unique_ptr<UnboundBuffer> out = context_->createUnboundBuffer(op.recv, bytes);
        std::vector<UnboundBuffer*> live = {out.get()};
        SetElements(opts, op.type, nullptr, std::move(out));
        opts.setRoot(op.root);
        RunAlgorithm(::gloo::broadcast, opts, tag, std::move(live));
        return;
      }
      case OpKind::kBarrier:
        RunBarrier(tag);
        return;
      case OpKind::kReduceScatter:
        RunReduceScatter(op, tag);
        return;
      case OpKind::kReduce:
        RunReduce(op, tag);
        return;
    }
  }

  // Gloo's options of a data-movement op, in elements of `type` (float32 as before; the other
  // types as bytes: Gloo only copies them). A null `in` leaves the input unset (in place).
  template <typename Options>
  static void SetElements(Options& opts, DataType type, std::unique_ptr<UnboundBuffer> in,
                          std::unique_ptr<UnboundBuffer> out) {
    if (type == DataType::kFloat32) {
      opts.template setOutput<float>(std::move(out));
      if (in) opts.template setInput<float>(std::move(in));
    } else {
      opts.template setOutput<uint8_t>(std::move(out));
      if (in) opts.template setInput<uint8_t>(std::move(in));
    }
  }

  void RunBarrier(uint32_t tag) {
    BarrierOpts opts(context_);
    RunAlgorithm(::gloo::barrier, opts, tag, {opts.unbound_buffer()});
  }

  // Runs a Gloo collective (`algorithm` on opts) under the op's tag and the timeout, with its
  // unbound buffers `live` registered for Abort while it runs.
  template <typename Algorithm, typename Options>
  void RunAlgorithm(Algorithm algorithm, Options& opts, uint32_t tag,
                    std::vector<UnboundBuffer*> live) {
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    LiveBuffers guard(this, std::move(live));
    algorithm(opts);
  }

  // AllReduce and ReduceScatter run Gloo's halving-doubling algorithms
  // (AllreduceHalvingDoubling, ReduceScatterHalvingDoubling), which work in place on one
  // buffer of `count` (an int) elements. Large ops go in pieces of at most chunk_bytes (all
  // ranks' blocks together), which bounds the algorithms' scratch memory (about as large as a
  // piece) and keeps counts in range. Every rank cuts the same pieces, and a piece's reduction
  // order depends only on the world size and its length, so results are deterministic for a
  // fixed world size, and identical on every rank.
  //
  // Both use Gloo's bound buffers. Unlike the unbound ones, all of them are woken when their
  // pair fails, even in the middle of a message, so Abort always reaches them (the ring
  // allreduce of gloo/allreduce.h waits on an internal buffer that Abort cannot reach when a
  // peer stopped in the middle of a message). But a peer that runs ahead sends into a slot
  // this rank has not registered yet, and this rank's event loop spins until it does; so the
  // algorithm object (which registers the receive buffers) is built first and a barrier
  // follows; only then does run() send.
  size_t PieceElements() const {
    const size_t max_total = std::min<size_t>(
        static_cast<size_t>(options_.chunk_bytes) / sizeof(float), size_t{1} << 28);
    return std::max<size_t>(1, max_total / static_cast<size_t>(world_));
  }

  void RunAllReduce(const Op& op, uint32_t tag) {
    AllReduceInPlace(static_cast<float*>(op.recv), op.count, tag);
  }

  // Gloo's own reduce waits on scratch buffers Abort cannot reach (see above), so a Reduce is
  // the halving-doubling all-reduce of a copy, of which the root keeps the sum: twice the
  // traffic of a tree reduce, on the CPU backend only (the GPU engine's NCCL has ncclReduce).
  void RunReduce(const Op& op, uint32_t tag) {
    const float* send = static_cast<const float*>(op.send);
    scratch_.assign(send, send + op.count);
    AllReduceInPlace(scratch_.data(), op.count, tag);
    if (rank_ == op.root) std::memcpy(op.recv, scratch_.data(), op.count * sizeof(float));
    if (scratch_.size() > (size_t{16} << 20)) std::vector<float>().swap(scratch_);
  }

  void AllReduceInPlace(float* buf, size_t count, uint32_t tag) {
    const size_t piece_max = PieceElements() * static_cast<size_t>(world_);
    for (size_t offset = 0; offset < count; offset += piece_max) {
      const int n = static_cast<int>(std::min(piece_max, count - offset));
      ::gloo::AllreduceHalvingDoubling<float> algorithm(context_, std::vector<float*>{buf + offset},
                                                        n, ::gloo::ReductionFunction<float>::sum);
      RunBarrier(tag);
      algorithm.run();
    }
  }

  // ReduceScatterHalvingDoubling leaves this rank's recvElems[rank] reduced elements at the
  // start of its buffer. `send` must stay unmodified, so each piece (the same columns of every
  // rank's block) is first copied into a scratch buffer.
  void RunReduceScatter(const Op& op, uint32_t tag) {
    const size_t world = static_cast<size_t>(world_);
    const size_t piece_max = PieceElements();
    const float* send = static_cast<const float*>(op.send);
    float* recv = static_cast<float*>(op.recv);
    for (size_t offset = 0; offset < op.count; offset += piece_max) {
      const size_t n = std::min(piece_max, op.count - offset);
      scratch_.resize(std::max(scratch_.size(), n * world));
      for (size_t r = 0; r < world; ++r) {
        std::memcpy(scratch_.data() + r * n, send + r * op.count + offset, n * sizeof(float));
      }
      {
        ::gloo::ReduceScatterHalvingDoubling<float> algorithm(
            context_, std::vector<float*>{scratch_.data()}, static_cast<int>(n * world),
            std::vector<int>(world, static_cast<int>(n)), ::gloo::ReductionFunction<float>::sum);
        RunBarrier(tag);
        algorithm.run();
      }
      std::memcpy(recv + offset, scratch_.data(), n * sizeof(float));
    }
    // Do not hold on to the scratch of an unusually large op.
    if (scratch_.size() > (size_t{16} << 20)) std::vector<float>().swap(scratch_);
  }

  // Fails every pair of the context through Gloo's application-timeout path (see the file
  // comment): wakes every op blocked on them and closes the sockets. Thread-safe; pairs that
  // already failed are left as they are.
  void FailPairs() {
    if (context_ == nullptr) return;
    try {
      std::unique_ptr<UnboundBuffer> probe = context_->createUnboundBuffer(nullptr, 0);
      probe->waitRecv(nullptr, std::chrono::milliseconds(1));  // nothing posted: times out
    } catch (const std::exception&) {
      // Expected: "Timed out waiting 1ms for recv operation to complete".
    }
  }

  std::string Describe(const Op& op) const {
    std::string out = absl::StrCat("Gloo ", OpName(op.kind), " #", op.seq);
    switch (op.kind) {
      case OpKind::kAllGather:
      case OpKind::kReduceScatter:
      case OpKind::kAllToAll:
        absl::StrAppend(&out, " (", op.count, " x ", std::string(DataTypeName(op.type)),
                        " per rank)");
        break;
      case OpKind::kAllReduce:
        absl::StrAppend(&out, " (", op.count, " x float32)");
        break;
      case OpKind::kBroadcast:
        absl::StrAppend(&out, " (", op.count, " x ", std::string(DataTypeName(op.type)),
                        " from rank ", op.root, ")");
        break;
      case OpKind::kReduce:
        absl::StrAppend(&out, " (", op.count, " x float32 to rank ", op.root, ")");
        break;
      case OpKind::kBarrier:
        break;
    }
    absl::StrAppend(&out, " on rank ", rank_, " of ", world_);
    return out;
  }

  std::string SetupPrefix() const {
    return absl::StrCat("Gloo setup of rank ", rank_, " of ", world_, " (", options_.hostname,
                        ", timeout ", options_.timeout_ms, " ms): ");
  }

  // " with rank R" / " with ranks R, S": the peers whose connection has failed. A receive
  // posted on a failed pair throws the pair's stored exception at once, before anything is
  // sent; on a healthy pair it posts a receive on a slot no collective uses, which only
  // leaves a notification at that peer. So this runs only once the op has failed (the
  // communicator is broken from then on), and not after a timeout (Gloo fails every pair
  // then, so it would name them all).
  std::string FailedPeersNote() {
    std::vector<std::string> failed;
    try {
      std::unique_ptr<UnboundBuffer> probe = context_->createUnboundBuffer(nullptr, 0);
      for (int i = 0; i < world_; ++i) {
        if (i == rank_) continue;
        try {
          probe->recv(i, kProbeSlot, 0, 0);
        } catch (const std::exception&) {
          failed.push_back(absl::StrCat(i));
        }
      }
    } catch (const std::exception&) {
      return "";
    }
    if (failed.empty()) return "";
    return absl::StrCat(failed.size() == 1 ? " with rank " : " with ranks ",
                        absl::StrJoin(failed, ", "));
  }

  // A Gloo slot no collective uses (Gloo's collectives use slot prefixes 0x01..0x08).
  static constexpr uint64_t kProbeSlot = uint64_t{0xEE} << 56;

  const int rank_;
  const int world_;
  const GlooOptions options_;
  const std::chrono::milliseconds timeout_;

  // Set by Connect (world > 1), then read-only until the destructor.
  std::shared_ptr<::gloo::transport::Device> device_;
  std::shared_ptr<::gloo::Context> context_;

  std::atomic<int64_t> sent_bytes_{0};
  absl::Mutex mu_;
  std::deque<Op> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t next_seq_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;  // an op is inside Gloo
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);  // Abort's reason
  absl::Status broken_ ABSL_GUARDED_BY(mu_);   // the first failed op's status
  std::vector<UnboundBuffer*> live_buffers_ ABSL_GUARDED_BY(mu_);

  std::vector<float> scratch_;  // communication thread only
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> CreateGlooCommunicator(Store* store, int rank,
                                                                     int world_size,
                                                                     const GlooOptions& options) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gloo: rank ", rank, " / world size ", world_size, " is not valid"));
  }
  if (options.timeout_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gloo: timeout_ms must be positive, got ", options.timeout_ms));
  }
  if (options.chunk_bytes <= 0) {
    return absl::InvalidArgumentError("Gloo: chunk_bytes must be positive");
  }
  if (world_size > 1 && store == nullptr) {
    return absl::InvalidArgumentError("Gloo: a store is required for world size > 1");
  }
  auto comm = std::make_unique<GlooCommunicator>(rank, world_size, options);
  if (world_size > 1) {
    absl::Status connected = comm->Connect(store);
    if (!connected.ok()) return connected;
  }
  comm->Start();
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace weft::comm
