// HybridCommunicator: a world of 2 replicas x 2 ranks (threads, real Gloo groups and replicas)
// sums over the whole world, passes a barrier only once every rank arrived, refuses the
// collectives it does not compose, and aborts both of its communicators.
#include "worker/comm/hybrid_communicator.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/memory_store.h"
#include "gtest/gtest.h"
#include "tests/worker/comm/comm_test_util.h"

namespace weft::comm {
namespace {

using testing::OnRanks;

constexpr int kReplicas = 2;
constexpr int kGroup = 2;
constexpr int kWorld = kReplicas * kGroup;

// Rank r of the world: group r / kGroup, position r % kGroup.
std::vector<std::unique_ptr<HybridCommunicator>> CreateWorld(Store* store) {
  std::vector<std::unique_ptr<HybridCommunicator>> world(kWorld);
  OnRanks(kWorld, [&](int r) {
    GlooOptions options;
    options.timeout_ms = 10000;
    options.store_prefix = absl::StrCat("g/", r / kGroup);
    auto group = CreateGlooCommunicator(store, r % kGroup, kGroup, options);
    ASSERT_TRUE(group.ok()) << group.status();
    options.store_prefix = absl::StrCat("r/", r % kGroup);
    auto replica = CreateGlooCommunicator(store, r / kGroup, kReplicas, options);
    ASSERT_TRUE(replica.ok()) << replica.status();
    world[r] = std::make_unique<HybridCommunicator>(*std::move(group), *std::move(replica));
  });
  return world;
}

TEST(HybridCommunicatorTest, AllReduceSumsOverTheWorldAndRanksAreWorldRanks) {
  MemoryStore store;
  auto world = CreateWorld(&store);
  ASSERT_EQ(world.size(), static_cast<size_t>(kWorld));
  OnRanks(kWorld, [&](int r) {
    EXPECT_EQ(world[r]->rank(), r);
    EXPECT_EQ(world[r]->world_size(), kWorld);
    float v[2] = {1.0f + r, 10.0f};
    ASSERT_TRUE(world[r]->AllReduce(v, 2, DataType::kFloat32)->Wait().ok());
    EXPECT_EQ(v[0], 1 + 2 + 3 + 4);
    EXPECT_EQ(v[1], 40);
  });
}

TEST(HybridCommunicatorTest, BarrierWaitsForEveryRank) {
  MemoryStore store;
  auto world = CreateWorld(&store);
  ASSERT_EQ(world.size(), static_cast<size_t>(kWorld));
  std::atomic<int> arrived{0};
  OnRanks(kWorld, [&](int r) {
    // The last rank of the last group comes late: nobody may leave before it arrives.
    if (r == kWorld - 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    arrived.fetch_add(1);
    ASSERT_TRUE(world[r]->Barrier()->Wait().ok());
    EXPECT_EQ(arrived.load(), kWorld) << "rank " << r;
  });
}

TEST(HybridCommunicatorTest, UncomposedCollectivesAreUnimplementedAndAbortReachesBoth) {
  MemoryStore store;
  auto world = CreateWorld(&store);
  ASSERT_EQ(world.size(), static_cast<size_t>(kWorld));
  float buf[kWorld] = {};
  EXPECT_EQ(world[0]->AllGather(buf, buf, 1, DataType::kFloat32)->Wait().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(world[0]->ReduceScatter(buf, buf, 1, DataType::kFloat32)->Wait().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(world[0]->Broadcast(buf, 1, DataType::kFloat32, 0)->Wait().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(world[0]->Reduce(buf, buf, 1, DataType::kFloat32, 0)->Wait().code(),
            absl::StatusCode::kUnimplemented);
  world[0]->Abort(absl::CancelledError("test abort"));
  EXPECT_EQ(world[0]->group()->Barrier()->Wait().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(world[0]->replica()->Barrier()->Wait().code(), absl::StatusCode::kCancelled);
  float x = 1;
  EXPECT_EQ(world[0]->AllReduce(&x, 1, DataType::kFloat32)->Wait().code(),
            absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace weft::comm
