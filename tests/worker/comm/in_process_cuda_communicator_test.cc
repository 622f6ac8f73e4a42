// The in-process CUDA communicator (a test utility, in_process_cuda_communicator.h): its
// collectives' results, that a late one is not done when its call returns (only work ordered
// behind its stream sees it), and that a synchronous one is. Ranks are threads sharing GPU 0;
// every test skips without a GPU.
#include "tests/worker/comm/in_process_cuda_communicator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <functional>
#include <latch>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/comm/comm_test_util.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"

namespace weft::comm::testing {
namespace {

using ::testing::HasSubstr;

using Floats = engine::cuda::test_util::DeviceBuffer<float>;

// Waits, through the communicator, for everything enqueued on its stream so far.
void Drain(CudaCommunicator& comm) {
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(done, comm.stream()), cudaSuccess);
  EXPECT_TRUE(comm.WaitEvent(done).ok());
  cudaEventDestroy(done);
}

class InProcessCudaCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      cudaGetLastError();
      GTEST_SKIP() << "no CUDA device";
    }
  }

  // `world` ranks of a group named after the test, each on its own thread running fn(rank,
  // its communicator).
  void OnGroup(int world, const InProcessOptions& options,
               const std::function<void(int, CudaCommunicator&)>& fn) {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    OnRanks(world, [&](int rank) {
      cudaSetDevice(0);
      auto comm = CreateInProcessCudaCommunicator(name, rank, world, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      fn(rank, **comm);
    });
  }
};

// Rank r's value i is 100 r + i: sums of a few are exact in fp32.
std::vector<float> Values(int rank, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = 100.0f * rank + i;
  return v;
}

TEST_F(InProcessCudaCommunicatorTest, CollectivesGiveTheirResults) {
  constexpr int kWorld = 3, kN = 4;
  OnGroup(kWorld, {}, [&](int rank, CudaCommunicator& comm) {
    // AllGather, out of place and in place.
    Floats send(Values(rank, kN)), gathered(std::vector<float>(kWorld * kN, -1.0f));
    std::vector<float> all(kWorld * kN);
    for (int r = 0; r < kWorld; ++r) {
      for (int i = 0; i < kN; ++i) all[r * kN + i] = 100.0f * r + i;
    }
    std::vector<float> in_place_init(kWorld * kN, -1.0f);
    for (int i = 0; i < kN; ++i) in_place_init[rank * kN + i] = 100.0f * rank + i;
    Floats in_place(in_place_init);
    EXPECT_TRUE(comm.AllGather(send.get(), gathered.get(), kN, DataType::kFloat32)->Wait().ok());
    EXPECT_TRUE(comm.AllGather(in_place.get() + rank * kN, in_place.get(), kN,
                               DataType::kFloat32)->Wait().ok());
    // ReduceScatter, out of place and in place: block b sums to 300 b + 3 i + 300.
    Floats scatter_in(Values(rank, kWorld * kN)), scattered(std::vector<float>(kN, -1.0f));
    Floats in_place_scatter(Values(rank, kWorld * kN));
    EXPECT_TRUE(comm.ReduceScatter(scatter_in.get(), scattered.get(), kN, DataType::kFloat32)
                    ->Wait().ok());
    EXPECT_TRUE(comm.ReduceScatter(in_place_scatter.get(), in_place_scatter.get() + rank * kN,
                                   kN, DataType::kFloat32)->Wait().ok());
    Floats reduced_all(Values(rank, kN)), broadcast(Values(rank, kN)), reduced(Values(rank, kN));
    EXPECT_TRUE(comm.AllReduce(reduced_all.get(), kN, DataType::kFloat32)->Wait().ok());
    EXPECT_TRUE(comm.Broadcast(broadcast.get(), kN, DataType::kFloat32, 1)->Wait().ok());
    // Reduce into rank 2 in place; the others pass no recv.
    EXPECT_TRUE(comm.Reduce(reduced.get(), rank == 2 ? reduced.get() : nullptr, kN,
                            DataType::kFloat32, 2)->Wait().ok());
    Drain(comm);

    EXPECT_EQ(gathered.ToHost(), all);
    EXPECT_EQ(in_place.ToHost(), all);
    std::vector<float> sums(kN), block(kN);
    for (int i = 0; i < kN; ++i) {
      sums[i] = 300.0f + 3.0f * i;
      block[i] = 300.0f + 3.0f * (rank * kN + i);
    }
    EXPECT_EQ(scattered.ToHost(), block);
    std::vector<float> in_place_after = Values(rank, kWorld * kN);
    std::copy(block.begin(), block.end(), in_place_after.begin() + rank * kN);
    EXPECT_EQ(in_place_scatter.ToHost(), in_place_after);  // only this rank's block changes
    EXPECT_EQ(reduced_all.ToHost(), sums);
    EXPECT_EQ(broadcast.ToHost(), Values(1, kN));
    EXPECT_EQ(reduced.ToHost(), rank == 2 ? sums : Values(rank, kN));
  });
}

// The call returns with the collective still to run: a read that does not wait for the
// communicator's stream sees the old values; one behind it, the sums. The ranks make their
// first reads before either makes its second: a read into pageable memory that waits for the
// collective can hold up the driver's other pageable copies until then.
TEST_F(InProcessCudaCommunicatorTest, ALateCollectiveLandsOnlyBehindItsStream) {
  InProcessOptions options;
  options.late_us = 300000;
  std::latch first_reads(2);
  OnGroup(2, options, [&](int rank, CudaCommunicator& comm) {
    Floats buf(Values(rank, 8));
    EXPECT_TRUE(comm.AllReduce(buf.get(), 8, DataType::kFloat32)->Wait().ok());
    cudaStream_t other = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(buf.ToHostOn(other), Values(rank, 8)) << "the collective ran before it was due";
    cudaStreamDestroy(other);
    first_reads.arrive_and_wait();  // never skipped: the other rank waits here
    std::vector<float> sums(8);
    for (int i = 0; i < 8; ++i) sums[i] = 100.0f + 2.0f * i;
    EXPECT_EQ(buf.ToHostOn(comm.stream()), sums);
  });
}

TEST_F(InProcessCudaCommunicatorTest, ASynchronousCollectiveIsDoneOnReturn) {
  InProcessOptions options;
  options.synchronous = true;
  OnGroup(2, options, [&](int rank, CudaCommunicator& comm) {
    Floats buf(Values(rank, 8));
    EXPECT_TRUE(comm.AllReduce(buf.get(), 8, DataType::kFloat32)->Wait().ok());
    cudaStream_t other = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
    std::vector<float> sums(8);
    for (int i = 0; i < 8; ++i) sums[i] = 100.0f + 2.0f * i;
    EXPECT_EQ(buf.ToHostOn(other), sums);
    cudaStreamDestroy(other);
  });
}

TEST_F(InProcessCudaCommunicatorTest, BadCallsFailWithTheReason) {
  OnGroup(2, {}, [&](int rank, CudaCommunicator& comm) {
    Floats buf(Values(rank, 8));
    // Ranks that disagree: both fail, naming the difference.
    const absl::Status mismatch =
        comm.AllReduce(buf.get(), rank == 0 ? 8 : 4, DataType::kFloat32)->Wait();
    EXPECT_EQ(mismatch.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(mismatch.message(), HasSubstr("rank 1 called AllReduce of 4 elements"));
    const absl::Status bf16 =
        comm.ReduceScatter(buf.get(), buf.get(), 2, DataType::kBFloat16)->Wait();
    EXPECT_EQ(bf16.code(), absl::StatusCode::kUnimplemented);
    std::vector<float> host(8);
    const absl::Status on_host = comm.AllReduce(host.data(), 8, DataType::kFloat32)->Wait();
    EXPECT_EQ(on_host.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(on_host.message(), HasSubstr("device buffers only"));
    EXPECT_EQ(comm.Broadcast(buf.get(), 8, DataType::kFloat32, 2)->Wait().code(),
              absl::StatusCode::kInvalidArgument);
    // The group still works.
    EXPECT_TRUE(comm.AllReduce(buf.get(), 8, DataType::kFloat32)->Wait().ok());
    Drain(comm);
    EXPECT_EQ(buf.ToHost()[1], 102.0f);
  });
  EXPECT_EQ(CreateInProcessCudaCommunicator("bad", 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::comm::testing
