#include "worker/zero/sharding_groups.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace weft::zero {
namespace {

// Hosts in order of their first rank, each with its rank count; false when a host's ranks are
// not contiguous.
bool CountRuns(const std::vector<std::string>& rank_hosts,
               std::vector<std::pair<std::string, int>>* runs) {
  bool contiguous = true;
  for (const std::string& host : rank_hosts) {
    if (!runs->empty() && runs->back().first == host) {
      ++runs->back().second;
      continue;
    }
    for (const auto& [seen, count] : *runs) contiguous = contiguous && seen != host;
    runs->emplace_back(host, 1);
  }
  return contiguous;
}

}  // namespace

std::vector<std::string> RankHosts(const weft::v1::JoinResponse& joined) {
  std::vector<std::string> hosts;
  hosts.reserve(joined.peers_size());
  for (const weft::v1::Peer& peer : joined.peers()) hosts.push_back(peer.host_id());
  return hosts;
}

absl::StatusOr<ShardingGroups> ResolveShardingGroups(const weft::v1::ShardingSpec& sharding,
                                                     const std::vector<std::string>& rank_hosts) {
  const int world = static_cast<int>(rank_hosts.size());
  if (world < 1) return absl::InvalidArgumentError("sharding: an empty world");
  switch (sharding.scope()) {
    case weft::v1::ShardingSpec::GROUP:
      if (sharding.group_size() < 1 || world % sharding.group_size() != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("sharding.group_size ", sharding.group_size(),
                         " does not divide the generation's world of ", world, " ranks"));
      }
      return ShardingGroups{world, sharding.group_size()};
    case weft::v1::ShardingSpec::HOST: {
      std::vector<std::pair<std::string, int>> runs;
      const bool contiguous = CountRuns(rank_hosts, &runs);
      bool equal = true;
      for (const auto& [host, count] : runs) equal = equal && count == runs.front().second;
      if (contiguous && equal) return ShardingGroups{world, runs.front().second};
      return absl::FailedPreconditionError(absl::StrCat(
          "sharding.scope HOST needs every host of the generation to run the same number of "
          "ranks, contiguous in rank order; ranks by host: ",
          absl::StrJoin(runs, ", ", [](std::string* out, const auto& run) {
            absl::StrAppend(out, run.first, "=", run.second);
          })));
    }
    default:
      return ShardingGroups::Full(world);
  }
}

comm::WireFormat ToWireFormat(weft::v1::ShardingSpec::WireFormat format) {
  switch (format) {
    case weft::v1::ShardingSpec::WIRE_BF16: return comm::WireFormat::kBf16;
    case weft::v1::ShardingSpec::WIRE_INT8: return comm::WireFormat::kInt8;
    default: return comm::WireFormat::kFp32;
  }
}

comm::WireFormat ReplicaWireFormat(const weft::v1::ShardingSpec& sharding) {
  return ToWireFormat(sharding.replica_reduce_format());
}

ShardPieces ReplicaPieces(int replicas, int replica_rank) {
  if (replicas <= 1) return {};
  return {replicas, replica_rank, comm::kWireBlock};
}

bool ShardsOptimizer(const weft::v1::ShardingSpec& sharding, int replicas) {
  return replicas > 1 &&
         sharding.replica_optimizer() == weft::v1::ShardingSpec::OPTIMIZER_SHARDED;
}

}  // namespace weft::zero
