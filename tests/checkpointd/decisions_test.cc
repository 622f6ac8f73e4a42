// Unit tests for checkpointd's pure decisions: shard/manifest agreement, coverage, retention,
// disk space.
#include "checkpointd/decisions.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::checkpointd {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// One rank's ranges as (tensor, begin, end).
weft::v1::RankState Rank(int rank,
                         const std::vector<std::tuple<std::string, int64_t, int64_t>>& ranges) {
  weft::v1::RankState state;
  state.set_rank(rank);
  for (const auto& [tensor, begin, end] : ranges) {
    auto* r = state.add_ranges();
    r->set_tensor(tensor);
    r->set_begin(begin);
    r->set_end(end);
  }
  return state;
}

weft::v1::TensorLayout Layout(const std::string& name, int64_t numel) {
  weft::v1::TensorLayout t;
  t.set_name(name);
  t.set_dtype(weft::v1::DTYPE_F32);
  t.add_shape(numel);
  return t;
}

// ---- CheckCoverage -------------------------------------------------------------------------

TEST(CheckCoverageTest, DisjointRangesInAnyOrderCoverEveryTensor) {
  const std::map<std::string, int64_t> numels = {{"a", 100}, {"b", 10}};
  Verdict v = CheckCoverage(
      numels, {Rank(1, {{"a", 50, 100}, {"b", 0, 10}}), Rank(0, {{"a", 0, 20}, {"a", 20, 50}})});
  EXPECT_TRUE(v.ok) << v.reason;
  EXPECT_THAT(v.reason, IsEmpty());
}

TEST(CheckCoverageTest, GapIsRefusedNamingTheFirstUncoveredElement) {
  Verdict v = CheckCoverage({{"a", 100}}, {Rank(0, {{"a", 0, 40}}), Rank(1, {{"a", 50, 100}})});
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.reason, HasSubstr("tensor a: the ranks' ranges do not cover [0, 100)"));
  EXPECT_THAT(v.reason, HasSubstr("gap at element 40"));
}

TEST(CheckCoverageTest, MissingTailAndUncoveredTensorAreGaps) {
  Verdict tail = CheckCoverage({{"a", 100}}, {Rank(0, {{"a", 0, 99}})});
  EXPECT_FALSE(tail.ok);
  EXPECT_THAT(tail.reason, HasSubstr("gap at element 99"));
  Verdict none = CheckCoverage({{"a", 100}, {"b", 5}}, {Rank(0, {{"a", 0, 100}})});
  EXPECT_FALSE(none.ok);
  EXPECT_THAT(none.reason, HasSubstr("tensor b"));
  EXPECT_THAT(none.reason, HasSubstr("gap at element 0"));
}

TEST(CheckCoverageTest, OverlapIsRefusedEvenWhenTheEndIsReached) {
  Verdict partial =
      CheckCoverage({{"a", 100}}, {Rank(0, {{"a", 0, 60}}), Rank(1, {{"a", 50, 100}})});
  EXPECT_FALSE(partial.ok);
  EXPECT_THAT(partial.reason, HasSubstr("overlap at element 50, rank 1"));
  // Two ranks writing the whole tensor reach its end, but cover it twice.
  Verdict twice = CheckCoverage({{"a", 100}}, {Rank(0, {{"a", 0, 100}}), Rank(1, {{"a", 0, 100}})});
  EXPECT_FALSE(twice.ok);
  EXPECT_THAT(twice.reason, HasSubstr("overlap at element 0"));
}

TEST(CheckCoverageTest, RangePastTheEndIsRefused) {
  Verdict v = CheckCoverage({{"a", 100}}, {Rank(0, {{"a", 0, 50}}), Rank(3, {{"a", 50, 101}})});
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.reason, HasSubstr("rank 3's range [50, 101) runs past the end"));
}

TEST(CheckCoverageTest, RangeOfAnUnlistedTensorIsRefused) {
  Verdict v = CheckCoverage({{"a", 10}}, {Rank(0, {{"a", 0, 10}}), Rank(1, {{"z", 0, 10}})});
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.reason, HasSubstr("rank 1 wrote tensor z that the manifest does not list"));
}

// ---- CheckShardAgainstManifest -------------------------------------------------------------

class ShardAgainstManifestTest : public ::testing::Test {
 protected:
  void SetUp() override {
    manifest_.set_world_size(2);
    *manifest_.add_tensors() = Layout("a", 100);
    shard_.set_world_size(2);
    *shard_.add_tensors() = Layout("a", 100);
    auto* r = shard_.add_ranges();
    r->set_tensor("a");
    r->set_begin(0);
    r->set_end(50);
  }
  weft::v1::CheckpointManifest manifest_;
  weft::v1::ShardHeader shard_;
};

TEST_F(ShardAgainstManifestTest, AgreeingShardIsAccepted) {
  Verdict v = CheckShardAgainstManifest(manifest_, shard_, 0);
  EXPECT_TRUE(v.ok) << v.reason;
}

TEST_F(ShardAgainstManifestTest, OtherWorldSizeIsRefused) {
  shard_.set_world_size(4);
  Verdict v = CheckShardAgainstManifest(manifest_, shard_, 1);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, "rank 1 wrote its shard for world size 4, manifest says 2");
}

TEST_F(ShardAgainstManifestTest, OtherShapeOrDtypeIsRefused) {
  shard_.mutable_tensors(0)->set_shape(0, 99);
  Verdict shape = CheckShardAgainstManifest(manifest_, shard_, 0);
  EXPECT_FALSE(shape.ok);
  EXPECT_EQ(shape.reason, "tensor a: rank 0 wrote it with another dtype or shape");
  shard_.mutable_tensors(0)->set_shape(0, 100);
  shard_.mutable_tensors(0)->set_dtype(weft::v1::DTYPE_BF16);
  EXPECT_FALSE(CheckShardAgainstManifest(manifest_, shard_, 0).ok);
}

TEST_F(ShardAgainstManifestTest, UnlistedTensorIsRefusedButAnExtraLayoutAlone) {
  // A layout the manifest lacks, with no range, holds no data: nothing to refuse.
  *shard_.add_tensors() = Layout("extra", 7);
  EXPECT_TRUE(CheckShardAgainstManifest(manifest_, shard_, 0).ok);
  auto* r = shard_.add_ranges();
  r->set_tensor("extra");
  r->set_begin(0);
  r->set_end(7);
  Verdict v = CheckShardAgainstManifest(manifest_, shard_, 0);
  EXPECT_FALSE(v.ok);
  EXPECT_EQ(v.reason, "rank 0 wrote tensor extra that the manifest does not list");
}

// ---- DecideRetention -----------------------------------------------------------------------

TEST(DecideRetentionTest, KeepsTheNewestKAndDeletesTheRestNewestFirst) {
  RetentionDecision d = DecideRetention(50, 2, {{40, false}, {30, false}, {20, false}});
  EXPECT_THAT(d.victims, ElementsAre(30, 20));
  EXPECT_EQ(d.reason, "keep last 2: keeping 50, 40; deleting 30, 20");
}

TEST(DecideRetentionTest, PinnedOnesSurviveWithoutCountingAgainstK) {
  RetentionDecision d = DecideRetention(40, 2, {{30, false}, {20, false}, {10, true}});
  EXPECT_THAT(d.victims, ElementsAre(20));
  EXPECT_EQ(d.reason, "keep last 2: keeping 40, 30; pinned: 10; deleting 20");
}

TEST(DecideRetentionTest, PinnedAmongTheNewestCountsAsKept) {
  RetentionDecision d = DecideRetention(40, 2, {{30, true}, {20, false}});
  EXPECT_THAT(d.victims, ElementsAre(20));
}

TEST(DecideRetentionTest, NewerCheckpointsThanTheCommittedOneAreAlwaysKept) {
  // A job resumed from step 10 commits 20 while 30 and 40 exist from before.
  RetentionDecision d = DecideRetention(20, 2, {{40, false}, {30, false}, {10, false}});
  EXPECT_THAT(d.victims, ElementsAre(10));
  EXPECT_THAT(d.reason, HasSubstr("keeping 40, 30, 20"));
}

TEST(DecideRetentionTest, KeepLastUnsetOrOneKeepsAsSaid) {
  RetentionDecision unset = DecideRetention(50, 0, {{40, false}, {30, false}});
  EXPECT_THAT(unset.victims, IsEmpty());
  EXPECT_THAT(unset.reason, HasSubstr("every checkpoint kept"));
  RetentionDecision one = DecideRetention(50, 1, {{40, false}, {30, true}});
  EXPECT_THAT(one.victims, ElementsAre(40));
  EXPECT_EQ(one.reason, "keep last 1: keeping 50; pinned: 30; deleting 40");
}

TEST(DecideRetentionTest, NothingToDeleteSaysSo) {
  RetentionDecision d = DecideRetention(10, 3, {});
  EXPECT_THAT(d.victims, IsEmpty());
  EXPECT_EQ(d.reason, "keep last 3: keeping 10; deleting none");
}

// ---- CheckDiskSpace ------------------------------------------------------------------------

TEST(CheckDiskSpaceTest, AWriteThatLeavesTheReserveFreeMayStart) {
  EXPECT_TRUE(CheckDiskSpace("shard", 100, 50, {.free_bytes = 150}).ok);
  EXPECT_TRUE(CheckDiskSpace("shard", 100, 50, {.free_bytes = 250, .promised_bytes = 100}).ok);
}

TEST(CheckDiskSpaceTest, RefusalNamesFreeAndNeededBytesAndHowTheyAddUp) {
  const Verdict v = CheckDiskSpace("rank 1's shard of j step 5", 100, 50,
                                   {.free_bytes = 249, .promised_bytes = 100});
  EXPECT_FALSE(v.ok);
  EXPECT_THAT(v.reason, HasSubstr("for rank 1's shard of j step 5: 249 bytes free, 250 needed "
                                  "(100 to write, 100 promised to shards being written, 50 "
                                  "kept free for the store's own files)"));
  const Verdict alone = CheckDiskSpace("shard", 100, 50, {.free_bytes = 0});
  EXPECT_FALSE(alone.ok);
  EXPECT_THAT(alone.reason, HasSubstr("0 bytes free, 150 needed (100 to write, 50 kept free"));
}

}  // namespace
}  // namespace weft::checkpointd
