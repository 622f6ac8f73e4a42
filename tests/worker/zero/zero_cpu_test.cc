// ZeRO equivalence: the same spec (GPT-2 and Llama) trained on 1, 2 and 4 ranks (threads of
// this process, real Gloo over loopback) at stages 0, 2 and 3 follows the unsharded
// single-process reference that reads the same global batch; each rank holds about 1/N of
// the state; every activation checkpointing level trains as NONE does, bit for bit; and hybrid
// sharding (groups of S ranks, replicated) trains like full sharding over the same world.
#include "worker/zero/zero_cpu.h"

#include <malloc.h>

#include <cmath>
#include <functional>
#include <map>
#include <cstdio>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "coordinator/memory_store.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/skipped_step_expect.h"
#include "worker/comm/communicator.h"

namespace weft::zero {
namespace {

constexpr int kSteps = 24;
constexpr int kBatchPerRank = 2;

weft::v1::JobSpec TinySpec(int stage, int batch, weft::v1::Architecture arch = weft::v1::GPT2,
                           weft::v1::ActivationCheckpointing::Level checkpointing =
                               weft::v1::ActivationCheckpointing::AUTO) {
  weft::v1::JobSpec spec;
  spec.set_name("zero");
  auto* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(32);
  m->set_num_heads(4);
  m->set_vocab_size(61);  // not a multiple of anything: exercises padding everywhere
  m->set_padded_vocab_size(64);
  m->set_context_length(16);
  if (arch == weft::v1::LLAMA) {
    m->set_architecture(weft::v1::LLAMA);
    m->set_num_kv_heads(2);  // grouped-query attention
    m->set_intermediate_size(48);
    m->set_tie_word_embeddings(false);
  }
  auto* t = spec.mutable_training();
  t->set_total_steps(kSteps);
  t->set_micro_batch_size(batch);
  t->set_sequence_length(16);
  t->set_grad_accum_steps(2);
  t->set_seed(7);
  t->set_activation_checkpointing(checkpointing);
  auto* o = spec.mutable_optimizer();
  o->set_learning_rate(3e-3);
  spec.mutable_lr_schedule()->set_kind(weft::v1::LrSchedule::COSINE);
  spec.mutable_lr_schedule()->set_warmup_steps(4);
  spec.mutable_lr_schedule()->set_min_lr_ratio(0.1);
  spec.set_zero_stage(stage);
  ApplyJobSpecDefaults(&spec);  // AdamW betas, epsilon, decay 0.1, clip 1.0
  return spec;
}

// A learnable sequence family: token t of global sequence g at (step, micro) is a function of
// those alone, so any split of the global batch over ranks reads the same tokens.
uint32_t Token(int64_t step, int micro, int g, int t) {
  const uint32_t start = static_cast<uint32_t>((step * 7919 + micro * 104729 + g * 1299709) % 61);
  const uint32_t stride = 1 + static_cast<uint32_t>(g % 3);
  return (start + stride * static_cast<uint32_t>(t)) % 61;
}

BatchFn GlobalBatch(int rank, int batch) {
  return [rank, batch](int64_t step, int micro, const MicroBatch& mb) {
    for (int b = 0; b < batch; ++b) {
      const int g = rank * batch + b;
      for (int t = 0; t < 16; ++t) {
        mb.inputs[b * 16 + t] = static_cast<int32_t>(Token(step, micro, g, t));
        mb.targets[b * 16 + t] = static_cast<int32_t>(Token(step, micro, g, t + 1));
      }
    }
  };
}

struct RunResult {
  std::vector<float> losses;          // rank 0's view of the global loss per step
  std::vector<size_t> state_bytes;    // per rank
  std::vector<size_t> working_bytes;  // per rank
  std::vector<std::vector<float>> params;  // final, gathered
};

// Batches with loss masks and packed documents, as a chat dataset gives: global row g ignores
// the targets where (g * 7 + t * 3 + micro) % 5 < 2 (row 1 all of them, so ranks count
// different numbers of targets), and holds documents starting at 0, 5 and 11.
BatchFn MaskedBatch(int rank, int batch) {
  return [rank, batch](int64_t step, int micro, const MicroBatch& mb) {
    GlobalBatch(rank, batch)(step, micro, mb);
    for (int b = 0; b < batch; ++b) {
      const int g = rank * batch + b;
      for (int t = 0; t < 16; ++t) {
        if (g == 1 || (g * 7 + t * 3 + micro) % 5 < 2) mb.targets[b * 16 + t] = -1;
        if (mb.doc_starts != nullptr) mb.doc_starts[b * 16 + t] = t < 5 ? 0 : t < 11 ? 5 : 11;
      }
    }
  };
}

RunResult Train(int world, int stage, int batch_per_rank,
                weft::v1::Architecture arch = weft::v1::GPT2,
                weft::v1::ActivationCheckpointing::Level checkpointing =
                    weft::v1::ActivationCheckpointing::AUTO,
                int steps = kSteps, bool masked = false) {
  MemoryStore store;
  RunResult result;
  result.state_bytes.resize(world);
  result.working_bytes.resize(world);
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      comm::GlooOptions options;
      options.timeout_ms = 20000;
      auto c = comm::CreateGlooCommunicator(&store, rank, world, options);
      if (!c.ok()) {
        errors[rank] = c.status();
        return;
      }
      weft::v1::JobSpec spec = TinySpec(stage, batch_per_rank, arch, checkpointing);
      spec.mutable_data()->set_document_masking(masked);
      spec.mutable_data()->set_reset_positions(masked);
      auto engine = ZeroCpuEngine::Create(spec, c->get());
      if (!engine.ok()) {
        errors[rank] = engine.status();
        return;
      }
      result.state_bytes[rank] = (*engine)->StateBytes();
      result.working_bytes[rank] = (*engine)->WorkingBytes();
      const BatchFn batch =
          masked ? MaskedBatch(rank, batch_per_rank) : GlobalBatch(rank, batch_per_rank);
      for (int step = 0; step < steps; ++step) {
        auto r = (*engine)->TrainStep(step, batch);
        if (!r.ok()) {
          errors[rank] = r.status();
          return;
        }
        if (rank == 0) result.losses.push_back(r->loss);
      }
      auto params = (*engine)->GatherParameters();
      if (!params.ok()) {
        errors[rank] = params.status();
        return;
      }
      if (rank == 0) result.params = std::move(*params);
      // No rank closes its sockets while a peer may still be receiving (see GenerationRun).
      errors[rank] = (*c)->Barrier()->Wait();
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_TRUE(errors[rank].ok()) << "rank " << rank << ": " << errors[rank];
  }
  return result;
}

double MaxRelativeDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) /
                                std::max(1e-6, std::abs(static_cast<double>(b[i]))));
  }
  return worst;
}

double MaxDiffOverScale(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / std::max(scale, 1e-12);
}

class ZeroEquivalenceTest
    : public ::testing::TestWithParam<std::tuple<weft::v1::Architecture, int, int>> {};

TEST_P(ZeroEquivalenceTest, FollowsTheSingleProcessReference) {
  const auto [arch, world, stage] = GetParam();
  // The reference: one process, stage 0, the whole global batch.
  const RunResult reference = Train(1, 0, world * kBatchPerRank, arch);
  const RunResult sharded = Train(world, stage, kBatchPerRank, arch);
  ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(sharded.losses.size(), static_cast<size_t>(kSteps));
  // It learns: from ln(61) = 4.11 down by more than half a nat in 24 steps.
  EXPECT_NEAR(reference.losses.front(), std::log(61.0f), 0.1);
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.5f);

  if (world == 1) {
    // Same reduction order: bit for bit.
    EXPECT_EQ(sharded.losses, reference.losses);
    EXPECT_EQ(sharded.params, reference.params);
  } else {
    // Gradients are summed in another order (per rank, then across ranks): float rounding
    // only. Measured worst relative difference of per-step losses is reported on failure.
    const double diff = MaxRelativeDiff(sharded.losses, reference.losses);
    EXPECT_LT(diff, 1e-6) << "world " << world << " stage " << stage;  // measured 1.2e-7
    std::printf("world %d stage %d: max relative per-step loss difference %.3g\n", world, stage,
                diff);
    // Parameters after 24 AdamW steps: the largest deviation relative to the unit's scale.
    for (size_t u = 0; u < reference.params.size(); ++u) {
      EXPECT_LT(MaxDiffOverScale(sharded.params[u], reference.params[u]), 1e-3) << "unit " << u;
    }
  }
}

// Loss masks and documents: the loss is the mean over the targets that count of the whole
// global batch, so two ranks counting different numbers of targets give what one process
// with both ranks' rows gives (to rounding), and the model learns the unmasked targets.
TEST(ZeroMaskedLossTest, MaskedMeanIsTheSameAtAnyWorldSize) {
  for (const auto arch : {weft::v1::GPT2, weft::v1::LLAMA}) {
    const RunResult reference =
        Train(1, 0, 2 * kBatchPerRank, arch, weft::v1::ActivationCheckpointing::AUTO, kSteps, true);
    const RunResult sharded =
        Train(2, 3, kBatchPerRank, arch, weft::v1::ActivationCheckpointing::AUTO, kSteps, true);
    ASSERT_EQ(reference.losses.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(sharded.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.3f);
    EXPECT_LT(MaxRelativeDiff(sharded.losses, reference.losses), 1e-6);
    for (size_t u = 0; u < reference.params.size(); ++u) {
      EXPECT_LT(MaxDiffOverScale(sharded.params[u], reference.params[u]), 1e-3) << "unit " << u;
    }
    // Not the mean over all positions: the same rows unmasked train to other numbers.
    const RunResult unmasked = Train(1, 0, 2 * kBatchPerRank, arch);
    EXPECT_NE(unmasked.losses.front(), reference.losses.front());
  }
}

// A step without a single target is a step, not a NaN: loss 0, gradient 0.
TEST(ZeroMaskedLossTest, NoTargetAtAllGivesZeroLossAndGradient) {
  auto c = comm::CreateGlooCommunicator(nullptr, 0, 1, {});
  ASSERT_TRUE(c.ok()) << c.status();
  auto engine = ZeroCpuEngine::Create(TinySpec(3, kBatchPerRank), c->get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  const BatchFn none = [](int64_t step, int micro, const MicroBatch& mb) {
    GlobalBatch(0, kBatchPerRank)(step, micro, mb);
    std::fill(mb.targets, mb.targets + kBatchPerRank * 16, -1);
  };
  auto r = (*engine)->TrainStep(0, none);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->loss, 0.0f);
  EXPECT_EQ(r->targets, 0);
  EXPECT_EQ(r->grad_norm, 0.0f);
  auto v = (*engine)->EvalLoss(2, none);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 0.0f);
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, ZeroEquivalenceTest,
                         ::testing::Combine(::testing::Values(weft::v1::GPT2, weft::v1::LLAMA),
                                            ::testing::Values(1, 2, 4),
                                            ::testing::Values(0, 2, 3)),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param) == weft::v1::LLAMA ? "llama" : "gpt2",
                               "_world", std::get<1>(info.param), "_stage",
                               std::get<2>(info.param));
                         });

// Activation checkpointing where ZeRO-3 re-gathers each block for its backward: 2 ranks, a few
// steps (gradient accumulation 2) of each level over the same batches. SELECTIVE and FULL
// recompute from the re-gathered block what NONE kept, so the losses and the final parameters
// are NONE's bit for bit, in less activation memory; AUTO is NONE, which fits.
TEST(ZeroCheckpointingTest, EveryLevelTrainsLikeNoneAtStage3) {
  using weft::v1::ActivationCheckpointing;
  constexpr int kFewSteps = 4;
  for (weft::v1::Architecture arch : {weft::v1::GPT2, weft::v1::LLAMA}) {
    SCOPED_TRACE(weft::v1::Architecture_Name(arch));
    const RunResult none = Train(2, 3, kBatchPerRank, arch, ActivationCheckpointing::NONE,
                                 kFewSteps);
    ASSERT_EQ(none.losses.size(), static_cast<size_t>(kFewSteps));
    size_t previous_bytes = none.working_bytes[0];
    for (auto level : {ActivationCheckpointing::SELECTIVE, ActivationCheckpointing::FULL}) {
      SCOPED_TRACE(ActivationCheckpointing::Level_Name(level));
      const RunResult run = Train(2, 3, kBatchPerRank, arch, level, kFewSteps);
      EXPECT_EQ(run.losses, none.losses);
      EXPECT_EQ(run.params, none.params);
      EXPECT_LT(run.working_bytes[0], previous_bytes);
      previous_bytes = run.working_bytes[0];
    }
    const RunResult automatic = Train(2, 3, kBatchPerRank, arch, ActivationCheckpointing::AUTO,
                                      1);
    EXPECT_EQ(automatic.working_bytes[0], none.working_bytes[0]);
    EXPECT_EQ(automatic.losses.front(), none.losses.front());
  }
}

TEST(ZeroStateTest, EachRankHoldsAboutOneNthOfTheStateAtStage3) {
  const RunResult one = Train(1, 3, kBatchPerRank);
  const RunResult four = Train(4, 3, kBatchPerRank);
  ASSERT_EQ(four.state_bytes.size(), 4u);
  for (size_t r = 0; r < 4; ++r) {
    const double ratio = static_cast<double>(four.state_bytes[r]) / one.state_bytes[0];
    // Shards are padded to a multiple of the world size: a little over a quarter.
    EXPECT_GE(ratio, 0.25);
    EXPECT_LT(ratio, 0.26) << "rank " << r;
  }
  // Stage 0 replicates everything.
  const RunResult replicated = Train(2, 0, kBatchPerRank);
  EXPECT_GE(replicated.state_bytes[1], one.state_bytes[0]);
}

// A learning rate of 1e38 moves every weight to about 1e38 in the first step; the second
// step's forward overflows, its gradient is NaN, and the engine skips that step: parameters and
// AdamW moments stay exactly as the first step left them, and the norm it reports says so.
TEST(ZeroSkippedStepTest, ANonFiniteGradientLeavesEveryStateAsItWas) {
  weft::v1::JobSpec spec = TinySpec(3, kBatchPerRank, weft::v1::LLAMA);
  spec.mutable_optimizer()->set_learning_rate(1e38);
  spec.mutable_lr_schedule()->set_kind(weft::v1::LrSchedule::CONSTANT);
  spec.mutable_lr_schedule()->set_warmup_steps(0);
  MemoryStore store;
  auto c = comm::CreateGlooCommunicator(&store, 0, 1, {});
  ASSERT_TRUE(c.ok()) << c.status();
  auto engine = ZeroCpuEngine::Create(spec, c->get());
  ASSERT_TRUE(engine.ok()) << engine.status();
  testing::ExpectOverflowingStepsAreSkipped(**engine, GlobalBatch(0, kBatchPerRank));
}

}  // namespace
}  // namespace weft::zero

namespace weft::zero {
namespace {

// A checkpoint as checkpointd serves it: every tensor in its global flat space, assembled from
// the ranks' slices, read back by any range.
class GlobalCheckpoint {
 public:
  void Add(const std::vector<model_io::UnitSlice>& slices) {
    for (const model_io::UnitSlice& s : slices) {
      for (model_io::UnitState what : model_io::kUnitStates) {
        auto& global = tensors_[model_io::CheckpointTensorName(s.unit, what)];
        global.resize(s.size);
        std::copy(s.data(what).begin(), s.data(what).end(), global.begin() + s.begin);
      }
    }
  }
  const std::map<std::string, std::vector<float>>& tensors() const { return tensors_; }
  // The AdamW updates the state has had (CheckpointManifest.optimizer_step).
  int64_t optimizer_steps = 0;
  model_io::RangeReader Reader() {
    return [this](const std::string& tensor, int64_t begin, int64_t end, float* out) {
      auto it = tensors_.find(tensor);
      if (it == tensors_.end() || end > static_cast<int64_t>(it->second.size())) {
        return absl::NotFoundError(tensor);
      }
      std::copy(it->second.begin() + begin, it->second.begin() + end, out);
      return absl::OkStatus();
    };
  }

 private:
  std::map<std::string, std::vector<float>> tensors_;
};

// Trains `world` ranks at `stage` from `first` to `last` steps, restoring from `restore_from`
// when given; saves the state after `last` into `save_to` when given. Returns rank 0's losses.
std::vector<float> TrainRange(int world, int stage, int batch_per_rank, int first, int last,
                              GlobalCheckpoint* restore_from, GlobalCheckpoint* save_to) {
  MemoryStore store;
  std::vector<float> losses;
  std::vector<std::thread> threads;
  std::vector<std::vector<model_io::UnitSlice>> snapshots(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto c = comm::CreateGlooCommunicator(&store, rank, world, {});
      ASSERT_TRUE(c.ok()) << c.status();
      auto engine = ZeroCpuEngine::Create(TinySpec(stage, batch_per_rank), c->get());
      ASSERT_TRUE(engine.ok());
      if (restore_from) {
        ASSERT_TRUE(
            (*engine)->Restore(restore_from->Reader(), restore_from->optimizer_steps).ok());
      }
      const BatchFn batch = GlobalBatch(rank, batch_per_rank);
      for (int step = first; step < last; ++step) {
        auto r = (*engine)->TrainStep(step, batch);
        ASSERT_TRUE(r.ok()) << r.status();
        if (rank == 0) losses.push_back(r->loss);
      }
      auto snapshot = (*engine)->Snapshot();
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      snapshots[rank] = *std::move(snapshot);
      if (rank == 0 && save_to) save_to->optimizer_steps = (*engine)->optimizer_steps();
      ASSERT_TRUE((*c)->Barrier()->Wait().ok());
    });
  }
  for (auto& t : threads) t.join();
  if (save_to) {
    for (const auto& s : snapshots) save_to->Add(s);
  }
  return losses;
}

// ---- hybrid sharding ----------------------------------------------------------------------

struct HybridResult {
  std::vector<float> losses;      // rank 0's
  std::vector<float> grad_norms;  // rank 0's
  size_t state_bytes = 0;         // rank 0's
  // The gathered model as the first rank of each group sees it.
  std::vector<std::vector<std::vector<float>>> params;
};

// `replicas` x `group_size` ranks (threads, real Gloo) at stage 3 from step `first` to `last`:
// groups and replicas connected as worker/device_backend.cc does; one replica is plain full
// sharding over one communicator. Restores from `restore_from` when given; the snapshots of the
// ranks that write (TrainingEngine::checkpoint_writers, as the Checkpointer uploads them) go to
// `save_to` when given. `sharding`: the spec's replica optimizer and wire format.
HybridResult TrainHybrid(int replicas, int group_size, int first, int last,
                         GlobalCheckpoint* restore_from = nullptr,
                         GlobalCheckpoint* save_to = nullptr,
                         const weft::v1::ShardingSpec& sharding = {}) {
  const int world = replicas * group_size;
  MemoryStore store;
  HybridResult result;
  result.params.resize(replicas);
  std::vector<std::vector<model_io::UnitSlice>> snapshots(world);
  weft::v1::JobSpec spec = TinySpec(3, kBatchPerRank);
  *spec.mutable_sharding() = sharding;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      const int group = rank / group_size, position = rank % group_size;
      comm::GlooOptions options;
      options.timeout_ms = 20000;
      options.store_prefix = replicas > 1 ? absl::StrCat("gloo/group/", group) : "gloo";
      auto g = comm::CreateGlooCommunicator(&store, position, group_size, options);
      ASSERT_TRUE(g.ok()) << g.status();
      std::unique_ptr<comm::Communicator> across;
      if (replicas > 1) {
        options.store_prefix = absl::StrCat("gloo/replica/", position);
        auto r = comm::CreateGlooCommunicator(&store, group, replicas, options);
        ASSERT_TRUE(r.ok()) << r.status();
        across = *std::move(r);
      }
      auto engine = ZeroCpuEngine::Create(spec, g->get(), across.get());
      ASSERT_TRUE(engine.ok()) << engine.status();
      if (restore_from) {
        ASSERT_TRUE(
            (*engine)->Restore(restore_from->Reader(), restore_from->optimizer_steps).ok());
      }
      // Every rank reads its own micro-batches, as a plain job of the same world does.
      const BatchFn batch = GlobalBatch(rank, kBatchPerRank);
      for (int step = first; step < last; ++step) {
        auto r = (*engine)->TrainStep(step, batch);
        ASSERT_TRUE(r.ok()) << r.status();
        if (rank == 0) result.losses.push_back(r->loss);
        if (rank == 0) result.grad_norms.push_back(r->grad_norm);
      }
      auto snapshot = (*engine)->Snapshot();
      ASSERT_TRUE(snapshot.ok()) << snapshot.status();
      const int writers = (*engine)->checkpoint_writers();
      if (writers == 0 || rank < writers) snapshots[rank] = *std::move(snapshot);
      if (rank == 0 && save_to) save_to->optimizer_steps = (*engine)->optimizer_steps();
      if (rank == 0) result.state_bytes = (*engine)->StateBytes();
      auto params = (*engine)->GatherParameters();
      ASSERT_TRUE(params.ok()) << params.status();
      if (position == 0) result.params[group] = *std::move(params);
      ASSERT_TRUE((*g)->Barrier()->Wait().ok());
      if (across) {
        ASSERT_TRUE(across->Barrier()->Wait().ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  if (save_to) {
    for (const auto& s : snapshots) save_to->Add(s);
  }
  return result;
}

class ZeroHybridTest : public ::testing::TestWithParam<std::pair<int, int>> {};

// Hybrid sharding sums each gradient shard over its group, then over the replicas: the same
// terms as full sharding's one reduce-scatter over the world, in another order, so float
// rounding only (not bit for bit); the gradient norm sums squares over one group, whose
// shards tile the model once, as full sharding's over the world do.
TEST_P(ZeroHybridTest, TrainsLikeFullShardingOverTheSameWorld) {
  const auto [replicas, group_size] = GetParam();
  const int world = replicas * group_size;
  const HybridResult full = TrainHybrid(1, world, 0, kSteps);
  const HybridResult hybrid = TrainHybrid(replicas, group_size, 0, kSteps);
  ASSERT_EQ(full.losses.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(hybrid.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(full.losses.back(), full.losses.front() - 0.5f);  // it learns
  const double loss_diff = MaxRelativeDiff(hybrid.losses, full.losses);
  const double norm_diff = MaxRelativeDiff(hybrid.grad_norms, full.grad_norms);
  std::printf("hybrid %dx%d vs full %d: max relative loss difference %.3g, grad norm %.3g\n",
              replicas, group_size, world, loss_diff, norm_diff);
  EXPECT_LT(loss_diff, 1e-6);
  EXPECT_LT(norm_diff, 1e-5);
  double worst_params = 0;
  for (size_t u = 0; u < full.params[0].size(); ++u) {
    const double diff = MaxDiffOverScale(hybrid.params[0][u], full.params[0][u]);
    EXPECT_LT(diff, 1e-3) << "unit " << u;
    worst_params = std::max(worst_params, diff);
  }
  std::printf("hybrid %dx%d: final parameters differ by at most %.3g of a unit's scale\n",
              replicas, group_size, worst_params);
  // The replicas hold the same model, bit for bit: each applies the same summed gradient.
  for (int r = 1; r < replicas; ++r) EXPECT_EQ(hybrid.params[r], hybrid.params[0]);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ZeroHybridTest,
                         ::testing::Values(std::pair{2, 2}, std::pair{2, 1}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.first, "x", info.param.second);
                         });

weft::v1::ShardingSpec ShardedOptimizer(weft::v1::ShardingSpec::WireFormat format) {
  weft::v1::ShardingSpec sharding;
  sharding.set_scope(weft::v1::ShardingSpec::HOST);
  sharding.set_replica_optimizer(weft::v1::ShardingSpec::OPTIMIZER_SHARDED);
  sharding.set_replica_reduce_format(format);
  return sharding;
}

class ZeroShardedOptimizerTest
    : public ::testing::TestWithParam<
          std::tuple<std::pair<int, int>, weft::v1::ShardingSpec::WireFormat>> {};

// Sharing the optimizer out over the replicas (a reduce-scatter over them, each stepping its
// piece, an fp32 all-gather of the stepped pieces) computes what the replicated optimizer
// does, bit for bit: the same sums (WireReduceScatter leaves the all-reduce's bits; Gloo adds
// two replicas' shards alike either way), the same elementwise AdamW, the norm summed piece by
// piece in both. Each rank keeps m and v of its piece only.
TEST_P(ZeroShardedOptimizerTest, TrainsBitForBitLikeTheReplicatedOptimizer) {
  const auto [shape, format] = GetParam();
  const auto [replicas, group_size] = shape;
  weft::v1::ShardingSpec replicated = ShardedOptimizer(format);
  replicated.set_replica_optimizer(weft::v1::ShardingSpec::OPTIMIZER_REPLICATED);
  const HybridResult exact = TrainHybrid(replicas, group_size, 0, kSteps, nullptr, nullptr,
                                         replicated);
  const HybridResult sharded = TrainHybrid(replicas, group_size, 0, kSteps, nullptr, nullptr,
                                           ShardedOptimizer(format));
  ASSERT_EQ(sharded.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_LT(sharded.losses.back(), sharded.losses.front() - 0.5f);  // it learns
  EXPECT_EQ(sharded.losses, exact.losses);
  EXPECT_EQ(sharded.grad_norms, exact.grad_norms);
  for (int r = 0; r < replicas; ++r) EXPECT_EQ(sharded.params[r], exact.params[0]) << r;
  // 16 bytes a parameter become 8 + 8 / R.
  const double ratio =
      static_cast<double>(sharded.state_bytes) / static_cast<double>(exact.state_bytes);
  EXPECT_NEAR(ratio, (8.0 + 8.0 / replicas) / 16.0, 1e-6);
}

std::string ShardedOptimizerCaseName(
    const ::testing::TestParamInfo<ZeroShardedOptimizerTest::ParamType>& info) {
  const auto& [shape, format] = info.param;
  return absl::StrCat(shape.first, "x", shape.second, "_",
                      weft::v1::ShardingSpec::WireFormat_Name(format));
}

INSTANTIATE_TEST_SUITE_P(
    ShapesAndFormats, ZeroShardedOptimizerTest,
    ::testing::Values(std::tuple{std::pair{2, 2}, weft::v1::ShardingSpec::WIRE_FP32},
                      std::tuple{std::pair{2, 1}, weft::v1::ShardingSpec::WIRE_FP32},
                      std::tuple{std::pair{2, 2}, weft::v1::ShardingSpec::WIRE_BF16},
                      std::tuple{std::pair{3, 1}, weft::v1::ShardingSpec::WIRE_INT8}),
    ShardedOptimizerCaseName);

// A sharded optimizer's checkpoint is every rank's piece: full sharding at another world reads
// it back exactly, and it restores a full-sharding checkpoint and trains on from it bit for bit
// like the replicated optimizer restored from the same.
TEST(ZeroShardedOptimizerTest, CheckpointsMoveBetweenShardedOptimizerAndFullSharding) {
  constexpr int kAt = 6;
  const weft::v1::ShardingSpec sharded = ShardedOptimizer(weft::v1::ShardingSpec::WIRE_FP32);
  GlobalCheckpoint sharded_saved;
  TrainHybrid(2, 2, 0, kAt, nullptr, &sharded_saved, sharded);
  GlobalCheckpoint full_reread;
  TrainHybrid(1, 3, kAt, kAt, &sharded_saved, &full_reread);
  EXPECT_EQ(full_reread.tensors(), sharded_saved.tensors());
  EXPECT_EQ(full_reread.optimizer_steps, kAt);

  GlobalCheckpoint full_saved;
  TrainHybrid(1, 3, 0, kAt, nullptr, &full_saved);
  GlobalCheckpoint at_restore;
  TrainHybrid(2, 2, kAt, kAt, &full_saved, &at_restore, sharded);
  EXPECT_EQ(at_restore.tensors(), full_saved.tensors());
  const HybridResult resumed = TrainHybrid(2, 2, kAt, kAt + 2, &full_saved, nullptr, sharded);
  const HybridResult replicated_resumed = TrainHybrid(2, 2, kAt, kAt + 2, &full_saved);
  EXPECT_EQ(resumed.losses, replicated_resumed.losses);
  EXPECT_EQ(resumed.params[1], replicated_resumed.params[0]);
}

// A hybrid checkpoint is group 0's S-rank sharding: full sharding at another world reads it
// back exactly (params, m and v), and a full-sharding checkpoint restores into a hybrid job.
TEST(ZeroHybridTest, CheckpointsMoveBetweenHybridAndFullSharding) {
  constexpr int kAt = 6;
  GlobalCheckpoint hybrid_saved;
  TrainHybrid(2, 2, 0, kAt, nullptr, &hybrid_saved);
  GlobalCheckpoint full_reread;
  TrainHybrid(1, 3, kAt, kAt, &hybrid_saved, &full_reread);
  EXPECT_EQ(full_reread.tensors(), hybrid_saved.tensors());

  GlobalCheckpoint full_saved;
  TrainHybrid(1, 3, 0, kAt, nullptr, &full_saved);
  const HybridResult resumed = TrainHybrid(2, 2, kAt, kAt + 2, &full_saved);
  GlobalCheckpoint at_restore;
  TrainHybrid(2, 1, kAt, kAt, &full_saved, &at_restore);
  EXPECT_EQ(at_restore.tensors(), full_saved.tensors());
  // And it trains on from there like full sharding resumed from the same checkpoint.
  const HybridResult full_resumed = TrainHybrid(1, 4, kAt, kAt + 2, &full_saved);
  EXPECT_LT(MaxRelativeDiff(resumed.losses, full_resumed.losses), 1e-6);
}

TEST(ZeroCheckpointTest, ResumeIsExactAtTheSameWorldSizeAndReshardsToOthers) {
  constexpr int kFirst = 10;
  // Uninterrupted: 2 ranks, stage 3, 24 steps.
  GlobalCheckpoint end_straight;
  const std::vector<float> straight =
      TrainRange(2, 3, kBatchPerRank, 0, kSteps, nullptr, &end_straight);
  GlobalCheckpoint at10;
  const std::vector<float> head = TrainRange(2, 3, kBatchPerRank, 0, kFirst, nullptr, &at10);
  ASSERT_EQ(head, std::vector<float>(straight.begin(), straight.begin() + kFirst));

  // Same world size: the continued run is the uninterrupted one, bit for bit.
  GlobalCheckpoint end_resumed;
  const std::vector<float> tail = TrainRange(2, 3, kBatchPerRank, kFirst, kSteps, &at10,
                                             &end_resumed);
  EXPECT_EQ(tail, std::vector<float>(straight.begin() + kFirst, straight.end()));
  // Parameters and AdamW moments at the end: identical bits.
  ASSERT_FALSE(end_straight.tensors().empty());
  EXPECT_TRUE(end_resumed.tensors() == end_straight.tensors());

  // Other world sizes (and stages) over the same global batch: float rounding only.
  for (const auto& [world, stage] : {std::pair{1, 3}, std::pair{4, 3}, std::pair{4, 0}}) {
    const std::vector<float> other =
        TrainRange(world, stage, 2 * kBatchPerRank / world, kFirst, kSteps, &at10, nullptr);
    ASSERT_EQ(other.size(), tail.size());
    const double diff =
        MaxRelativeDiff(other, std::vector<float>(straight.begin() + kFirst, straight.end()));
    std::printf("resume 2 -> %d ranks (stage %d): max relative loss difference %.3g\n", world,
                stage, diff);
    EXPECT_LT(diff, 1e-6) << "world " << world;
  }
}

// AdamW's bias corrections count the updates applied (TrainingEngine::optimizer_steps), not
// the step index: at a constant learning rate and the same batch, a fresh engine's update at
// step 5 (after five skipped steps, or on a resumed run whose checkpoint had no update) is
// its update at step 0, bit for bit; the same engine told it has had 5 updates moves less.
TEST(ZeroSkippedStepTest, BiasCorrectionCountsTheUpdatesAppliedNotTheStep) {
  weft::v1::JobSpec spec = TinySpec(3, kBatchPerRank, weft::v1::LLAMA);
  spec.mutable_lr_schedule()->set_kind(weft::v1::LrSchedule::CONSTANT);
  spec.mutable_lr_schedule()->set_warmup_steps(0);
  const BatchFn fixed = [](int64_t, int micro, const MicroBatch& mb) {
    GlobalBatch(0, kBatchPerRank)(0, micro, mb);
  };
  const auto train = [&](int64_t step, int64_t applied) {
    auto c = comm::CreateGlooCommunicator(nullptr, 0, 1, {});
    EXPECT_TRUE(c.ok()) << c.status();
    auto engine = ZeroCpuEngine::Create(spec, c->get());
    EXPECT_TRUE(engine.ok()) << engine.status();
    // The engine's own initial state, as a checkpoint with `applied` updates behind it.
    auto initial = (*engine)->Snapshot();
    EXPECT_TRUE(initial.ok()) << initial.status();
    GlobalCheckpoint own;
    own.Add(*initial);
    EXPECT_TRUE((*engine)->Restore(own.Reader(), applied).ok());
    auto r = (*engine)->TrainStep(step, fixed);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ((*engine)->optimizer_steps(), applied + 1);
    auto params = (*engine)->GatherParameters();
    EXPECT_TRUE(params.ok()) << params.status();
    return params.ok() ? *params : std::vector<std::vector<float>>{};
  };
  const auto first = train(0, 0);
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(train(5, 0), first);
  EXPECT_NE(train(0, 5), first);
}

// ---- the memory plan against what the engine allocates ------------------------------------

// Heap bytes in use in the process, over every malloc arena and mmapped block.
size_t HeapInUse() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

// A model big enough that its buffers dwarf the allocator's noise (3.7M parameters; activations
// of 50 MB at NONE), small enough to build in a blink.
weft::v1::JobSpec PlanSpec(weft::v1::Architecture arch, int stage,
                           weft::v1::ActivationCheckpointing::Level level) {
  weft::v1::JobSpec spec = TinySpec(stage, 4, arch, level);
  auto* m = spec.mutable_model();
  m->set_num_layers(4);
  m->set_hidden_size(256);
  m->set_num_heads(4);
  m->set_vocab_size(2000);
  m->set_padded_vocab_size(2048);
  m->set_context_length(128);
  if (arch == weft::v1::LLAMA) m->set_intermediate_size(512);
  spec.mutable_training()->set_sequence_length(128);
  return spec;
}

// Builds the engine of `spec` on each of `world` ranks (threads, real Gloo), each with
// `options[rank]`, and, where it was built, gathers its largest unit and keeps it, as the end of
// training does for the model file. Returns each rank's outcome and the heap the engines (and
// the gathered units) took, measured with every communicator already connected.
struct Built {
  std::vector<absl::Status> status;
  std::vector<std::unique_ptr<ZeroCpuEngine>> engines;
  std::vector<std::vector<float>> gathered;
  int64_t heap_bytes = 0;
};
Built BuildEngines(const weft::v1::JobSpec& spec, int world,
                   const std::vector<ZeroCpuOptions>& options) {
  MemoryStore store;
  std::vector<std::unique_ptr<comm::Communicator>> comms(world);
  const auto on_every_rank = [world](const std::function<void(int)>& body) {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) threads.emplace_back(body, rank);
    for (auto& t : threads) t.join();
  };
  on_every_rank([&](int rank) {
    comm::GlooOptions gloo;
    gloo.timeout_ms = 20000;
    auto c = comm::CreateGlooCommunicator(&store, rank, world, gloo);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) comms[rank] = std::move(*c);
  });
  Built built;
  built.status.resize(world);
  built.engines.resize(world);
  built.gathered.resize(world);
  const size_t before = HeapInUse();
  on_every_rank([&](int rank) {
    if (comms[rank] == nullptr) return;
    auto engine = ZeroCpuEngine::Create(spec, comms[rank].get(), nullptr, options[rank]);
    built.status[rank] = engine.status();
    if (!engine.ok()) return;
    const ShardLayout& layout = (*engine)->layout();
    int largest = 0;
    for (int u = 1; u < layout.num_units(); ++u) {
      if (layout.unit(u).padded > layout.unit(largest).padded) largest = u;
    }
    auto unit = (*engine)->GatherUnit(largest);
    built.status[rank] = unit.status();
    if (unit.ok()) built.gathered[rank] = std::move(*unit);
    built.engines[rank] = std::move(*engine);
  });
  built.heap_bytes = static_cast<int64_t>(HeapInUse()) - static_cast<int64_t>(before);
  return built;
}

// The plan's state, working buffers and activations (the checkpointer's copy and the reserve
// are not the engine's) are what the engine really allocates, to 1% (plus 1 MiB of allocator
// noise), for GPT-2 and Llama at every stage, world 1 and 2, and each checkpointing level.
TEST(ZeroCpuMemoryPlanTest, ThePlanIsWhatTheEngineAllocates) {
  using weft::v1::ActivationCheckpointing;
  struct Case {
    int world;
    int stage;
    ActivationCheckpointing::Level level;
  };
  const std::vector<Case> cases = {
      {1, 0, ActivationCheckpointing::NONE},      {1, 3, ActivationCheckpointing::NONE},
      {1, 3, ActivationCheckpointing::SELECTIVE}, {1, 3, ActivationCheckpointing::FULL},
      {2, 2, ActivationCheckpointing::NONE},      {2, 3, ActivationCheckpointing::FULL},
  };
  for (weft::v1::Architecture arch : {weft::v1::GPT2, weft::v1::LLAMA}) {
    for (const Case& c : cases) {
      SCOPED_TRACE(absl::StrCat(weft::v1::Architecture_Name(arch), " world ", c.world,
                                " stage ", c.stage, " ",
                                ActivationCheckpointing::Level_Name(c.level)));
      const weft::v1::JobSpec spec = PlanSpec(arch, c.stage, c.level);
      const Built built = BuildEngines(spec, c.world, std::vector<ZeroCpuOptions>(c.world));
      int64_t planned = 0;
      for (int rank = 0; rank < c.world; ++rank) {
        ASSERT_TRUE(built.status[rank].ok()) << built.status[rank];
        const CpuMemoryPlan& plan = built.engines[rank]->memory_plan();
        auto arch_model = engine::MakeModelArch(spec.model());
        ASSERT_TRUE(arch_model.ok());
        auto model = engine::cpu::FindCpuModel(**arch_model);
        ASSERT_TRUE(model.ok()) << model.status();
        const CpuMemoryPlan asked =
            PlanCpuMemory(spec, **arch_model, *model,
                          engine::CheckpointingFromSpec(c.level, engine::Checkpointing::kNone), 4,
                          c.world, c.stage, /*writes_checkpoints=*/false);
        EXPECT_EQ(plan.total(), asked.total());  // the plan the engine was built by
        planned += static_cast<int64_t>(plan.state_bytes + plan.working_bytes +
                                        plan.activation_bytes);
      }
      const double error = std::abs(static_cast<double>(built.heap_bytes - planned));
      EXPECT_LE(error, 0.01 * static_cast<double>(planned) + (1 << 20))
          << "allocated " << built.heap_bytes << " bytes, planned " << planned;
      std::printf("%s world %d stage %d %s: allocated %lld bytes, planned %lld\n",
                  weft::v1::Architecture_Name(arch).c_str(), c.world, c.stage,
                  ActivationCheckpointing::Level_Name(c.level).c_str(),
                  static_cast<long long>(built.heap_bytes), static_cast<long long>(planned));
    }
  }
}

// Given less than its plan, Create refuses before allocating anything, naming every part, the
// budget and what would fit; given exactly the plan it builds; under AUTO it takes the least
// recomputation that fits the budget.
TEST(ZeroCpuMemoryPlanTest, AnEngineThatDoesNotFitIsRefusedBeforeAllocating) {
  using weft::v1::ActivationCheckpointing;
  const weft::v1::JobSpec spec = PlanSpec(weft::v1::GPT2, 3, ActivationCheckpointing::NONE);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  auto model = engine::cpu::FindCpuModel(**arch);
  ASSERT_TRUE(model.ok()) << model.status();
  const auto plan_at = [&](engine::Checkpointing level) {
    return PlanCpuMemory(spec, **arch, *model, level, 4, 1, 3, false);
  };
  const CpuMemoryPlan none = plan_at(engine::Checkpointing::kNone);
  ZeroCpuOptions options;
  options.host_available_bytes = none.total() - 1;
  Built refused = BuildEngines(spec, 1, {options});
  EXPECT_EQ(refused.status[0].code(), absl::StatusCode::kResourceExhausted) << refused.status[0];
  EXPECT_THAT(refused.status[0].message(),
              ::testing::HasSubstr(absl::StrCat("host memory: the job needs ",
                                                DescribeCpuMemoryPlan(none), " per rank")));
  EXPECT_THAT(refused.status[0].message(), ::testing::HasSubstr("(MemAvailable)"));
  EXPECT_THAT(refused.status[0].message(),
              ::testing::HasSubstr("training.activation_checkpointing: SELECTIVE"));
  EXPECT_THAT(refused.status[0].message(), ::testing::HasSubstr("training.micro_batch_size: 3"));
  // Nothing was allocated: the engine's buffers are tens of megabytes.
  EXPECT_LT(refused.heap_bytes, 1 << 20);

  options.host_available_bytes = none.total();
  Built fits = BuildEngines(spec, 1, {options});
  ASSERT_TRUE(fits.status[0].ok()) << fits.status[0];
  EXPECT_THAT(fits.engines[0]->MemoryPlanNote(),
              ::testing::HasSubstr("activation checkpointing none (as asked)"));

  // AUTO within SELECTIVE's plan: SELECTIVE, and it allocates SELECTIVE's activations.
  const CpuMemoryPlan selective = plan_at(engine::Checkpointing::kSelective);
  options.host_available_bytes = selective.total();
  Built automatic =
      BuildEngines(PlanSpec(weft::v1::GPT2, 3, ActivationCheckpointing::AUTO), 1, {options});
  ASSERT_TRUE(automatic.status[0].ok()) << automatic.status[0];
  EXPECT_THAT(automatic.engines[0]->MemoryPlanNote(),
              ::testing::HasSubstr("activation checkpointing selective (chosen by AUTO)"));
  EXPECT_EQ(automatic.engines[0]->memory_plan().total(), selective.total());
  EXPECT_LT(automatic.heap_bytes, static_cast<int64_t>(selective.total()));
}

// One rank short of memory fails every rank before any allocates: its error names the memory,
// the others' name it as the cause.
TEST(ZeroCpuMemoryPlanTest, OneRankThatDoesNotFitFailsEveryRankBeforeAnyAllocates) {
  const weft::v1::JobSpec spec =
      PlanSpec(weft::v1::LLAMA, 3, weft::v1::ActivationCheckpointing::AUTO);
  std::vector<ZeroCpuOptions> options(2);
  options[0].host_available_bytes = size_t{1} << 40;
  options[1].host_available_bytes = size_t{1} << 20;
  const Built built = BuildEngines(spec, 2, options);
  EXPECT_EQ(built.status[0].code(), absl::StatusCode::kResourceExhausted) << built.status[0];
  EXPECT_THAT(built.status[0].message(), ::testing::HasSubstr("1 other rank(s)"));
  EXPECT_EQ(built.status[1].code(), absl::StatusCode::kResourceExhausted) << built.status[1];
  EXPECT_THAT(built.status[1].message(), ::testing::HasSubstr("host memory: the job needs"));
  EXPECT_LT(built.heap_bytes, 1 << 20);
}

}  // namespace
}  // namespace weft::zero
