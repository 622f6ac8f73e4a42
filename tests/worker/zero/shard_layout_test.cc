// ShardLayout: padding, shard sizes and owned ranges of ZeRO units, which both engines, the GPU
// memory planner and checkpoint slicing take from it.
#include "worker/zero/shard_layout.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/model_io/checkpoint_schema.h"

namespace weft::zero {
namespace {

TEST(ShardLayoutTest, PadsEveryUnitToAMultipleOfTheWorld) {
  const ShardLayout layout({10, 7, 12}, /*world=*/4, /*rank=*/1);
  ASSERT_EQ(layout.num_units(), 3);
  EXPECT_EQ(layout.unit(0).padded, 12u);
  EXPECT_EQ(layout.unit(0).shard, 3u);
  EXPECT_EQ(layout.unit(1).padded, 8u);
  EXPECT_EQ(layout.unit(1).shard, 2u);
  EXPECT_EQ(layout.unit(2).padded, 12u);
  EXPECT_EQ(layout.unit(2).shard, 3u);
  EXPECT_EQ(layout.max_shard(), 3u);
  EXPECT_EQ(layout.total_shard(), 8u);
  // Blocks only: the head (unit 0) is gathered into its own buffer.
  EXPECT_EQ(layout.max_block_padded(), 12u);
  EXPECT_EQ(ShardLayout({100, 8}, 4, 0).max_block_padded(), 8u);
  EXPECT_EQ(ShardLayout({100}, 4, 0).max_block_padded(), 0u);
}

TEST(ShardLayoutTest, OwnedRangesTileEachUnitExactlyOnce) {
  const std::vector<size_t> sizes = {10, 7, 1, 12};
  for (int world : {1, 2, 3, 4, 5, 8}) {
    for (size_t u = 0; u < sizes.size(); ++u) {
      std::vector<int> covered(sizes[u], 0);
      for (int rank = 0; rank < world; ++rank) {
        const ShardRange owned = ShardLayout(sizes, world, rank).unit(u).owned;
        ASSERT_LE(owned.begin, owned.end);
        ASSERT_LE(owned.end, static_cast<int64_t>(sizes[u]));
        for (int64_t i = owned.begin; i < owned.end; ++i) ++covered[i];
      }
      for (size_t i = 0; i < sizes[u]; ++i) {
        EXPECT_EQ(covered[i], 1) << "world " << world << " unit " << u << " element " << i;
      }
    }
  }
}

TEST(ShardLayoutTest, ARankWhoseShardIsAllPaddingOwnsNothing) {
  // 1 element over 4 ranks: padded to 4, shards of 1; ranks 1-3 hold only padding.
  EXPECT_EQ(ShardLayout({1}, 4, 0).unit(0).owned, (ShardRange{0, 1}));
  for (int rank = 1; rank < 4; ++rank) {
    const ShardRange owned = ShardLayout({1}, 4, rank).unit(0).owned;
    EXPECT_EQ(owned.size(), 0) << rank;
  }
  // 7 over 4 (shards of 2): rank 3's shard is [6, 8), clipped to [6, 7).
  EXPECT_EQ(ShardLayout({7}, 4, 3).unit(0).owned, (ShardRange{6, 7}));
}

// Pieces (one per replica under hybrid sharding): units padded so that every shard cuts into
// `count` pieces of whole `align` blocks; the (rank, piece) pairs tile each unit once.
TEST(ShardLayoutTest, PiecesAreWholeBlocksAndTileEachUnitOnce) {
  const std::vector<size_t> sizes = {1000, 7, 513};
  for (int world : {1, 2, 3}) {
    for (int count : {2, 3}) {
      for (size_t u = 0; u < sizes.size(); ++u) {
        std::vector<int> covered(sizes[u], 0);
        for (int rank = 0; rank < world; ++rank) {
          for (int index = 0; index < count; ++index) {
            const ShardLayout layout(sizes, world, rank, {count, index, 256});
            const UnitShard& unit = layout.unit(u);
            ASSERT_EQ(layout.pieces(), count);
            EXPECT_EQ(unit.padded % (static_cast<size_t>(world) * count * 256), 0u);
            EXPECT_EQ(unit.piece * static_cast<size_t>(count), unit.shard);
            EXPECT_EQ(unit.piece % 256, 0u);
            EXPECT_EQ(unit.piece_offset, static_cast<size_t>(index) * unit.piece);
            for (int64_t i = unit.owned_piece.begin; i < unit.owned_piece.end; ++i) ++covered[i];
          }
        }
        for (size_t i = 0; i < sizes[u]; ++i) {
          ASSERT_EQ(covered[i], 1) << "world " << world << " pieces " << count << " unit " << u
                                   << " element " << i;
        }
      }
    }
  }
  // One piece: the shard itself, padded to the world only, whatever the alignment.
  const UnitShard one = ShardLayout({10}, 4, 1, {1, 0, 256}).unit(0);
  EXPECT_EQ(one.padded, 12u);
  EXPECT_EQ(one.piece, one.shard);
  EXPECT_EQ(one.owned_piece, one.owned);
}

TEST(ShardLayoutTest, StageZeroKeepsWholeUnitsAndOtherStagesTheShard) {
  const ShardLayout layout({10}, 4, 2);
  EXPECT_EQ(layout.KeptElements(0, 0), 12u);
  EXPECT_EQ(layout.KeptRange(0, 0), (ShardRange{0, 10}));
  for (int stage : {1, 2, 3}) {
    EXPECT_EQ(layout.KeptElements(0, stage), 3u);
    EXPECT_EQ(layout.KeptRange(0, stage), (ShardRange{6, 9}));
  }
}

TEST(CheckpointSchemaTest, NamesEachUnitsThreeTensors) {
  EXPECT_EQ(model_io::CheckpointTensorName(0, model_io::UnitState::kParams), "u0.params");
  EXPECT_EQ(model_io::CheckpointTensorName(12, model_io::UnitState::kM), "u12.m");
  EXPECT_EQ(model_io::CheckpointTensorName(3, model_io::UnitState::kV), "u3.v");
  model_io::UnitSlice slice;
  slice.params = {1};
  slice.m = {2, 2};
  slice.v = {3, 3, 3};
  EXPECT_EQ(slice.data(model_io::UnitState::kParams).size(), 1u);
  EXPECT_EQ(slice.data(model_io::UnitState::kM).size(), 2u);
  EXPECT_EQ(slice.data(model_io::UnitState::kV).size(), 3u);
}

}  // namespace
}  // namespace weft::zero
