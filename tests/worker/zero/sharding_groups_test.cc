// ResolveShardingGroups: the groups each scope makes of a generation's world, and the hosts
// that HOST refuses, named with their rank counts.
#include "worker/zero/sharding_groups.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::zero {
namespace {

using ::testing::HasSubstr;
using weft::v1::ShardingSpec;

ShardingSpec Scope(ShardingSpec::Scope scope, int group_size = 0) {
  ShardingSpec s;
  s.set_scope(scope);
  s.set_group_size(group_size);
  return s;
}

TEST(ShardingGroupsTest, RanksAreInGroupsOfConsecutiveRanks) {
  const ShardingGroups g{6, 2};
  EXPECT_EQ(g.replicas(), 3);
  EXPECT_EQ(g.group(5), 2);
  EXPECT_EQ(g.position(5), 1);
  EXPECT_TRUE(g.hybrid());
  EXPECT_FALSE(ShardingGroups::Full(6).hybrid());
}

TEST(ShardingGroupsTest, EachScopeGroupsTheWorld) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  auto world = ResolveShardingGroups(Scope(ShardingSpec::WORLD), hosts);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(*world, ShardingGroups::Full(4));
  auto host = ResolveShardingGroups(Scope(ShardingSpec::HOST), hosts);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(*host, (ShardingGroups{4, 2}));
  auto group = ResolveShardingGroups(Scope(ShardingSpec::GROUP, 1), hosts);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(*group, (ShardingGroups{4, 1}));
  // One host: full sharding.
  auto one = ResolveShardingGroups(Scope(ShardingSpec::HOST), {"a", "a", "a"});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_FALSE(one->hybrid());
}

TEST(ShardingGroupsTest, UnevenOrScatteredHostsAreRefusedNamingTheirCounts) {
  auto uneven = ResolveShardingGroups(Scope(ShardingSpec::HOST), {"a", "a", "a", "b"});
  EXPECT_EQ(uneven.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(uneven.status().message(), HasSubstr("ranks by host: a=3, b=1"));
  auto scattered = ResolveShardingGroups(Scope(ShardingSpec::HOST), {"a", "b", "a", "b"});
  EXPECT_EQ(scattered.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(scattered.status().message(), HasSubstr("contiguous"));
  auto indivisible = ResolveShardingGroups(Scope(ShardingSpec::GROUP, 4), {"a", "a", "b"});
  EXPECT_EQ(indivisible.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(indivisible.status().message(),
              HasSubstr("sharding.group_size 4 does not divide the generation's world of 3"));
}

TEST(ShardingGroupsTest, RankHostsAreThePeersHostsInRankOrder) {
  weft::v1::JoinResponse joined;
  for (const char* host : {"a", "a", "b"}) joined.add_peers()->set_host_id(host);
  EXPECT_THAT(RankHosts(joined), ::testing::ElementsAre("a", "a", "b"));
}

}  // namespace
}  // namespace weft::zero
