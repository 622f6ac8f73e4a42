// How a rank starts each unit (InitialUnitState): the kept parts of all ranks are exactly the
// whole unit at every stage and world size, and at stage 3 a rank never builds more than its
// part: a model bigger than a process's memory budget starts on ranks that each fit in it.
#include "worker/zero/zero_engine.h"

#include <sys/resource.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/model_arch.h"
#include "worker/zero/shard_layout.h"

namespace weft::zero {
namespace {

std::unique_ptr<const engine::ModelArch> Arch(const weft::v1::ModelSpec& spec) {
  auto arch = engine::MakeModelArch(spec);
  if (!arch.ok()) {
    ADD_FAILURE() << arch.status();
    std::abort();
  }
  return std::move(*arch);
}

weft::v1::ModelSpec TinyGpt2() {
  weft::v1::ModelSpec spec;
  spec.set_num_layers(2);
  spec.set_hidden_size(8);
  spec.set_num_heads(2);
  spec.set_vocab_size(11);
  spec.set_padded_vocab_size(16);
  spec.set_context_length(5);
  return spec;
}

weft::v1::ModelSpec Llama(int layers, int hidden, int heads, int kv_heads, int intermediate,
                          int vocab) {
  weft::v1::ModelSpec spec;
  spec.set_architecture(weft::v1::LLAMA);
  spec.set_num_layers(layers);
  spec.set_hidden_size(hidden);
  spec.set_num_heads(heads);
  spec.set_num_kv_heads(kv_heads);
  spec.set_intermediate_size(intermediate);
  spec.set_vocab_size(vocab);
  spec.set_context_length(16);
  return spec;
}

class InitialUnitStateTest : public ::testing::TestWithParam<weft::v1::ModelSpec> {};

// Whatever the world size and stage, the ranks' kept parts laid side by side are the whole
// unit (padding 0) bit for bit, and so are their decay masks; stages 1-2 also get the whole
// unit, which they keep resident.
TEST_P(InitialUnitStateTest, KeptPartsTileTheWholeUnit) {
  const auto arch = Arch(GetParam());
  for (int world : {1, 2, 3, 5}) {
    for (int stage = 0; stage <= 3; ++stage) {
      for (int u = 0; u < arch->NumUnits(); ++u) {
        const ShardLayout layout0(UnitSizes(*arch), world, 0);
        const UnitShard& shard = layout0.unit(u);
        std::vector<float> whole(shard.padded, 0.0f);
        arch->InitUnit(u, 9, whole.data());
        std::vector<uint8_t> mask(shard.padded, 0);
        arch->UnitDecayMask(u, mask.data());
        const int ranks = stage == 0 ? 1 : world;  // stage 0: every rank keeps everything
        std::vector<float> tiled;
        std::vector<uint8_t> tiled_mask;
        for (int rank = 0; rank < world; ++rank) {
          const ShardLayout layout(UnitSizes(*arch), world, rank);
          const InitialUnit init = InitialUnitState(*arch, layout, stage, 9, u);
          ASSERT_EQ(init.kept.size(), layout.KeptElements(u, stage));
          ASSERT_EQ(init.decay_mask.size(), init.kept.size());
          if (stage == 1 || stage == 2) {
            ASSERT_EQ(init.full.size(), whole.size());
            EXPECT_EQ(std::memcmp(init.full.data(), whole.data(), whole.size() * 4), 0);
          } else {
            EXPECT_TRUE(init.full.empty()) << "stage " << stage << " built the whole unit";
          }
          if (rank >= ranks) continue;
          tiled.insert(tiled.end(), init.kept.begin(), init.kept.end());
          tiled_mask.insert(tiled_mask.end(), init.decay_mask.begin(), init.decay_mask.end());
        }
        ASSERT_EQ(tiled.size(), whole.size());
        EXPECT_EQ(std::memcmp(tiled.data(), whole.data(), whole.size() * 4), 0)
            << "world " << world << " stage " << stage << " unit " << u;
        EXPECT_EQ(tiled_mask, mask) << "world " << world << " stage " << stage << " unit " << u;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, InitialUnitStateTest,
                         ::testing::Values(TinyGpt2(), Llama(2, 16, 4, 2, 24, 50)));

// Bytes of private writable memory the process has mapped (what RLIMIT_DATA counts).
size_t DataBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmData:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  }
  return 0;
}

// Caps the process's data at what it has now plus `budget` bytes; allocations past it fail.
void LimitDataTo(size_t budget) {
  const rlimit limit = {DataBytes() + budget, RLIM_INFINITY};
  if (DataBytes() == 0 || setrlimit(RLIMIT_DATA, &limit) != 0) std::_Exit(2);
}

// About 1.1 GiB of fp32 parameters: a 1 GiB head (embeddings and LM head of 131072 x 1024) and
// two 68 MiB blocks. Most of the head's rows are vocabulary padding, whose memory is as real as
// any but which starts at 0 without drawing noise: that keeps the test about memory and fast.
// At world 8 a rank keeps an eighth of each unit.
weft::v1::ModelSpec GiBLlama() {
  weft::v1::ModelSpec spec = Llama(2, 1024, 8, 4, 4096, 8000);
  spec.set_padded_vocab_size(131072);
  return spec;
}
constexpr size_t kBudget = size_t{256} << 20;

// Every rank of a world of 8 builds its stage-3 state of every unit, all at once, within a
// budget that no whole unit fits in (the test below shows the budget refuses one).
TEST(InitialUnitStateMemoryTest, EachRankStartsAModelLargerThanItsBudget) {
  const auto arch = Arch(GiBLlama());
  ASSERT_GT(arch->ParameterCount() * sizeof(float), size_t{1000} << 20);
  ASSERT_GT(arch->UnitSize(0) * sizeof(float), kBudget);
  EXPECT_EXIT(
      {
        LimitDataTo(kBudget);
        try {
          for (int rank = 0; rank < 8; ++rank) {
            const ShardLayout layout(UnitSizes(*arch), 8, rank);
            std::vector<InitialUnit> units;
            for (int u = 0; u < arch->NumUnits(); ++u) {
              units.push_back(InitialUnitState(*arch, layout, 3, 1, u));
              if (units.back().kept.size() != layout.unit(u).shard) std::_Exit(4);
            }
          }
        } catch (const std::bad_alloc&) {
          std::_Exit(3);
        }
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

// The control: under the same budget, a whole unit cannot even be allocated, nor the state of
// stage 2, which keeps the whole unit resident.
TEST(InitialUnitStateMemoryTest, TheBudgetRefusesAWholeUnit) {
  const auto arch = Arch(GiBLlama());
  EXPECT_EXIT(
      {
        LimitDataTo(kBudget);
        try {
          std::vector<float> whole(arch->UnitSize(0));
          std::_Exit(0);
        } catch (const std::bad_alloc&) {
          std::_Exit(3);
        }
      },
      ::testing::ExitedWithCode(3), "");
  EXPECT_EXIT(
      {
        LimitDataTo(kBudget);
        try {
          InitialUnitState(*arch, ShardLayout(UnitSizes(*arch), 8, 0), 2, 1, 0);
          std::_Exit(0);
        } catch (const std::bad_alloc&) {
          std::_Exit(3);
        }
      },
      ::testing::ExitedWithCode(3), "");
}

}  // namespace
}  // namespace weft::zero
