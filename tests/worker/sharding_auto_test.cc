// sharding.scope AUTO's generation side (worker/sharding_auto.h): the ranks (threads of this
// process, CPU engines' memory plans, a MemoryStore as the generation's store) all reach the
// same groups — HOST where the hosts are even and every rank fits, WORLD where one host, uneven
// hosts or a refusal say otherwise, naming why — and SettleAutoSpec turns a choice and a
// measured bandwidth into the spec the engine is built from.
#include "worker/sharding_auto.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::worker {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using weft::v1::ShardingSpec;

weft::v1::JobSpec Spec(int layers, int hidden, int vocab) {
  auto spec = ParseJobSpecText(absl::StrCat(R"pb(
    name: "auto"
    model { num_layers: )pb", layers, " hidden_size: ", hidden, " num_heads: 4 vocab_size: ",
                                            vocab, R"pb( context_length: 64 }
    data { format: DATA_FORMAT_TEXT_BYTES train_path: "/unused" }
    optimizer { learning_rate: 0.01 }
    training { micro_batch_size: 2 sequence_length: 64 total_steps: 5 }
    zero_stage: 3
    sharding { scope: AUTO replica_reduce_format: WIRE_INT8 }
    resources { device_kind: DEVICE_KIND_CPU min_workers: 4 max_workers: 4 }
  )pb"),
                               "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// Every rank's choice over `hosts`, each rank a thread.
std::vector<absl::StatusOr<AutoScope>> ChooseOnEveryRank(const std::vector<std::string>& hosts,
                                                         const weft::v1::JobSpec& spec,
                                                         Store* store) {
  std::vector<absl::StatusOr<AutoScope>> out(hosts.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    threads.emplace_back([&, r] {
      DeviceOptions device;  // the CPU
      device.ranks_on_host = 2;
      out[r] = ChooseAutoScope(store, r, hosts, spec, device, absl::Seconds(20));
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ChooseAutoScopeTest, EvenHostsThatHoldAReplicaGetHostGroups) {
  MemoryStore store;
  const auto chosen = ChooseOnEveryRank({"a", "a", "b", "b"}, Spec(2, 64, 256), &store);
  for (const auto& c : chosen) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->groups, (zero::ShardingGroups{4, 2}));
    EXPECT_THAT(c->reason, StartsWith("HOST: 2 hosts of 2 ranks each"));
    EXPECT_FALSE(c->shard_optimizer);
  }
  // Each rank also weighed the optimizer shared out over the replicas (it fits here too).
  auto sharded = store.Get("auto-scope-sharded/3");
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_EQ(*sharded, "");
}

TEST(ChooseAutoScopeTest, ARefusalAnywhereMakesEveryRankShardOverTheWorld) {
  // 96 x 12288: a 175B model's replica cannot fit a host's share of this machine's memory.
  MemoryStore store;
  const auto chosen = ChooseOnEveryRank({"a", "a", "b", "b"}, Spec(96, 12288, 50304), &store);
  for (const auto& c : chosen) {
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->groups, zero::ShardingGroups::Full(4));
    EXPECT_THAT(c->reason, StartsWith("WORLD: the 2 ranks of a host cannot hold a replica"));
    EXPECT_THAT(c->reason, HasSubstr("rank 0: "));  // the first refusal, by rank
    EXPECT_THAT(c->reason, HasSubstr("nor with the optimizer shared out (rank 0: "));
  }
}

TEST(ChooseAutoScopeTest, OneHostOrUnevenHostsShardOverTheWorldWithoutVoting) {
  for (const std::vector<std::string>& hosts :
       {std::vector<std::string>{"a", "a", "a"}, std::vector<std::string>{"a", "a", "b"}}) {
    MemoryStore store;
    const auto chosen = ChooseOnEveryRank(hosts, Spec(2, 64, 256), &store);
    for (const auto& c : chosen) {
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ(c->groups, zero::ShardingGroups::Full(3));
      EXPECT_THAT(c->reason, StartsWith("WORLD: "));
    }
    EXPECT_EQ(store.Get("auto-scope/0").status().code(), absl::StatusCode::kNotFound);
  }
}

TEST(ChooseAutoScopeTest, ARankThatNeverVotesTimesOut) {
  MemoryStore store;
  DeviceOptions device;
  const auto c = ChooseAutoScope(&store, 0, {"a", "b"}, Spec(2, 64, 256), device,
                                 absl::Milliseconds(200));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
}

TEST(SettleAutoSpecTest, HostGetsTheMeasuredFormatAndWorldStaysExact) {
  const weft::v1::JobSpec spec = Spec(2, 64, 256);
  std::string note;
  BeforeEngine settle =
      SettleAutoSpec(spec, AutoScope{zero::ShardingGroups{4, 2}, "HOST: why"}, 1e12, &note);
  // The callback reads only the bandwidth; a world of one stands in for the backend's comm.
  auto world = comm::CreateGlooCommunicator(nullptr, 0, 1, comm::GlooOptions{});
  ASSERT_TRUE(world.ok()) << world.status();
  auto settled = settle(**world, 25.0);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->sharding().scope(), ShardingSpec::HOST);
  EXPECT_THAT(note, StartsWith("HOST: why; replica all-reduce WIRE_"));
  EXPECT_THAT(note, HasSubstr("25.0 Gb/s measured"));

  settle = SettleAutoSpec(spec, AutoScope{zero::ShardingGroups::Full(4), "WORLD: why"}, 1e12,
                          &note);
  settled = settle(**world, 0.0);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->sharding().scope(), ShardingSpec::WORLD);
  EXPECT_EQ(settled->sharding().replica_reduce_format(), ShardingSpec::WIRE_FP32);
  EXPECT_EQ(note, "WORLD: why");

  // HOST with the optimizer shared out: the spec says so, and WORLD never does.
  weft::v1::JobSpec sharded_spec = spec;
  sharded_spec.mutable_sharding()->set_replica_optimizer(ShardingSpec::OPTIMIZER_SHARDED);
  settle = SettleAutoSpec(spec, AutoScope{zero::ShardingGroups{4, 2}, "HOST with why", true},
                          1e12, &note);
  settled = settle(**world, 25.0);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->sharding().replica_optimizer(), ShardingSpec::OPTIMIZER_SHARDED);
  settle = SettleAutoSpec(sharded_spec, AutoScope{zero::ShardingGroups::Full(4), "WORLD: why"},
                          1e12, &note);
  settled = settle(**world, 0.0);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->sharding().replica_optimizer(), ShardingSpec::OPTIMIZER_REPLICATED);
  EXPECT_THAT(ValidateJobSpec(*settled),
              ::testing::Not(::testing::Contains(HasSubstr("replica_optimizer"))));
}

}  // namespace
}  // namespace weft::worker
