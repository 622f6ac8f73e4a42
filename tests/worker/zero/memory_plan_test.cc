// DecideMemory's choices and refusals against a made-up planner: activations of 30, 20 and
// 10 GiB at NONE, SELECTIVE and FULL for 8 micro-batch rows (proportional to the rows) over 10
// blocks (so each block one level lighter adds a tenth of the difference), and 40 GiB of state
// spread over the world.
#include "worker/zero/memory_plan.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::zero {
namespace {

using engine::Checkpointing;
using engine::CheckpointingPlan;
using Level = weft::v1::ActivationCheckpointing;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr size_t kGiB = size_t{1} << 30;

constexpr int kLayers = 10;

size_t Per8Rows(Checkpointing level) {
  return level == Checkpointing::kNone ? 30 : level == Checkpointing::kSelective ? 20 : 10;
}

GpuMemoryPlan Plan(const CheckpointingPlan& level, int rows, int world) {
  const size_t base = Per8Rows(level.level) * kGiB * rows / 8;
  const size_t lighter = Per8Rows(engine::Lighter(level.level)) * kGiB * rows / 8;
  GpuMemoryPlan plan;
  plan.state_bytes = 40 * kGiB / world;
  plan.activation_bytes = base + (lighter - base) * level.lighter_count() / kLayers;
  return plan;
}

MemoryDecision Decide(Level::Level requested, size_t free_gib, int rows = 8, int world = 1) {
  return DecideMemory(requested, free_gib * kGiB, rows, world, kLayers, Plan);
}

TEST(DecideMemoryTest, AutoKeepsEverythingWhenItFits) {
  const MemoryDecision d = Decide(Level::AUTO, 80);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kNone));
  EXPECT_EQ(d.plan.total(), 70 * kGiB);
  EXPECT_THAT(d.reason, HasSubstr("activation checkpointing none (chosen by AUTO)"));
  EXPECT_THAT(d.reason, Not(HasSubstr("would need")));
}

TEST(DecideMemoryTest, AutoTakesTheLeastRecomputationThatFits) {
  // 60.5 GiB: SELECTIVE fits with no room for a block at NONE (each adds 1 GiB).
  MemoryDecision d = DecideMemory(Level::AUTO, 60 * kGiB + kGiB / 2, 8, 1, kLayers, Plan);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kSelective));
  EXPECT_THAT(d.reason, HasSubstr("activation checkpointing selective (chosen by AUTO)"));
  EXPECT_THAT(d.reason, HasSubstr("none would need 70.00 GiB"));
  d = Decide(Level::LEVEL_UNSPECIFIED, 50);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kFull));
  EXPECT_THAT(d.reason, HasSubstr("none would need 70.00 GiB, selective would need 60.00 GiB"));
}

// What the lightest uniform level leaves free goes to blocks one level lighter, as many as fit.
TEST(DecideMemoryTest, AutoSpendsTheRestOnLighterBlocks) {
  MemoryDecision d = Decide(Level::AUTO, 65);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kSelective, 5));  // 60 + 5 x 1
  EXPECT_EQ(d.plan.total(), 65 * kGiB);
  EXPECT_THAT(d.reason, HasSubstr("activation checkpointing selective, none for blocks 0-4 "
                                  "(chosen by AUTO)"));
  d = Decide(Level::AUTO, 59);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kFull, 9));  // 50 + 9 x 1; 10 is SELECTIVE
  EXPECT_THAT(d.reason, HasSubstr("full, selective for blocks 0-8"));
  d = Decide(Level::AUTO, 51);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kFull, 1));
  EXPECT_THAT(d.reason, HasSubstr("full, selective for block 0 (chosen"));
  // A level named by the job runs uniform, whatever is free.
  d = Decide(Level::FULL, 59);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kFull));
}

// Where the last blocks' activations lie under gradients not yet written (gradients over spent
// activations), lighter blocks at the end cost less: here nothing past block 4. AUTO then puts
// them there; on a tie, first.
TEST(DecideMemoryTest, AutoPutsLighterBlocksAtTheEndWhereTheyCostLess) {
  const MemoryPlanner hiding = [](const CheckpointingPlan& level, int rows, int world) {
    GpuMemoryPlan plan = Plan(level.level, rows, world);
    for (int l = 0; l < kLayers; ++l) {
      if (level.At(l) != level.level && l < 5) plan.activation_bytes += kGiB;
    }
    return plan;
  };
  // SELECTIVE needs 60 GiB; at the start one block fits, at the end blocks 4-9.
  MemoryDecision d = DecideMemory(Level::AUTO, 61 * kGiB, 8, 1, kLayers, hiding);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kSelective, 4, 10));
  EXPECT_EQ(d.plan.total(), 61 * kGiB);
  EXPECT_THAT(d.reason, HasSubstr("selective, none for blocks 4-9 (chosen by AUTO)"));
  // The planner of the other tests charges every block alike: the first blocks.
  EXPECT_EQ(Decide(Level::AUTO, 65).level, CheckpointingPlan(Checkpointing::kSelective, 5));
  EXPECT_EQ(engine::DescribeCheckpointing(CheckpointingPlan(Checkpointing::kFull, 9, 10)),
            "full, selective for block 9");
}

// A job's training.device_memory_limit_gib stands in for the free memory, and the reasons say
// which of the two bound the plan.
TEST(DecideMemoryTest, TheReasonNamesTheBudgetThatBinds) {
  constexpr const char* kLimit = "allowed by training.device_memory_limit_gib";
  MemoryDecision d =
      DecideMemory(Level::AUTO, 80 * kGiB, 8, 1, kLayers, Plan, kLimit);
  ASSERT_TRUE(d.fits);
  EXPECT_THAT(d.reason, HasSubstr("of 80.00 GiB allowed by training.device_memory_limit_gib"));
  d = DecideMemory(Level::NONE, 65 * kGiB, 8, 1, kLayers, Plan, kLimit);
  ASSERT_FALSE(d.fits);
  EXPECT_THAT(d.reason,
              HasSubstr("but 65.00 GiB is allowed by training.device_memory_limit_gib"));
  EXPECT_THAT(Decide(Level::AUTO, 80).reason, HasSubstr("of 80.00 GiB free"));
}

TEST(DecideMemoryTest, AnExplicitLevelIsKeptOrRefusedNamingOneThatFits) {
  MemoryDecision d = Decide(Level::FULL, 80);
  ASSERT_TRUE(d.fits);
  EXPECT_EQ(d.level, CheckpointingPlan(Checkpointing::kFull));  // asked for, though NONE fits
  EXPECT_THAT(d.reason, HasSubstr("(as asked)"));
  d = Decide(Level::NONE, 65);
  ASSERT_FALSE(d.fits);
  EXPECT_THAT(d.reason, HasSubstr("but 65.00 GiB is free"));
  EXPECT_THAT(d.reason, HasSubstr("training.activation_checkpointing: SELECTIVE (60.00 GiB)"));
  // Fewer rows at the level asked for: 6 rows of NONE need 40 + 22.5.
  EXPECT_THAT(d.reason, HasSubstr("training.micro_batch_size: 6 (62.50 GiB)"));
  // More GPUs at the level asked for: 40/2 + 30 = 50.
  EXPECT_THAT(d.reason, HasSubstr("resources.min_workers: 2 GPUs (50.00 GiB each)"));
}

TEST(DecideMemoryTest, NothingFitsSaysWhatWould) {
  const MemoryDecision d = Decide(Level::AUTO, 45);
  ASSERT_FALSE(d.fits);
  EXPECT_THAT(d.reason, HasSubstr("activation checkpointing full"));
  EXPECT_THAT(d.reason, HasSubstr("micro_batch_size"));
  // FULL with 4 rows: 40 + 5; more GPUs: 40/2 + 10 = 30.
  EXPECT_THAT(d.reason, HasSubstr("training.micro_batch_size: 4 (45.00 GiB)"));
  EXPECT_THAT(d.reason, HasSubstr("resources.min_workers: 2 GPUs (30.00 GiB each)"));
  EXPECT_THAT(d.reason, Not(HasSubstr("training.activation_checkpointing:")));
}

TEST(DecideMemoryTest, NothingWithinReach) {
  // Activations alone at one row of FULL exceed the device: no hint helps.
  const MemoryDecision d = DecideMemory(Level::AUTO, kGiB / 2, 8, 1, kLayers, Plan);
  ASSERT_FALSE(d.fits);
  EXPECT_THAT(d.reason, HasSubstr("Nothing within reach fits"));
}

// Optimizer offload's pinned host memory: refused with both figures when the host lacks it; a
// plan without offload (no host bytes) passes on any host.
// The plan as jobs report it: the parts in GiB, and where block gradients lie over spent
// activations, how much of the shards' memory the activations share.
TEST(DescribeGpuMemoryPlanTest, NamesThePartsAndTheSharedGradients) {
  GpuMemoryPlan plan;
  plan.state_bytes = size_t{3} << 30;
  plan.working_bytes = size_t{1} << 29;
  plan.activation_bytes = size_t{1} << 30;
  plan.reserve_bytes = size_t{3} << 29;
  EXPECT_EQ(DescribeGpuMemoryPlan(plan),
            "6.00 GiB (parameter/optimizer shards 3.00, gathered blocks and gradients 0.50, "
            "activations and gathered head 1.00, NCCL and runtime reserve 1.50)");
  plan.spent_activation_grad_bytes = size_t{1} << 30;
  EXPECT_EQ(DescribeGpuMemoryPlan(plan),
            "6.00 GiB (parameter/optimizer shards 3.00, gathered blocks and gradients 0.50, "
            "activations and gathered head 1.00 beyond the 1.00 of shard gradients they hold, "
            "NCCL and runtime reserve 1.50)");
}

TEST(CheckHostMemoryTest, RefusesOffloadThatTheHostCannotHold) {
  GpuMemoryPlan plan = Plan(Checkpointing::kNone, 8, 1);
  EXPECT_TRUE(CheckHostMemory(plan, 0, 1).ok());
  plan.host_bytes = 90 * kGiB;
  EXPECT_TRUE(CheckHostMemory(plan, 90 * kGiB, 1).ok());
  const absl::Status refused = CheckHostMemory(plan, 80 * kGiB, 2);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("optimizer.offload needs 90.00 GiB"));
  EXPECT_THAT(refused.message(), HasSubstr("world size 2"));
  EXPECT_THAT(refused.message(), HasSubstr("80.00 GiB available"));
}

// Ranks sharing a host pin as much each: four of 30 GiB need 120 of the host's 100.
TEST(CheckHostMemoryTest, CountsEveryRankOnTheHost) {
  GpuMemoryPlan plan = Plan(Checkpointing::kNone, 8, 1);
  plan.host_bytes = 30 * kGiB;
  EXPECT_TRUE(CheckHostMemory(plan, 100 * kGiB, 4, /*ranks_on_host=*/3).ok());
  const absl::Status refused = CheckHostMemory(plan, 100 * kGiB, 4, /*ranks_on_host=*/4);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("120.00 GiB for the job's 4 ranks on this host"));
  EXPECT_THAT(refused.message(), HasSubstr("100.00 GiB available"));
  EXPECT_TRUE(CheckHostMemory(plan, 30 * kGiB, 4, /*ranks_on_host=*/0).ok());  // unknown: 1
}

// Partial offload takes whole units from the end: a head of 10 and four blocks of 5.
const std::vector<size_t> kUnits = {10, 5, 5, 5, 5};

weft::v1::OptimizerSpec Offload(bool offload, double fraction) {
  weft::v1::OptimizerSpec optimizer;
  optimizer.set_offload(offload);
  optimizer.set_offload_fraction(fraction);
  return optimizer;
}

TEST(OffloadTest, FirstOffloadedUnitCoversTheFractionFromTheEnd) {
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(false, 0)), 5);  // none
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 0)), 0);   // unset: all
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 1)), 0);
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 0.1)), 4);       // 3 of 30: one block
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 1.0 / 3)), 3);   // exactly two blocks
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 0.34)), 2);
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 0.66)), 1);      // all four blocks
  EXPECT_EQ(FirstOffloadedUnit(kUnits, Offload(true, 0.7)), 0);       // the head too
}

// The fraction written back selects the same units: rounded down, with places enough.
TEST(OffloadTest, OffloadFractionForRoundTrips) {
  EXPECT_EQ(OffloadFractionFor(kUnits, 3), "0.33");
  EXPECT_EQ(OffloadFractionFor(kUnits, 4), "0.16");
  EXPECT_EQ(OffloadFractionFor(kUnits, 0), "1.00");
  const std::vector<size_t> tiny_last = {1, 1000, 1};  // 1 of 1002
  EXPECT_EQ(OffloadFractionFor(tiny_last, 2), "0.0009");
  for (const auto& units : {kUnits, tiny_last}) {
    for (int first = 0; first < static_cast<int>(units.size()); ++first) {
      const double f = std::stod(OffloadFractionFor(units, first));
      EXPECT_EQ(FirstOffloadedUnit(units, Offload(true, f)), first) << f;
    }
  }
}

// 16 bytes a kept parameter and 6 an offloaded one on the GPU (1 GiB "bytes" here), 13 on the
// host: the least offload that fits is named with both figures.
TEST(OffloadTest, OffloadThatFitsNamesTheLeastOffload) {
  const auto plan_at = [](int first) {
    GpuMemoryPlan plan;
    for (int u = 0; u < static_cast<int>(kUnits.size()); ++u) {
      plan.state_bytes += kUnits[u] * (u < first ? 16 : 6) * kGiB;
      if (u >= first) plan.host_bytes += kUnits[u] * 13 * kGiB;
    }
    return plan;
  };
  // No offload needs 480; two blocks offloaded 380, three 330.
  EXPECT_EQ(OffloadThatFits(kUnits, 5, 380 * kGiB, plan_at),
            "optimizer.offload: true with offload_fraction: 0.33 (380.00 GiB per GPU, plus "
            "130.00 GiB of pinned host memory), or optimizer.offload_auto: true instead");
  EXPECT_THAT(OffloadThatFits(kUnits, 5, 379 * kGiB, plan_at), HasSubstr("offload_fraction: 0.50"));
  // Already offloading two blocks: only more offload is offered.
  EXPECT_THAT(OffloadThatFits(kUnits, 3, 379 * kGiB, plan_at), HasSubstr("offload_fraction: 0.50"));
  EXPECT_THAT(OffloadThatFits(kUnits, 5, 180 * kGiB, plan_at), HasSubstr("offload_fraction: 1 "));
  EXPECT_EQ(OffloadThatFits(kUnits, 5, 179 * kGiB, plan_at), "");
  EXPECT_EQ(OffloadThatFits(kUnits, 0, 500 * kGiB, plan_at), "");  // nothing more to offload
}

// What offload_auto runs at: the largest first unit offloaded that fits, -1 for none.
TEST(OffloadTest, LeastOffloadThatFitsIsTheLargestFirstThatFits) {
  std::vector<int> asked;
  const auto plan_at = [&](int first) {
    asked.push_back(first);
    GpuMemoryPlan plan;
    for (int u = 0; u < static_cast<int>(kUnits.size()); ++u) {
      plan.state_bytes += kUnits[u] * (u < first ? 16 : 6) * kGiB;
    }
    return plan;
  };
  EXPECT_EQ(LeastOffloadThatFits(5, 380 * kGiB, plan_at), 3);  // two blocks: 380 GiB
  EXPECT_EQ(asked, (std::vector<int>{4, 3}));  // from the least offload up, stopping at a fit
  EXPECT_EQ(LeastOffloadThatFits(5, 379 * kGiB, plan_at), 2);
  EXPECT_EQ(LeastOffloadThatFits(5, 180 * kGiB, plan_at), 0);
  EXPECT_EQ(LeastOffloadThatFits(5, 179 * kGiB, plan_at), -1);
  EXPECT_EQ(LeastOffloadThatFits(0, 500 * kGiB, plan_at), -1);  // nothing more to offload
}

TEST(CheckHostMemoryTest, MemAvailableIsRead) {
  // This machine has /proc/meminfo: a real figure, not the unreadable-file fallback.
  const size_t available = HostAvailableBytes();
  EXPECT_GT(available, 0u);
  EXPECT_LT(available, SIZE_MAX);
}

// DecideCpuMemory against a made-up CPU planner: 40 GiB of sharded state (stages 1-2 add 20 GiB
// of full units, stage 0 keeps 60 GiB whatever the group), activations of 12, 8 and 4 GiB at
// NONE, SELECTIVE and FULL for 4 rows (proportional to the rows), and a 1 GiB reserve.
CpuMemoryPlan CpuPlan(Checkpointing level, int rows, int group, int stage) {
  CpuMemoryPlan plan;
  plan.state_bytes = stage == 0 ? 60 * kGiB : 40 * kGiB / group + (stage < 3 ? 20 * kGiB : 0);
  const size_t per_4_rows = level == Checkpointing::kNone        ? 12
                            : level == Checkpointing::kSelective ? 8
                                                                 : 4;
  plan.activation_bytes = per_4_rows * kGiB * rows / 4;
  plan.reserve_bytes = kGiB;
  return plan;
}

CpuMemoryDecision DecideCpu(Level::Level requested, size_t host_gib, int ranks_on_host = 1,
                            int stage = 3, bool hybrid = false) {
  return DecideCpuMemory(requested, host_gib * kGiB, ranks_on_host, /*micro_batch_size=*/4,
                         /*group=*/4, stage, hybrid, CpuPlan);
}

TEST(DecideCpuMemoryTest, AutoTakesTheLeastRecomputationThatFitsTheRanksShare) {
  // 10 GiB of state, 1 of reserve: NONE needs 23 GiB, SELECTIVE 19, FULL 15.
  CpuMemoryDecision d = DecideCpu(Level::AUTO, 60, /*ranks_on_host=*/2);
  ASSERT_TRUE(d.fits) << d.reason;
  EXPECT_EQ(d.level, Checkpointing::kNone);
  EXPECT_EQ(d.plan.total(), 23 * kGiB);
  EXPECT_THAT(d.reason, HasSubstr("activation checkpointing none (chosen by AUTO): 23.00 GiB"));
  // The host's two ranks share 40 GiB: 20 each.
  d = DecideCpu(Level::LEVEL_UNSPECIFIED, 40, /*ranks_on_host=*/2);
  ASSERT_TRUE(d.fits) << d.reason;
  EXPECT_EQ(d.level, Checkpointing::kSelective);
  EXPECT_THAT(d.reason, HasSubstr("selective (chosen by AUTO)"));
  EXPECT_THAT(d.reason, HasSubstr("none would need 23.00 GiB"));
  EXPECT_THAT(d.reason, HasSubstr("20.00 GiB available to each of the job's 2 ranks on this "
                                  "host (MemAvailable 40.00 GiB)"));
  // Exactly the need fits; a byte less does not.
  EXPECT_TRUE(DecideCpuMemory(Level::NONE, 23 * kGiB, 1, 4, 4, 3, false, CpuPlan).fits);
  EXPECT_FALSE(DecideCpuMemory(Level::NONE, 23 * kGiB - 1, 1, 4, 4, 3, false, CpuPlan).fits);
  // An unknown count of ranks on the host counts as one.
  EXPECT_TRUE(DecideCpuMemory(Level::NONE, 23 * kGiB, 0, 4, 4, 3, false, CpuPlan).fits);
}

TEST(DecideCpuMemoryTest, ARefusalNamesEveryPartTheBudgetAndWhatWouldFit) {
  const CpuMemoryDecision d = DecideCpu(Level::NONE, 16);
  ASSERT_FALSE(d.fits);
  EXPECT_EQ(d.plan.total(), 23 * kGiB);
  EXPECT_THAT(d.reason, HasSubstr("host memory: the job needs 23.00 GiB (parameter/optimizer "
                                  "state 10.00 GiB, gathered units and buffers 0.0 MiB, "
                                  "activations 12.00 GiB, checkpoint copy 0.0 MiB, "
                                  "communication and process reserve 1.00 GiB) per rank at "
                                  "ZeRO stage 3 over 4 ranks, micro_batch_size 4"));
  EXPECT_THAT(d.reason, HasSubstr("but 16.00 GiB available on this host (MemAvailable)"));
  EXPECT_THAT(d.reason, HasSubstr("training.activation_checkpointing: FULL (15.00 GiB)"));
  // 10 + 3 per row + 1: one row.
  EXPECT_THAT(d.reason, HasSubstr("training.micro_batch_size: 1 (14.00 GiB)"));
  // 40 / g + 13 <= 16 from g = 14.
  EXPECT_THAT(d.reason, HasSubstr("resources.min_workers: 14, the added workers on other hosts "
                                  "(15.86 GiB per rank)"));
  EXPECT_THAT(d.reason, Not(HasSubstr("zero_stage")));
  // With hybrid sharding the group is what grows.
  EXPECT_THAT(DecideCpu(Level::NONE, 16, 1, 3, /*hybrid=*/true).reason,
              HasSubstr("sharding groups of 14 ranks (15.86 GiB per rank)"));
}

TEST(DecideCpuMemoryTest, BelowStage3TheHintIsStage3) {
  // Stage 1: 10 + 20 of state, 4 of FULL's activations, 1 of reserve: 35 GiB. More ranks never
  // get below the 20 GiB of full units.
  const CpuMemoryDecision d = DecideCpu(Level::FULL, 24, 1, /*stage=*/1);
  ASSERT_FALSE(d.fits);
  EXPECT_THAT(d.reason, HasSubstr("ZeRO stage 1"));
  EXPECT_THAT(d.reason, HasSubstr("It would fit with zero_stage: 3 (15.00 GiB)."));
  EXPECT_THAT(d.reason, Not(HasSubstr("min_workers")));
}

TEST(DecideCpuMemoryTest, NothingWithinReach) {
  const CpuMemoryDecision d = DecideCpu(Level::AUTO, 8, 1, /*stage=*/0);
  ASSERT_FALSE(d.fits);
  EXPECT_EQ(d.level, Checkpointing::kFull);
  EXPECT_THAT(d.reason, HasSubstr("none would need 73.00 GiB, selective would need 69.00 GiB, "
                                  "full would need 65.00 GiB"));
  EXPECT_THAT(d.reason, HasSubstr("Nothing within reach fits"));
}

TEST(DescribeCpuMemoryPlanTest, SmallPartsReadInMiB) {
  CpuMemoryPlan plan;
  plan.state_bytes = 3 * kGiB;
  plan.working_bytes = 96 << 20;
  plan.activation_bytes = kGiB / 2;
  plan.checkpoint_bytes = kGiB;
  plan.reserve_bytes = 128 << 20;
  EXPECT_EQ(DescribeCpuMemoryPlan(plan),
            "4.72 GiB (parameter/optimizer state 3.00 GiB, gathered units and buffers 96.0 MiB, "
            "activations 512.0 MiB, checkpoint copy 1.00 GiB, communication and process reserve "
            "128.0 MiB)");
}

}  // namespace
}  // namespace weft::zero
