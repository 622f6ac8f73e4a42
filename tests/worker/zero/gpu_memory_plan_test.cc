// The GPU engine's buffer plan (worker/zero/gpu_memory_plan.h) at real model shapes, without a
// GPU. The pinned totals are what the plan gave before it moved out of zero_cuda.cc (printed
// then by PlanGpuMemoryAt), with the CUDA model's allocation each case was given then
// (engine::cuda::PlanCudaActivationBytes at that shape) passed in as a number: the move
// changed no byte. The invariants say how the buffers add up and share memory.
#include "worker/zero/gpu_memory_plan.h"

#include <cstddef>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/engine/model_arch.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/sharding_groups.h"
#include "worker/zero/zero_engine.h"

namespace weft::zero {
namespace {

using engine::Checkpointing;
using engine::CheckpointingPlan;
using Role = GpuBufferRole;
using Place = GpuBufferPlace;
using ::testing::HasSubstr;
using ::testing::Not;

weft::v1::JobSpec Spec(int layers, int hidden, int heads, int vocab, int padded, int context) {
  weft::v1::JobSpec spec;
  spec.set_name("gpu-plan");
  auto* m = spec.mutable_model();
  m->set_num_layers(layers);
  m->set_hidden_size(hidden);
  m->set_num_heads(heads);
  m->set_vocab_size(vocab);
  m->set_padded_vocab_size(padded);
  m->set_context_length(context);
  spec.mutable_training()->set_sequence_length(context);
  spec.mutable_training()->set_micro_batch_size(1);
  spec.mutable_training()->set_grad_accum_steps(1);
  spec.set_zero_stage(3);
  return spec;
}

weft::v1::JobSpec LlamaSpec(int layers, int hidden, int heads, int kv_heads, int intermediate,
                            int vocab, int context) {
  weft::v1::JobSpec spec = Spec(layers, hidden, heads, vocab, vocab, context);
  auto* m = spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_kv_heads(kv_heads);
  m->set_intermediate_size(intermediate);
  return spec;
}

weft::v1::JobSpec Gpt2Small() { return Spec(12, 768, 12, 50257, 50304, 1024); }
weft::v1::JobSpec Llama3_8B() { return LlamaSpec(32, 4096, 32, 8, 14336, 128256, 4096); }
weft::v1::JobSpec Llama2_13B() { return LlamaSpec(40, 5120, 40, 40, 13824, 32000, 4096); }
weft::v1::JobSpec CodeLlama34B() { return LlamaSpec(48, 8192, 64, 8, 22016, 32000, 4096); }

// The model's allocation, remembering what the plan asked the model to hold: a pinned number,
// or (kPlusRequests) a GiB of activations beyond the gradients asked for.
constexpr size_t kPlusRequests = 0;
struct FixedArena {
  size_t bytes = kPlusRequests;
  engine::cuda::ArenaRequests asked;
  ActivationBytesFn fn() {
    return [this](const CheckpointingPlan&, int, const engine::cuda::ArenaRequests& r) {
      asked = r;
      if (bytes != kPlusRequests) return bytes;
      size_t total = size_t{1} << 30;
      for (size_t b : r.spent_grad_bytes) total += b;
      return total;
    };
  }
};

struct Planned {
  GpuBufferPlan plan;
  engine::cuda::ArenaRequests asked;
  ShardLayout layout;
};

Planned Plan(const weft::v1::JobSpec& spec, const CheckpointingPlan& level, int rows, int world,
             size_t arena_bytes = kPlusRequests, const ZeroCudaOptions& options = {}) {
  auto arch = engine::MakeModelArch(spec.model());
  EXPECT_TRUE(arch.ok()) << arch.status();
  FixedArena arena{arena_bytes};
  const int first = FirstOffloadedUnit(UnitSizes(**arch), spec.optimizer());
  GpuBufferPlan plan =
      PlanGpuBuffers(spec, **arch, level, rows, world, first, arena.fn(), options);
  return {std::move(plan), arena.asked,
          ShardLayout(UnitSizes(**arch), world, 0, ReplicaPieces(options.replicas, 0))};
}

// What today's code planned, and the model allocation it was given.
struct Pinned {
  std::string name;
  weft::v1::JobSpec spec;
  CheckpointingPlan level;
  int rows = 1;
  int world = 1;
  ZeroCudaOptions options;
  size_t arena = 0;  // PlanCudaActivationBytes at this shape, the requests included
  size_t state = 0, working = 0, host = 0, spent = 0, activation = 0, total = 0;
};

std::vector<Pinned> PinnedCases() {
  weft::v1::JobSpec gpt2_accum = Gpt2Small();
  gpt2_accum.mutable_training()->set_grad_accum_steps(2);
  weft::v1::JobSpec llama8b_accum = Llama3_8B();
  llama8b_accum.mutable_training()->set_grad_accum_steps(4);
  weft::v1::JobSpec llama13b = Llama2_13B();
  llama13b.mutable_optimizer()->set_offload(true);
  weft::v1::JobSpec llama13b_half = llama13b;
  llama13b_half.mutable_optimizer()->set_offload_fraction(0.5);
  ZeroCudaOptions two_slots;
  two_slots.one_block_grad_slot = false;
  const Checkpointing kNone = Checkpointing::kNone, kSel = Checkpointing::kSelective,
                      kFull = Checkpointing::kFull;
  // name, spec, level, rows, world, options, arena,
  //   state, working, host, spent, activation, total
  // (working and total: 4 bytes more since the stats also carry the count of the targets)
  return {
      {"gpt2 w1 16x1024 none", Gpt2Small(), kNone, 16, 1, {}, 5609751552,
       1991614464, 28359684, 0, 340217856, 5269533696, 8900120580},
      {"gpt2 w1 16x1024 full", Gpt2Small(), kFull, 16, 1, {}, 1430566912,
       1991614464, 28359684, 0, 340217856, 1090349056, 4720935940},
      {"gpt2 w1 16x1024 none accum 2", gpt2_accum, kNone, 16, 1, {}, 5606696960,
       1991614464, 28359684, 0, 0, 5606696960, 9237283844},
      {"gpt2 w2 16x1024 full", Gpt2Small(), kFull, 16, 2, {}, 1429170176,
       995807232, 253154308, 0, 170108928, 1259061248, 4118635524},
      {"llama3-8b w1 1x4096 full", Llama3_8B(), kFull, 1, 1, {}, 28567457536,
       128484179968, 872456196, 0, 27918336000, 649121536, 131616370436},
      {"llama3-8b w2 2x4096 full", Llama3_8B(), kFull, 2, 2, {}, 15217548544,
       64242089984, 3040927748, 0, 13959168000, 1258380544, 70152011012},
      {"llama3-8b w2 2x4096 none", Llama3_8B(), kNone, 2, 2, {}, 38682817792,
       64242089984, 4785823748, 0, 13959168000, 24723649792, 95362176260},
      {"llama3-8b w2 2x4096 selective", Llama3_8B(), kSel, 2, 2, {}, 25160381696,
       64242089984, 3040927748, 0, 13959168000, 11201213696, 80094844164},
      {"llama3-8b w2 2x4096 full, 31 blocks selective", Llama3_8B(), {kFull, 31}, 2, 2, {},
       24991759616, 64242089984, 3040927748, 0, 13959168000, 11032591616, 79926222084},
      {"llama3-8b w2 2x4096 full two slots", Llama3_8B(), kFull, 2, 2, two_slots, 15217548544,
       64242089984, 3040927748, 0, 13959168000, 1258380544, 70152011012},
      {"llama3-8b w2 1x4096 full accum 4", llama8b_accum, kFull, 1, 2, {}, 2857938688,
       64242089984, 3040927748, 0, 0, 2857938688, 71751569156},
      {"llama2-13b w1 1x4096 full offload", llama13b, kFull, 1, 1, {}, 51514793728,
       78095185920, 1268826116, 173138457600, 50752716800, 762076928, 81736701700},
      {"llama2-13b w2 1x4096 full offload", llama13b, kFull, 1, 2, {}, 26138435328,
       39047592960, 2638307332, 86569228800, 25376358400, 762076928, 44058589956},
      {"llama2-13b w2 1x4096 full offload 0.5", llama13b_half, kFull, 1, 2, {}, 26138435328,
       70820444160, 2638307332, 45201638400, 25376358400, 762076928, 75831441156},
      {"codellama-34b w4 1x4096 full", CodeLlama34B(), kFull, 1, 4, {}, 34297548544,
       134975881216, 5603729412, 0, 33219674112, 1077874432, 143268097796},
      {"codellama-34b w4 1x4096 selective", CodeLlama34B(), kSel, 1, 4, {}, 34297548544,
       134975881216, 8372035588, 0, 33219674112, 1077874432, 146036403972},
  };
}

// Every part of the plan is what the engine planned before the plan moved here.
TEST(GpuMemoryPlan, RealShapesPlanWhatTheyPlannedBefore) {
  for (const Pinned& c : PinnedCases()) {
    SCOPED_TRACE(c.name);
    const Planned p = Plan(c.spec, c.level, c.rows, c.world, c.arena, c.options);
    const GpuMemoryPlan& t = p.plan.totals;
    EXPECT_EQ(t.state_bytes, c.state);
    EXPECT_EQ(t.working_bytes, c.working);
    EXPECT_EQ(t.host_bytes, c.host);
    EXPECT_EQ(t.reserve_bytes, size_t{3} << 29);
    EXPECT_EQ(t.spent_activation_grad_bytes, c.spent);
    EXPECT_EQ(t.activation_bytes, c.activation);
    EXPECT_EQ(t.total(), c.total);
  }
}

// The totals are the list's sums, part by part; the arena's gradients count once (as state).
TEST(GpuMemoryPlan, TotalsAreTheSumsOfTheBuffers) {
  for (const Pinned& c : PinnedCases()) {
    SCOPED_TRACE(c.name);
    const Planned p = Plan(c.spec, c.level, c.rows, c.world, c.arena, c.options);
    std::map<GpuPlanPart, size_t> sums;
    size_t in_arena_state = 0, device = 0;
    for (const GpuBuffer& b : p.plan.buffers) {
      sums[b.part] += b.bytes();
      if (b.place == Place::kInArena && b.part == GpuPlanPart::kState) in_arena_state += b.bytes();
      if (b.place == Place::kDevice) device += b.bytes();
    }
    const GpuMemoryPlan& t = p.plan.totals;
    EXPECT_EQ(t.state_bytes, sums[GpuPlanPart::kState]);
    EXPECT_EQ(t.working_bytes, sums[GpuPlanPart::kWorking]);
    EXPECT_EQ(t.host_bytes, sums[GpuPlanPart::kHost]);
    EXPECT_EQ(t.spent_activation_grad_bytes, in_arena_state);
    EXPECT_EQ(t.activation_bytes + in_arena_state, c.arena);
    EXPECT_EQ(sums[GpuPlanPart::kActivations], c.arena);
    // What the engine cudaMallocs is the state and working memory less what lies in the
    // arena and the small buffers' rounding.
    const GpuBuffer* rounding = p.plan.Find(Role::kSmallBufferRounding);
    ASSERT_NE(rounding, nullptr);
    EXPECT_EQ(device, t.state_bytes - in_arena_state + t.working_bytes - rounding->bytes());
    // The model is asked to hold exactly the in-arena buffers.
    size_t asked = 0;
    for (size_t bytes : p.asked.spent_grad_bytes) asked += bytes;
    EXPECT_EQ(asked, in_arena_state);
    EXPECT_EQ(p.asked.head_work_elements, p.plan.Find(Role::kHeadWork)->elements);
    EXPECT_EQ(p.asked.spent_grad_bytes, p.plan.arena_requests.spent_grad_bytes);
  }
}

// Each buffer once: a role appears at most once per unit or slot.
TEST(GpuMemoryPlan, EveryBufferIsListedOnce) {
  for (const Pinned& c : PinnedCases()) {
    SCOPED_TRACE(c.name);
    const Planned p = Plan(c.spec, c.level, c.rows, c.world, c.arena, c.options);
    std::map<std::string, int> seen;
    for (const GpuBuffer& b : p.plan.buffers) ++seen[GpuBufferName(b)];
    for (const auto& [name, count] : seen) EXPECT_EQ(count, 1) << name;
    EXPECT_EQ(p.plan.buffers.front().role, Role::kModelArena);
  }
}

// A compressed replica all-reduce plans its send and receive buffers, each the largest
// shard's encoding over the replicas; fp32 (NCCL's all-reduce in place) and one replica plan
// none.
TEST(GpuMemoryPlan, ACompressedReplicaAllReducePlansItsWireBuffers) {
  weft::v1::JobSpec spec = Llama3_8B();
  const CheckpointingPlan full(Checkpointing::kFull);
  ZeroCudaOptions two;
  two.replicas = 2;
  EXPECT_EQ(Plan(spec, full, 1, 8, kPlusRequests, two).plan.Find(Role::kWireSend), nullptr);
  for (const auto& [format, bytes_per_value] :
       {std::pair{weft::v1::ShardingSpec::WIRE_BF16, 2.0},
        std::pair{weft::v1::ShardingSpec::WIRE_INT8, 1.0 + 4.0 / 256}}) {
    spec.mutable_sharding()->set_replica_reduce_format(format);
    EXPECT_EQ(Plan(spec, full, 1, 8).plan.Find(Role::kWireSend), nullptr) << "one replica";
    const Planned p = Plan(spec, full, 1, 8, kPlusRequests, two);
    const GpuBuffer* send = p.plan.Find(Role::kWireSend);
    const GpuBuffer* recv = p.plan.Find(Role::kWireRecv);
    ASSERT_NE(send, nullptr);
    ASSERT_NE(recv, nullptr);
    EXPECT_EQ(send->bytes(), recv->bytes());
    // The largest shard (the embedding's, 128256 x 4096 / 8) encoded, plus at most a block of
    // padding per replica.
    const double encoded = static_cast<double>(p.layout.max_shard()) * bytes_per_value;
    EXPECT_GE(static_cast<double>(send->bytes()), encoded);
    EXPECT_LE(static_cast<double>(send->bytes()), encoded + 2 * 256 * bytes_per_value + 8);
    EXPECT_EQ(send->place, GpuBufferPlace::kDevice);
    EXPECT_EQ(send->part, GpuPlanPart::kWorking);
  }
}

// replica_optimizer OPTIMIZER_SHARDED: m and v of a rank's piece only (a replica's share of its
// shard), the master and gradient whole; 12 bytes a parameter instead of 16 at two replicas.
TEST(GpuMemoryPlan, AShardedOptimizerKeepsTheMomentsOfTheRanksPiece) {
  weft::v1::JobSpec spec = Llama3_8B();
  const CheckpointingPlan full(Checkpointing::kFull);
  ZeroCudaOptions two;
  two.replicas = 2;
  const Planned replicated = Plan(spec, full, 1, 1, kPlusRequests, two);
  spec.mutable_sharding()->set_replica_optimizer(weft::v1::ShardingSpec::OPTIMIZER_SHARDED);
  const Planned sharded = Plan(spec, full, 1, 1, kPlusRequests, two);
  for (int u = 0; u < sharded.layout.num_units(); ++u) {
    const UnitShard& unit = sharded.layout.unit(u);
    for (Role role : {Role::kM, Role::kV}) {
      const GpuBuffer* b = sharded.plan.Find(role, u);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->elements, unit.piece) << u;
      EXPECT_EQ(replicated.plan.Find(role, u)->elements, unit.shard) << u;
    }
    EXPECT_EQ(sharded.plan.Find(Role::kParams, u)->elements, unit.shard);
    EXPECT_EQ(sharded.plan.Find(Role::kGrads, u)->elements, unit.shard);
  }
  size_t moments_saved = 0;
  for (int u = 0; u < sharded.layout.num_units(); ++u) {
    moments_saved += 2 * (sharded.layout.unit(u).shard - sharded.layout.unit(u).piece) * 4;
  }
  EXPECT_EQ(sharded.plan.totals.state_bytes + moments_saved, replicated.plan.totals.state_bytes);
  // About a quarter of the 8B's 128 GB of state: 32 GB.
  EXPECT_GT(moments_saved, size_t{30} * 1000 * 1000 * 1000);
  // One replica: nothing to share out.
  const Planned alone = Plan(spec, full, 1, 1);
  EXPECT_EQ(alone.plan.Find(Role::kM, 1)->elements, alone.layout.unit(1).shard);
}

// Beyond world 1 the head's fp32 gradient and the block slots' share one buffer where the last
// block recomputes (FULL, SELECTIVE), and the two slots are one at uniform FULL; without
// recomputation all three are apart. At world 1 there is no such buffer.
TEST(GpuMemoryPlan, TheHeadAndTheSlotsShareTheGradientBufferAsTheLevelAllows) {
  const weft::v1::JobSpec spec = Llama3_8B();
  const Planned none = Plan(spec, Checkpointing::kNone, 2, 2);
  const size_t block = none.layout.max_block_padded();
  const size_t head = none.plan.Find(Role::kHeadWork)->elements;
  ASSERT_GT(head, 2 * block);  // Llama-8B: the LM head's piece is the larger
  EXPECT_FALSE(none.plan.head_grad_takes_turns);
  EXPECT_FALSE(none.plan.one_block_grad_slot);
  EXPECT_EQ(none.plan.block_grad_offset[0], head);
  EXPECT_EQ(none.plan.block_grad_offset[1], head + block);
  EXPECT_EQ(none.plan.Find(Role::kGradBuffer)->elements, head + 2 * block);

  const Planned full = Plan(spec, Checkpointing::kFull, 2, 2);
  EXPECT_TRUE(full.plan.head_grad_takes_turns);
  EXPECT_TRUE(full.plan.one_block_grad_slot);
  EXPECT_EQ(full.plan.block_grad_offset[0], 0u);
  EXPECT_EQ(full.plan.block_grad_offset[1], 0u);
  EXPECT_EQ(full.plan.Find(Role::kGradBuffer)->elements, head);

  ZeroCudaOptions two_slots;  // the saving turned off
  two_slots.one_block_grad_slot = false;
  const Planned full_two = Plan(spec, Checkpointing::kFull, 2, 2, kPlusRequests, two_slots);
  EXPECT_TRUE(full_two.plan.head_grad_takes_turns);
  EXPECT_FALSE(full_two.plan.one_block_grad_slot);
  EXPECT_EQ(full_two.plan.block_grad_offset[1], block);

  const Planned selective = Plan(spec, Checkpointing::kSelective, 2, 2);
  EXPECT_TRUE(selective.plan.head_grad_takes_turns);
  EXPECT_FALSE(selective.plan.one_block_grad_slot);
  EXPECT_EQ(selective.plan.block_grad_offset[0], 0u);
  EXPECT_EQ(selective.plan.block_grad_offset[1], block);

  // Only the last block decides whether the head takes turns; a lighter block keeps two slots.
  const Planned lighter_first = Plan(spec, CheckpointingPlan(Checkpointing::kFull, 31), 2, 2);
  EXPECT_TRUE(lighter_first.plan.head_grad_takes_turns);
  EXPECT_FALSE(lighter_first.plan.one_block_grad_slot);
  const Planned lighter_last =
      Plan(spec, CheckpointingPlan(Checkpointing::kSelective, 31, 32), 2, 2);
  EXPECT_FALSE(lighter_last.plan.head_grad_takes_turns);

  // A GPT-2 head (tied, one piece) is larger than two blocks too, and takes turns alike.
  const Planned gpt2 = Plan(Gpt2Small(), Checkpointing::kFull, 16, 2);
  EXPECT_TRUE(gpt2.plan.head_grad_takes_turns);
  EXPECT_EQ(gpt2.plan.Find(Role::kGradBuffer)->elements,
            std::max(gpt2.plan.Find(Role::kHeadWork)->elements,
                     gpt2.layout.max_block_padded()));

  for (Checkpointing level : {Checkpointing::kNone, Checkpointing::kFull}) {
    EXPECT_EQ(Plan(spec, level, 1, 1).plan.Find(Role::kGradBuffer), nullptr);
  }
}

// Offload moves the offloaded units' master, m and v (and a decay mask) to pinned host memory;
// the device keeps their gradient and a bf16 copy; two staging pairs of the largest offloaded
// shard; beyond world 1 GatherUnit gets a device source buffer. The units kept on the GPU
// keep all four there.
TEST(GpuMemoryPlan, OffloadMovesParamsMomentsAndMaskToTheHost) {
  weft::v1::JobSpec spec = Llama2_13B();
  spec.mutable_optimizer()->set_offload(true);
  spec.mutable_optimizer()->set_offload_fraction(0.5);
  const Planned p = Plan(spec, Checkpointing::kFull, 1, 2);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  const int first = FirstOffloadedUnit(UnitSizes(**arch), spec.optimizer());
  ASSERT_GT(first, 0);
  ASSERT_LT(first, p.layout.num_units());
  size_t max_offloaded = 0;
  for (int u = 0; u < p.layout.num_units(); ++u) {
    SCOPED_TRACE(absl::StrCat("unit ", u));
    const bool offloaded = u >= first;
    const size_t shard = p.layout.unit(u).shard;
    if (offloaded) max_offloaded = std::max(max_offloaded, shard);
    for (Role role : {Role::kParams, Role::kM, Role::kV}) {
      const GpuBuffer* b = p.plan.Find(role, u);
      ASSERT_NE(b, nullptr);
      EXPECT_EQ(b->place, offloaded ? Place::kPinnedHost : Place::kDevice);
      EXPECT_EQ(b->part, offloaded ? GpuPlanPart::kHost : GpuPlanPart::kState);
      EXPECT_EQ(b->bytes(), shard * 4);
    }
    const GpuBuffer* grads = p.plan.Find(Role::kGrads, u);
    ASSERT_NE(grads, nullptr);
    EXPECT_EQ(grads->part, GpuPlanPart::kState);
    EXPECT_EQ(grads->place, u > 0 ? Place::kInArena : Place::kDevice);
    const GpuBuffer* mask = p.plan.Find(Role::kHostDecayMask, u);
    const GpuBuffer* bf16 = p.plan.Find(Role::kParamsBf16, u);
    EXPECT_EQ(mask != nullptr, offloaded);
    EXPECT_EQ(bf16 != nullptr, offloaded);
    if (offloaded) {
      EXPECT_EQ(mask->place, Place::kPinnedHost);
      EXPECT_EQ(mask->bytes(), shard);
      EXPECT_EQ(bf16->place, Place::kDevice);
      EXPECT_EQ(bf16->bytes(), shard * 2);
    }
  }
  for (int slot : {0, 1}) {
    EXPECT_EQ(p.plan.Find(Role::kStagingGrads, slot)->bytes(), max_offloaded * 4);
    EXPECT_EQ(p.plan.Find(Role::kStagingBf16, slot)->bytes(), max_offloaded * 2);
  }
  EXPECT_NE(p.plan.Find(Role::kGatherSource), nullptr);

  const Planned kept = Plan(Llama2_13B(), Checkpointing::kFull, 1, 2);
  EXPECT_EQ(kept.plan.totals.host_bytes, 0u);
  for (const GpuBuffer& b : kept.plan.buffers) {
    EXPECT_TRUE(b.place != Place::kPinnedHost || b.role == Role::kHostStats)
        << GpuBufferName(b);
  }
  EXPECT_EQ(kept.plan.Find(Role::kGatherSource), nullptr);
}

// Without gradient accumulation the blocks' shard gradients lie in the model's arena (and the
// model is asked for room for each); with it, or with the saving turned off, on the device.
TEST(GpuMemoryPlan, BlockGradientsLieInTheArenaOnlyWithoutAccumulation) {
  ZeroCudaOptions apart;
  apart.gradients_over_spent_activations = false;
  weft::v1::JobSpec accumulating = Llama3_8B();
  accumulating.mutable_training()->set_grad_accum_steps(2);
  for (const auto& [spec, options, in_arena] :
       {std::tuple{Llama3_8B(), ZeroCudaOptions{}, true}, std::tuple{Llama3_8B(), apart, false},
        std::tuple{accumulating, ZeroCudaOptions{}, false}}) {
    SCOPED_TRACE(absl::StrCat("in arena ", in_arena));
    const Planned p = Plan(spec, Checkpointing::kFull, 1, 2, kPlusRequests, options);
    EXPECT_EQ(p.asked.spent_grad_bytes.size(),
              in_arena ? static_cast<size_t>(p.layout.num_units() - 1) : 0u);
    for (int u = 0; u < p.layout.num_units(); ++u) {
      const GpuBuffer* grads = p.plan.Find(Role::kGrads, u);
      ASSERT_NE(grads, nullptr);
      EXPECT_EQ(grads->place, in_arena && u > 0 ? Place::kInArena : Place::kDevice) << u;
      if (in_arena && u > 0) {
        EXPECT_EQ(p.asked.spent_grad_bytes[u - 1], grads->bytes());
      }
    }
  }
}

// The untied Llama head with a 128k vocabulary and the same model tied, at few layers.
struct Llama128kHeads {
  explicit Llama128kHeads(int layers) : untied(LlamaSpec(layers, 4096, 32, 8, 14336, 128256, 64)) {
    tied = untied;
    tied.mutable_model()->set_tie_word_embeddings(true);
  }
  weft::v1::JobSpec untied, tied;
};

// An untied head's two pieces take turns in the head buffers, so it needs no more working
// memory than a tied one, while its shards hold the LM head: 16 bytes a parameter over the
// world. (Moved from zero_cuda_test: it needs no GPU.)
TEST(GpuMemoryPlan, AnUntiedHeadTakesTurnsInTheHeadBuffers) {
  for (int world : {2, 8}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    const Llama128kHeads heads(2);
    // Without recomputation, where the head's gradient has a buffer of its own.
    const GpuMemoryPlan a = Plan(heads.untied, Checkpointing::kNone, 1, world).plan.totals;
    const GpuMemoryPlan b = Plan(heads.tied, Checkpointing::kNone, 1, world).plan.totals;
    EXPECT_GE(a.working_bytes, b.working_bytes);
    EXPECT_LT(a.working_bytes - b.working_bytes, size_t{16} << 20);
    const size_t lm_head = size_t{128256} * 4096;
    EXPECT_NEAR(static_cast<double>(a.state_bytes - b.state_bytes),
                16.0 * lm_head / world, 16.0 * world);
  }
}

// A plan that recomputes the last block keeps the head's fp32 gradient (an untied head's
// larger piece, a tied head's unit) and the block slots' in one buffer: the Llama-8B shape
// saves the smaller of the two, 2 x 218M floats (1.63 GiB), beyond world 1; a plan that
// recomputes nothing and world 1 (no such buffers) save nothing. (Moved from zero_cuda_test.)
TEST(GpuMemoryPlan, ARecomputingPlanLetsTheHeadGradientTakeTurnsWithTheBlocks) {
  const Llama128kHeads heads(32);
  const auto working = [](const weft::v1::JobSpec& spec, const CheckpointingPlan& level,
                          int world) {
    return Plan(spec, level, 1, world).plan.totals.working_bytes;
  };
  for (int world : {2, 8}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    const size_t blocks = 2 * Plan(heads.untied, Checkpointing::kNone, 1, world)
                                  .layout.max_block_padded();
    ASSERT_LT(blocks, size_t{128256} * 4096);  // the head's piece is the larger
    const size_t none = working(heads.untied, Checkpointing::kNone, world);
    for (const CheckpointingPlan& level :
         {CheckpointingPlan(Checkpointing::kFull), CheckpointingPlan(Checkpointing::kSelective),
          CheckpointingPlan(Checkpointing::kFull, 31)}) {
      EXPECT_EQ(none - working(heads.untied, level, world), blocks * sizeof(float))
          << engine::DescribeCheckpointing(level);
    }
    // Only block 31 decides: every block lighter is no recomputation at the last block.
    EXPECT_EQ(working(heads.untied, {Checkpointing::kSelective, 32}, world), none);
    // A tied head's one gradient takes turns as well (reduced twice).
    EXPECT_EQ(working(heads.tied, Checkpointing::kNone, world) -
                  working(heads.tied, Checkpointing::kFull, world),
              blocks * sizeof(float));
  }
  EXPECT_EQ(working(heads.untied, Checkpointing::kFull, 1),
            working(heads.untied, Checkpointing::kNone, 1));
}

// DecideGpuMemory with optimizer.offload_auto: a job that fits keeps the optimizer on the GPU;
// one that does not offloads the least run of last units that fits, and says so; a host
// without the pinned memory for it refuses with the host's figures.
TEST(GpuMemoryPlan, OffloadAutoTakesTheLeastOffloadThatFits) {
  weft::v1::JobSpec spec = Llama2_13B();
  spec.mutable_optimizer()->set_offload_auto(true);
  spec.mutable_training()->set_activation_checkpointing(weft::v1::ActivationCheckpointing::FULL);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  FixedArena arena;
  const size_t kHostPlenty = size_t{1} << 50;
  const GpuMemoryDecision roomy =
      DecideGpuMemory(spec, **arch, 1, size_t{1} << 50, kHostPlenty, 1, arena.fn());
  ASSERT_TRUE(roomy.fits.ok()) << roomy.fits;
  EXPECT_EQ(roomy.first_offloaded, 41);
  EXPECT_THAT(roomy.note, HasSubstr("optimizer kept on the GPU (optimizer.offload_auto"));

  const size_t budget = size_t{80} << 30;
  const GpuMemoryDecision tight =
      DecideGpuMemory(spec, **arch, 1, budget, kHostPlenty, 1, arena.fn());
  ASSERT_TRUE(tight.fits.ok()) << tight.fits;
  EXPECT_TRUE(tight.auto_offloaded);
  ASSERT_GT(tight.first_offloaded, 0);
  ASSERT_LT(tight.first_offloaded, 41);
  EXPECT_LE(tight.memory.plan.total(), budget);
  // The engine allocates the buffers of exactly the plan decided on.
  EXPECT_EQ(tight.buffers.totals.total(), tight.memory.plan.total());
  EXPECT_EQ(tight.buffers.totals.host_bytes, tight.memory.plan.host_bytes);
  EXPECT_EQ(tight.buffers.Find(GpuBufferRole::kHostDecayMask, tight.first_offloaded - 1),
            nullptr);
  EXPECT_NE(tight.buffers.Find(GpuBufferRole::kHostDecayMask, tight.first_offloaded), nullptr);
  const auto total_at = [&](int first) {
    return PlanGpuBuffers(spec, **arch, Checkpointing::kFull, 1, 1, first, arena.fn())
        .totals.total();
  };
  EXPECT_GT(total_at(tight.first_offloaded + 1), budget);  // one unit less does not fit
  EXPECT_THAT(tight.note, HasSubstr(absl::StrCat("optimizer offloaded to the host for units ",
                                                 tight.first_offloaded, "-40 of 0-40")));
  EXPECT_THAT(tight.note, HasSubstr("the least that fits (optimizer.offload_auto)"));

  const GpuMemoryDecision no_host =
      DecideGpuMemory(spec, **arch, 1, budget, size_t{1} << 30, 1, arena.fn());
  EXPECT_EQ(no_host.fits.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(no_host.fits.message(), HasSubstr("pinned host memory"));

  // The job's device memory limit binds where it is below the free memory, and the reason
  // says so: the same offload as with that much free.
  spec.mutable_training()->set_device_memory_limit_gib(80);
  const GpuMemoryDecision limited =
      DecideGpuMemory(spec, **arch, 1, size_t{1} << 50, kHostPlenty, 1, arena.fn());
  ASSERT_TRUE(limited.fits.ok()) << limited.fits;
  EXPECT_EQ(limited.first_offloaded, tight.first_offloaded);
  EXPECT_THAT(limited.note, HasSubstr("allowed by training.device_memory_limit_gib"));
  EXPECT_THAT(tight.note, Not(HasSubstr("device_memory_limit_gib")));
}

}  // namespace
}  // namespace weft::zero
