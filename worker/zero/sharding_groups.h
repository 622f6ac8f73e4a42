// Hybrid sharding (JobSpec.sharding, HSDP): how a world of W ranks splits into R replicas of a
// group of S ranks. Rank r is in group r / S at position r % S; ZeRO-3 state is sharded over a
// group (ShardLayout over S ranks at position r % S) and replicated across groups, so
// parameter all-gathers and gradient reduce-scatters stay inside a group and only the
// all-reduce of each gradient shard runs over the R ranks at the same position (the replica).
// S == W is plain full sharding.
#ifndef WEFT_WORKER_ZERO_SHARDING_GROUPS_H_
#define WEFT_WORKER_ZERO_SHARDING_GROUPS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/wire_format.h"
#include "worker/zero/shard_layout.h"
#include "weft/v1/coordinator.pb.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

struct ShardingGroups {
  int world = 1;
  int group_size = 1;  // S; divides world

  // Full sharding over `world`.
  static ShardingGroups Full(int world) { return {world, world}; }
  int replicas() const { return world / group_size; }
  int group(int rank) const { return rank / group_size; }
  int position(int rank) const { return rank % group_size; }
  bool hybrid() const { return group_size < world; }
  bool operator==(const ShardingGroups&) const = default;
};

// The host of every rank of a Join answered with include_peers, in rank order: Peer.host_id
// (the machine as its workers state it, which is what orders ranks). The one place that says
// which host a rank is on.
std::vector<std::string> RankHosts(const weft::v1::JoinResponse& joined);

// The groups `sharding` makes of a world of rank_hosts.size() ranks. WORLD: one group. GROUP:
// group_size ranks (INVALID_ARGUMENT when it does not divide the world, which the scheduler
// prevents). HOST: one group per host; FAILED_PRECONDITION naming every host and its rank
// count when hosts differ in count or a host's ranks are not contiguous.
absl::StatusOr<ShardingGroups> ResolveShardingGroups(const weft::v1::ShardingSpec& sharding,
                                                     const std::vector<std::string>& rank_hosts);

// A ShardingSpec wire format as the communicators' (an unknown value, which the spec's
// validation refuses, as fp32); ReplicaWireFormat: that of sharding.replica_reduce_format.
comm::WireFormat ToWireFormat(weft::v1::ShardingSpec::WireFormat format);
comm::WireFormat ReplicaWireFormat(const weft::v1::ShardingSpec& sharding);

// The pieces a rank's shards are cut into (ShardLayout): one per replica, the replica's rank
// its own, aligned to the wire codec's blocks, with `replicas` > 1; one piece (the whole shard)
// otherwise. ShardsOptimizer: whether each replica keeps and steps only its piece
// (replica_optimizer OPTIMIZER_SHARDED, with replicas).
ShardPieces ReplicaPieces(int replicas, int replica_rank);
bool ShardsOptimizer(const weft::v1::ShardingSpec& sharding, int replicas);

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_SHARDING_GROUPS_H_
