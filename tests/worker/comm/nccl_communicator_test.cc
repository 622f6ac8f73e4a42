// The NCCL communicator on real GPUs: ranks are threads of one process, one GPU each
// (rank r on device r), meeting through a MemoryStore. Every test skips without a GPU, and
// the multi-rank ones without enough GPUs. Failure cases check that nothing hangs: Abort,
// a peer that never joins a collective or never arrives at init, the store's generation
// ending during init, destruction with an op pending.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/comm/comm_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl_communicator.h"

namespace weft::comm {
namespace {

using ::testing::HasSubstr;
using testing::OnRanks;
using testing::SecondsSince;
using Clock = std::chrono::steady_clock;

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

#define WEFT_REQUIRE_GPUS(n)                                                       \
  do {                                                                             \
    const int have = DeviceCount();                                                \
    if (have < (n)) GTEST_SKIP() << "needs " << (n) << " GPU(s), found " << have;  \
  } while (0)

// Elements as stored for `type` (bf16: the top half of the float's bits, exact for the small
// integers used here).
std::vector<char> Encode(const std::vector<float>& values, DataType type) {
  std::vector<char> out(values.size() * DataTypeSize(type));
  for (size_t i = 0; i < values.size(); ++i) {
    if (type == DataType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &values[i], 4);
      const uint16_t half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(out.data() + 2 * i, &half, 2);
    }
  }
  return out;
}

std::vector<float> Decode(const std::vector<char>& bytes, DataType type) {
  const size_t n = bytes.size() / DataTypeSize(type);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (type == DataType::kFloat32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t half;
      std::memcpy(&half, bytes.data() + 2 * i, 2);
      const uint32_t bits = static_cast<uint32_t>(half) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  }
  return out;
}

// Device memory of the calling thread's current device.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, bytes), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  char* get() const { return static_cast<char*>(ptr_); }
  void Upload(const std::vector<char>& bytes) {
    ASSERT_EQ(bytes.size(), bytes_);
    ASSERT_EQ(cudaMemcpy(ptr_, bytes.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<char> Download() const {
    std::vector<char> out(bytes_);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

// Creates the communicators of ranks [0, world) concurrently, rank r on device r.
std::vector<std::unique_ptr<CudaCommunicator>> CreateNcclGroup(
    Store* store, int world, int64_t timeout_ms = NcclOptions{}.timeout_ms) {
  return testing::CreateRanks<CudaCommunicator>(world, [&](int r) {
    NcclOptions options;
    options.device = r;
    options.timeout_ms = timeout_ms;
    return CreateNcclCommunicator(store, r, world, options);
  });
}

// Rank r's element k: small integers, exact in bf16 and their sums too.
float Value(int r, size_t k) { return static_cast<float>(r + 1 + static_cast<int>(k % 7)); }

// Every collective on device buffers, on every rank (one thread per rank), with exact checks.
void CheckCollectives(std::vector<std::unique_ptr<CudaCommunicator>>& comms, DataType type,
                      size_t count) {
  const int world = static_cast<int>(comms.size());
  const size_t elem = DataTypeSize(type);
  const float rank_sum = world * (world + 1) / 2.0f;
  OnRanks(world, [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    CudaCommunicator& comm = *comms[r];
    SCOPED_TRACE(::testing::Message() << "rank " << r << " of " << world << ", "
                                      << DataTypeName(type));
    std::vector<float> values(count * world);

    {  // AllGather, out of place.
      for (size_t i = 0; i < count; ++i) values[i] = Value(r, i);
      values.resize(count);
      DeviceBuffer send(count * elem), recv(count * world * elem);
      send.Upload(Encode(values, type));
      ASSERT_TRUE(comm.AllGather(send.get(), recv.get(), count, type)->Wait().ok());
      const std::vector<float> got = Decode(recv.Download(), type);
      for (int s = 0; s < world; ++s) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[s * count + i], Value(s, i)) << s;
      }
    }
    {  // AllGather, in place: send is this rank's block of recv.
      std::vector<float> all(count * world, -1.f);
      for (size_t i = 0; i < count; ++i) all[r * count + i] = Value(r, i);
      DeviceBuffer buf(count * world * elem);
      buf.Upload(Encode(all, type));
      absl::Status s =
          comm.AllGather(buf.get() + r * count * elem, buf.get(), count, type)->Wait();
      ASSERT_TRUE(s.ok()) << s;
      const std::vector<float> got = Decode(buf.Download(), type);
      for (int p = 0; p < world; ++p) {
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(got[p * count + i], Value(p, i)) << p;
      }
    }
    {  // ReduceScatter: rank r gets the sum of every rank's block r.
      std::vector<float> all(count * world);
      for (size_t k = 0; k < all.size(); ++k) all[k] = Value(r, k);
      DeviceBuffer send(count * world * elem), recv(count * elem);
      send.Upload(Encode(all, type));
      ASSERT_TRUE(comm.ReduceScatter(send.get(), recv.get(), count, type)->Wait().ok());
      const std::vector<float> got = Decode(recv.Download(), type);
      for (size_t i = 0; i < count; ++i) {
        const size_t k = r * count + i;
        ASSERT_EQ(got[i], rank_sum + world * static_cast<float>(k % 7)) << i;
      }
      // `send` is not modified.
      ASSERT_EQ(Decode(send.Download(), type), all);
      // In place: recv is this rank's block of send.
      ASSERT_TRUE(
          comm.ReduceScatter(send.get(), send.get() + r * count * elem, count, type)->Wait().ok());
      const std::vector<float> in_place = Decode(send.Download(), type);
      for (size_t i = 0; i < count; ++i) {
        const size_t k = r * count + i;
        ASSERT_EQ(in_place[k], rank_sum + world * static_cast<float>(k % 7)) << i;
      }
    }
    {  // AllReduce.
      std::vector<float> mine(count);
      for (size_t k = 0; k < count; ++k) mine[k] = Value(r, k);
      DeviceBuffer buf(count * elem);
      buf.Upload(Encode(mine, type));
      ASSERT_TRUE(comm.AllReduce(buf.get(), count, type)->Wait().ok());
      const std::vector<float> got = Decode(buf.Download(), type);
      for (size_t k = 0; k < count; ++k) {
        ASSERT_EQ(got[k], rank_sum + world * static_cast<float>(k % 7)) << k;
      }
    }
    {  // Broadcast from the last rank.
      const int root = world - 1;
      std::vector<float> mine(count, -1.f);
      if (r == root) {
        for (size_t k = 0; k < count; ++k) mine[k] = 3.f + static_cast<float>(k % 5);
      }
      DeviceBuffer buf(count * elem);
      buf.Upload(Encode(mine, type));
      ASSERT_TRUE(comm.Broadcast(buf.get(), count, type, root)->Wait().ok());
      const std::vector<float> got = Decode(buf.Download(), type);
      for (size_t k = 0; k < count; ++k) ASSERT_EQ(got[k], 3.f + static_cast<float>(k % 5));
    }
    {  // Reduce into rank 0, out of place; the other ranks pass no recv.
      std::vector<float> mine(count);
      for (size_t k = 0; k < count; ++k) mine[k] = Value(r, k);
      DeviceBuffer send(count * elem), recv(count * elem);
      send.Upload(Encode(mine, type));
      ASSERT_TRUE(
          comm.Reduce(send.get(), r == 0 ? recv.get() : nullptr, count, type, 0)->Wait().ok());
      if (r == 0) {
        const std::vector<float> got = Decode(recv.Download(), type);
        for (size_t k = 0; k < count; ++k) {
          ASSERT_EQ(got[k], rank_sum + world * static_cast<float>(k % 7)) << k;
        }
      }
      ASSERT_EQ(Decode(send.Download(), type), mine);  // `send` is not modified
    }
    auto barrier = comm.Barrier();
    absl::Status s = barrier->Wait();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(barrier->IsCompleted());
    EXPECT_TRUE(comm.AllReduce(nullptr, 0, type)->Wait().ok());  // count 0: nothing to do
    EXPECT_TRUE(comm.health().ok());
  });
}

// Host buffers (staged through the device) on every rank.
void CheckHostBuffers(std::vector<std::unique_ptr<CudaCommunicator>>& comms) {
  const int world = static_cast<int>(comms.size());
  OnRanks(world, [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    CudaCommunicator& comm = *comms[r];
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    std::vector<float> loss = {1.f + r, 10.f, -2.f};
    absl::Status s = comm.AllReduce(loss.data(), loss.size(), DataType::kFloat32)->Wait();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(loss[0], world * (world + 1) / 2.0f);
    EXPECT_EQ(loss[1], 10.f * world);
    EXPECT_EQ(loss[2], -2.f * world);

    // In-place bf16 AllGather of one vote per rank.
    std::vector<float> votes(world, 0.f);
    votes[r] = 5.f + r;
    std::vector<char> bytes = Encode(votes, DataType::kBFloat16);
    s = comm.AllGather(bytes.data() + 2 * r, bytes.data(), 1, DataType::kBFloat16)->Wait();
    ASSERT_TRUE(s.ok()) << s;
    const std::vector<float> got = Decode(bytes, DataType::kBFloat16);
    for (int p = 0; p < world; ++p) EXPECT_EQ(got[p], 5.f + p);

    // A host send with a device recv.
    DeviceBuffer recv(sizeof(float));
    float step = r == 0 ? 42.f : 0.f;
    s = comm.Broadcast(&step, 1, DataType::kFloat32, 0)->Wait();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(step, 42.f);
    // A host Reduce into the last rank: only its recv is written.
    const std::vector<float> mine = {1.f + r, -3.f};
    std::vector<float> sum = {-1.f, -1.f};
    s = comm.Reduce(mine.data(), r == world - 1 ? sum.data() : nullptr, 2, DataType::kFloat32,
                    world - 1)
            ->Wait();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(mine, (std::vector<float>{1.f + r, -3.f}));
    if (r == world - 1) {
      EXPECT_EQ(sum, (std::vector<float>{world * (world + 1) / 2.0f, -3.f * world}));
    }
    EXPECT_TRUE(comm.health().ok());
  });
}

TEST(NcclCommunicatorTest, WorldOfOneRunsEveryOp) {
  WEFT_REQUIRE_GPUS(1);
  auto created = CreateNcclCommunicator(nullptr, 0, 1, NcclOptions{});
  ASSERT_TRUE(created.ok()) << created.status();
  std::vector<std::unique_ptr<CudaCommunicator>> comms;
  comms.push_back(std::move(created).value());
  EXPECT_EQ(comms[0]->rank(), 0);
  EXPECT_EQ(comms[0]->world_size(), 1);
  EXPECT_NE(comms[0]->stream(), nullptr);
  CheckCollectives(comms, DataType::kFloat32, 1000);
  CheckCollectives(comms, DataType::kBFloat16, 1000);
  CheckHostBuffers(comms);
}

TEST(NcclCommunicatorTest, ArgumentErrorsDoNotBreakIt) {
  WEFT_REQUIRE_GPUS(1);
  auto comm = CreateNcclCommunicator(nullptr, 0, 1, NcclOptions{});
  ASSERT_TRUE(comm.ok()) << comm.status();
  float x = 1.f;
  EXPECT_EQ((*comm)->AllReduce(nullptr, 4, DataType::kFloat32)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->Broadcast(&x, 1, DataType::kFloat32, 1)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<float> buf(4);
  EXPECT_EQ((*comm)->ReduceScatter(buf.data(), buf.data() + 1, 2, DataType::kFloat32)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->health().ok());
  EXPECT_TRUE((*comm)->AllReduce(&x, 1, DataType::kFloat32)->Wait().ok());
  EXPECT_EQ(x, 1.f);
}

TEST(NcclCommunicatorTest, RejectsBadOptions) {
  NcclOptions options;
  EXPECT_EQ(CreateNcclCommunicator(nullptr, 0, 2, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateNcclCommunicator(nullptr, 1, 1, options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.timeout_ms = 0;
  EXPECT_EQ(CreateNcclCommunicator(nullptr, 0, 1, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// (world, type): world 2 and 4, where the machine has that many GPUs.
class CollectivesTest : public ::testing::TestWithParam<std::tuple<int, DataType>> {};

TEST_P(CollectivesTest, ExactResults) {
  const auto [world, type] = GetParam();
  WEFT_REQUIRE_GPUS(world);
  MemoryStore store;
  auto comms = CreateNcclGroup(&store, world);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  // An odd count, so that no rank's block is aligned to anything.
  CheckCollectives(comms, type, 4099);
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, CollectivesTest,
    ::testing::Combine(::testing::Values(2, 4),
                       ::testing::Values(DataType::kFloat32, DataType::kBFloat16)),
    [](const auto& info) {
      return "World" + std::to_string(std::get<0>(info.param)) + "_" +
             std::string(DataTypeName(std::get<1>(info.param)));
    });

TEST(NcclCommunicatorTest, HostBuffers) {
  WEFT_REQUIRE_GPUS(2);
  MemoryStore store;
  auto comms = CreateNcclGroup(&store, 2);
  ASSERT_EQ(comms.size(), 2u);
  CheckHostBuffers(comms);
}

// AllToAll of bytes (the compressed all-reduce's) on device buffers: rank r's block q is rank
// q's block r; the bytes sent are counted as a ring's; sums of bytes are refused.
TEST(NcclCommunicatorTest, AllToAllSwapsBlocksAndCountsWhatItSends) {
  WEFT_REQUIRE_GPUS(2);
  MemoryStore store;
  auto comms = CreateNcclGroup(&store, 2);
  ASSERT_EQ(comms.size(), 2u);
  const size_t count = 4099;
  OnRanks(2, [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    CudaCommunicator& comm = *comms[r];
    std::vector<char> send(2 * count);
    for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<char>(r * 100 + i % 97);
    DeviceBuffer in(send.size()), out(send.size());
    in.Upload(send);
    const int64_t before = comm.sent_bytes();
    ASSERT_TRUE(comm.AllToAll(in.get(), out.get(), count, DataType::kUInt8)->Wait().ok());
    EXPECT_EQ(comm.sent_bytes() - before, static_cast<int64_t>(count));
    const std::vector<char> got = out.Download();
    for (int q = 0; q < 2; ++q) {
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(got[q * count + i], static_cast<char>(q * 100 + (r * count + i) % 97))
            << "rank " << r << " block " << q << " byte " << i;
      }
    }
    EXPECT_EQ(comm.AllReduce(in.get(), count, DataType::kUInt8)->Wait().code(),
              absl::StatusCode::kUnimplemented);
    EXPECT_TRUE(comm.health().ok());
  });
}

// The pattern of nccl_communicator.h: compute stream -> event -> comm stream -> event ->
// compute stream, with the host waiting only through WaitEvent. A long memset ahead of the
// input's copy makes a missing dependency show up as a wrong sum.
TEST(NcclCommunicatorTest, OrdersAfterAnotherStreamThroughEvents) {
  WEFT_REQUIRE_GPUS(1);
  const int world = DeviceCount() >= 2 ? 2 : 1;
  MemoryStore store;
  auto comms = CreateNcclGroup(&store, world);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  constexpr size_t kCount = 1 << 20;
  constexpr size_t kSlowBytes = size_t{1} << 30;
  OnRanks(world, [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    CudaCommunicator& comm = *comms[r];
    cudaStream_t compute;
    ASSERT_EQ(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking), cudaSuccess);
    cudaEvent_t ready, done, finished;
    for (cudaEvent_t* e : {&ready, &done, &finished}) {
      ASSERT_EQ(cudaEventCreateWithFlags(e, cudaEventDisableTiming), cudaSuccess);
    }
    void* in_mem = nullptr;
    void* out_mem = nullptr;
    ASSERT_EQ(cudaMallocHost(&in_mem, kCount * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&out_mem, kCount * sizeof(float)), cudaSuccess);
    float* pinned_in = static_cast<float*>(in_mem);
    float* pinned_out = static_cast<float*>(out_mem);
    for (size_t k = 0; k < kCount; ++k) pinned_in[k] = Value(r, k);
    DeviceBuffer slow(kSlowBytes), buf(kCount * sizeof(float));
    ASSERT_EQ(cudaMemset(buf.get(), 0, kCount * sizeof(float)), cudaSuccess);

    for (int i = 0; i < 4; ++i) {
      ASSERT_EQ(cudaMemsetAsync(slow.get(), i, kSlowBytes, compute), cudaSuccess);
    }
    ASSERT_EQ(cudaMemcpyAsync(buf.get(), pinned_in, kCount * sizeof(float),
                              cudaMemcpyHostToDevice, compute),
              cudaSuccess);
    ASSERT_EQ(cudaEventRecord(ready, compute), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(comm.stream(), ready), cudaSuccess);
    auto work = comm.AllReduce(buf.get(), kCount, DataType::kFloat32);
    ASSERT_EQ(cudaEventRecord(done, comm.stream()), cudaSuccess);
    ASSERT_EQ(cudaStreamWaitEvent(compute, done), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(pinned_out, buf.get(), kCount * sizeof(float),
                              cudaMemcpyDeviceToHost, compute),
              cudaSuccess);
    ASSERT_EQ(cudaEventRecord(finished, compute), cudaSuccess);
    absl::Status s = comm.WaitEvent(finished);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(work->IsCompleted());
    const float rank_sum = world * (world + 1) / 2.0f;
    for (size_t k = 0; k < kCount; ++k) {
      ASSERT_EQ(pinned_out[k], rank_sum + world * static_cast<float>(k % 7)) << k;
    }
    cudaFreeHost(pinned_in);
    cudaFreeHost(pinned_out);
    for (cudaEvent_t e : {ready, done, finished}) cudaEventDestroy(e);
    cudaStreamDestroy(compute);
  });
}

// Runs one AllReduce of `count` floats on both ranks, so that NCCL has connected the ranks
// for it: a later op of the same shape is then launched at once (the first use of a NCCL
// algorithm connects lazily and cannot be launched before every peer has called it too).
void WarmUp(std::vector<std::unique_ptr<CudaCommunicator>>& comms, size_t count) {
  OnRanks(static_cast<int>(comms.size()), [&](int r) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    DeviceBuffer buf(count * sizeof(float));
    absl::Status s = comms[r]->AllReduce(buf.get(), count, DataType::kFloat32)->Wait();
    ASSERT_TRUE(s.ok()) << s;
  });
}

// Rank 0 enters an AllReduce that rank 1 never joins (alive, long timeout): only Abort can
// release it, and then at once; every later op fails at once; the first reason wins. Cold:
// the op is the communicator's first, stuck in NCCL's connection setup inside the enqueue
// call; warm: the op's kernel is running on the GPU, and Work::Wait is stuck.
class AbortTest : public ::testing::TestWithParam<bool> {};

TEST_P(AbortTest, ReleasesACollectiveAPeerNeverJoins) {
  const bool warm = GetParam();
  WEFT_REQUIRE_GPUS(2);
  MemoryStore store;
  auto comms = CreateNcclGroup(&store, 2, /*timeout_ms=*/30000);
  ASSERT_EQ(comms.size(), 2u);
  constexpr size_t kCount = 1 << 16;
  if (warm) WarmUp(comms, kCount);

  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceBuffer buf(kCount * sizeof(float));
  std::atomic<int64_t> abort_at_ns{0};
  bool healthy_before_abort = false;
  std::thread heartbeat([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    healthy_before_abort = comms[0]->health().ok();
    abort_at_ns = Clock::now().time_since_epoch().count();
    comms[0]->Abort(absl::AbortedError("generation 7 ended"));
  });
  std::shared_ptr<Work> blocked = comms[0]->AllReduce(buf.get(), kCount, DataType::kFloat32);
  if (warm) {
    EXPECT_FALSE(blocked->IsCompleted());  // launched, waiting for rank 1
  }
  absl::Status status = blocked->Wait();
  const double latency = Clock::now().time_since_epoch().count() * 1e-9 - abort_at_ns * 1e-9;
  heartbeat.join();
  std::printf("[ metric ] NCCL abort (%s) released the blocked AllReduce in %.1f ms\n",
              warm ? "warm" : "cold", latency * 1e3);
  EXPECT_TRUE(healthy_before_abort);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(status.message(), HasSubstr("generation 7 ended"));
  EXPECT_THAT(status.message(), HasSubstr("AllReduce"));
  EXPECT_GE(latency, 0.0) << "the op completed before the abort";
  EXPECT_LT(latency, 1.0);
  EXPECT_EQ(blocked->Wait().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(blocked->IsCompleted());

  // Idempotent, first reason wins; later ops fail at once.
  comms[0]->Abort(absl::InternalError("second reason"));
  comms[0]->Abort(absl::OkStatus());
  EXPECT_EQ(comms[0]->health().code(), absl::StatusCode::kAborted);
  const Clock::time_point start = Clock::now();
  absl::Status later = comms[0]->Barrier()->Wait();
  float host = 1.f;
  absl::Status later_host = comms[0]->AllReduce(&host, 1, DataType::kFloat32)->Wait();
  cudaEvent_t event;
  ASSERT_EQ(cudaEventCreate(&event), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(event, comms[0]->stream()), cudaSuccess);
  absl::Status later_event = comms[0]->WaitEvent(event);
  cudaEventDestroy(event);
  EXPECT_LT(SecondsSince(start), 0.1);
  for (const absl::Status& s : {later, later_host, later_event}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
    EXPECT_THAT(s.message(), HasSubstr("generation 7 ended"));
  }

  // An OK reason becomes ABORTED.
  comms[1]->Abort(absl::OkStatus());
  EXPECT_EQ(comms[1]->health().code(), absl::StatusCode::kAborted);
  const Clock::time_point destroy = Clock::now();
  comms.clear();
  EXPECT_LT(SecondsSince(destroy), 2.0);
}

INSTANTIATE_TEST_SUITE_P(ColdAndWarm, AbortTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Warm" : "Cold"; });

// A wait longer than timeout_ms aborts the communicator with DEADLINE_EXCEEDED naming the
// op: in Work::Wait (warm) or in the enqueue call stuck in connection setup (cold).
TEST(NcclCommunicatorTest, WaitTimesOut) {
  WEFT_REQUIRE_GPUS(2);
  for (bool warm : {false, true}) {
    SCOPED_TRACE(warm ? "warm" : "cold");
    MemoryStore store;
    auto comms = CreateNcclGroup(&store, 2, /*timeout_ms=*/1000);
    ASSERT_EQ(comms.size(), 2u);
    if (warm) WarmUp(comms, 512);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    DeviceBuffer buf(1024 * sizeof(float));
    const Clock::time_point start = Clock::now();
    auto work = comms[0]->ReduceScatter(buf.get(), buf.get() + 512 * sizeof(float), 256,
                                        DataType::kFloat32);
    absl::Status status = work->Wait();
    const double waited = SecondsSince(start);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(status.message(), HasSubstr("ReduceScatter"));
    EXPECT_GT(waited, 0.9);
    EXPECT_LT(waited, 3.0);
    EXPECT_EQ(comms[0]->health().code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_EQ(comms[0]->Barrier()->Wait().code(), absl::StatusCode::kDeadlineExceeded);
    comms[1]->Abort(absl::AbortedError("peer timed out"));
  }
}

// Destroying a communicator whose op waits for a peer that never joins neither hangs nor
// leaves its Work hanging (CANCELLED); the peer's own destruction is bounded too.
TEST(NcclCommunicatorTest, DestroyWithAPendingOpDoesNotHang) {
  WEFT_REQUIRE_GPUS(2);
  MemoryStore store;
  auto comms = CreateNcclGroup(&store, 2, /*timeout_ms=*/3000);
  ASSERT_EQ(comms.size(), 2u);
  WarmUp(comms, 4096);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  DeviceBuffer buf(4096 * sizeof(float));
  auto work = comms[0]->AllReduce(buf.get(), 4096, DataType::kFloat32);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(work->IsCompleted());
  Clock::time_point start = Clock::now();
  comms[0].reset();
  EXPECT_LT(SecondsSince(start), 2.0);
  absl::Status status = work->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  start = Clock::now();
  comms[1].reset();  // healthy and idle, but its peer is gone
  const double destroy = SecondsSince(start);
  std::printf("[ metric ] destroying the healthy peer took %.1f ms\n", destroy * 1e3);
  EXPECT_LT(destroy, 4.0);
}

// Creates rank `rank` of a world of 2 whose peer never calls Create; *took gets the seconds
// Create took.
absl::StatusOr<std::unique_ptr<CudaCommunicator>> CreateAlone(Store* store, int rank,
                                                              int64_t timeout_ms, double* took) {
  NcclOptions options;
  options.timeout_ms = timeout_ms;
  const Clock::time_point start = Clock::now();
  auto comm = CreateNcclCommunicator(store, rank, 2, options);
  *took = SecondsSince(start);
  return comm;
}

// Init with a rank that never calls Create: DEADLINE_EXCEEDED within the timeout, naming
// the missing rank; and the same for a rank waiting for rank 0's unique id.
TEST(NcclCommunicatorTest, InitTimesOutWhenAPeerNeverArrives) {
  WEFT_REQUIRE_GPUS(1);
  for (int rank : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "alone: rank " << rank);
    MemoryStore store;
    double took = 0;
    auto comm = CreateAlone(&store, rank, /*timeout_ms=*/2000, &took);
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded) << comm.status();
    EXPECT_GT(took, 1.9);
    EXPECT_LT(took, 4.0);
    if (rank == 0) {
      EXPECT_THAT(comm.status().message(), HasSubstr("[1]"));
    }
  }
}

// The generation ends (the store closes with ABORTED) while a rank waits for the unique id
// or sits in NCCL's init: Create returns ABORTED promptly.
TEST(NcclCommunicatorTest, StoreClosingDuringInitAborts) {
  WEFT_REQUIRE_GPUS(1);
  for (int rank : {0, 1}) {
    SCOPED_TRACE(::testing::Message() << "alone: rank " << rank);
    MemoryStore store;
    std::thread coordinator([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      store.Close(absl::AbortedError("generation 4 ended"));
    });
    double took = 0;
    auto comm = CreateAlone(&store, rank, /*timeout_ms=*/20000, &took);
    coordinator.join();
    ASSERT_FALSE(comm.ok());
    EXPECT_EQ(comm.status().code(), absl::StatusCode::kAborted) << comm.status();
    EXPECT_THAT(comm.status().message(), HasSubstr("generation 4 ended"));
    EXPECT_LT(took, 2.0);
  }
}

}  // namespace
}  // namespace weft::comm
