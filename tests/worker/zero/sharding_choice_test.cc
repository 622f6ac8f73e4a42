// sharding.scope AUTO's pure decisions (worker/zero/sharding_choice.h): the scope from the
// rendezvous' hosts and the ranks' memory verdicts, the replica format from a measured
// bandwidth, each with the reason its event carries.
#include "worker/zero/sharding_choice.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::zero {
namespace {

using ::testing::HasSubstr;
using weft::v1::ShardingSpec;

TEST(ChooseScopeTest, HostWhenEvenHostsHoldAReplica) {
  const ScopeChoice c = ChooseScope({"a", "a", "b", "b"}, absl::OkStatus());
  EXPECT_EQ(c.scope, ShardingSpec::HOST);
  EXPECT_THAT(c.reason, HasSubstr("2 hosts of 2 ranks each"));
}

TEST(ChooseScopeTest, WorldOnOneHostUnevenHostsOrTooLittleMemory) {
  EXPECT_EQ(ChooseScope({"a", "a"}, absl::OkStatus()).scope, ShardingSpec::WORLD);
  EXPECT_THAT(ChooseScope({"a", "a"}, absl::OkStatus()).reason, HasSubstr("one host"));
  const ScopeChoice uneven = ChooseScope({"a", "a", "b"}, absl::OkStatus());
  EXPECT_EQ(uneven.scope, ShardingSpec::WORLD);
  EXPECT_THAT(uneven.reason, HasSubstr("a=2, b=1"));
  const ScopeChoice full =
      ChooseScope({"a", "b"}, absl::ResourceExhaustedError("needs 90 GiB, 70 free"));
  EXPECT_EQ(full.scope, ShardingSpec::WORLD);
  EXPECT_THAT(full.reason, HasSubstr("cannot hold a replica of the state (needs 90 GiB, 70 free)"));
  EXPECT_THAT(full.reason, HasSubstr("all 2 ranks of the 2 hosts"));
}

TEST(ChooseScopeTest, HostWithTheOptimizerSharedOutWhenOnlyThatFits) {
  const absl::Status no_replica = absl::ResourceExhaustedError("needs 150 GiB, 139 free");
  const ScopeChoice c = ChooseScope({"a", "b"}, no_replica, absl::OkStatus());
  EXPECT_EQ(c.scope, ShardingSpec::HOST);
  EXPECT_TRUE(c.shard_optimizer);
  EXPECT_THAT(c.reason, HasSubstr("HOST with OPTIMIZER_SHARDED: 2 hosts of 1 ranks each"));
  EXPECT_THAT(c.reason, HasSubstr("(needs 150 GiB, 139 free)"));
  EXPECT_THAT(c.reason, HasSubstr("shared out over the 2 replicas"));
  // A replica that fits whole keeps its optimizer whole.
  EXPECT_FALSE(ChooseScope({"a", "b"}, absl::OkStatus(), absl::OkStatus()).shard_optimizer);
  // Neither fits: WORLD, saying both.
  const ScopeChoice world = ChooseScope(
      {"a", "b"}, no_replica, absl::ResourceExhaustedError("needs 120 GiB, 100 free"));
  EXPECT_EQ(world.scope, ShardingSpec::WORLD);
  EXPECT_FALSE(world.shard_optimizer);
  EXPECT_THAT(world.reason, HasSubstr("nor with the optimizer shared out (needs 120 GiB"));
  // Not weighed (an offloaded optimizer): WORLD, without a word of it.
  EXPECT_THAT(ChooseScope({"a", "b"}, no_replica).reason,
              ::testing::Not(HasSubstr("shared out")));
}

FormatChoiceInputs Llama1B(double gbps, ShardingSpec::WireFormat least_exact) {
  FormatChoiceInputs in;
  in.replicas = 2;
  in.measured_gbps = gbps;
  in.shard_elements = 1'235'814'400;  // one GPU a host: the whole model
  in.step_compute_ms = 4000;
  in.last_backward_ms = 170;
  in.least_exact = least_exact;
  return in;
}

TEST(ChooseReplicaFormatTest, KeepsFp32WhenTheLinkHidesIt) {
  // 4.9 GB at 400 Gb/s: 99 ms, inside the last backward.
  const FormatChoice c = ChooseReplicaFormat(Llama1B(400, ShardingSpec::WIRE_INT8));
  EXPECT_EQ(c.format, ShardingSpec::WIRE_FP32);
  EXPECT_THAT(c.reason, HasSubstr("400.0 Gb/s measured"));
  EXPECT_THAT(c.reason, HasSubstr("the most exact within 5% exposed"));
}

TEST(ChooseReplicaFormatTest, TakesTheMostExactFormatThatIsHidden) {
  // 25 Gb/s: fp32 1582 ms (35% exposed), bf16 791 ms (16%), int8 ~400 ms (6%): none within 5%,
  // so the least exposed.
  FormatChoice c = ChooseReplicaFormat(Llama1B(25, ShardingSpec::WIRE_INT8));
  EXPECT_EQ(c.format, ShardingSpec::WIRE_INT8);
  EXPECT_THAT(c.reason, HasSubstr("none is hidden"));
  // 100 Gb/s: fp32 395 ms (5.6%), bf16 198 ms (0.7%): bf16.
  c = ChooseReplicaFormat(Llama1B(100, ShardingSpec::WIRE_INT8));
  EXPECT_EQ(c.format, ShardingSpec::WIRE_BF16);
  EXPECT_THAT(c.reason, HasSubstr("WIRE_FP32 395 ms"));
}

TEST(ChooseReplicaFormatTest, NeverLessExactThanTheJobAllows) {
  EXPECT_EQ(ChooseReplicaFormat(Llama1B(25, ShardingSpec::WIRE_FP32)).format,
            ShardingSpec::WIRE_FP32);
  const FormatChoice c = ChooseReplicaFormat(Llama1B(25, ShardingSpec::WIRE_BF16));
  EXPECT_EQ(c.format, ShardingSpec::WIRE_BF16);
  EXPECT_THAT(c.reason, HasSubstr("allows down to WIRE_BF16"));
  EXPECT_THAT(c.reason, ::testing::Not(HasSubstr("WIRE_INT8")));
}

TEST(EstimateStepComputeMsTest, FlopsOverFortyPercentOfThePeak) {
  // 1e10 FLOPs a token, 1e5 tokens: 1e15 FLOPs at 0.4 x 1e15/s = 2.5 s; the last of 4
  // micro-steps' backward two thirds of a quarter.
  const StepComputeEstimate e = EstimateStepComputeMs(1e10, 1e5, 4, 1e15);
  EXPECT_DOUBLE_EQ(e.step_ms, 2500);
  EXPECT_DOUBLE_EQ(e.last_backward_ms, 2500.0 * 2 / 3 / 4);
  EXPECT_EQ(EstimateStepComputeMs(1e10, 1e5, 4, 0).step_ms, 0);
}

}  // namespace
}  // namespace weft::zero
