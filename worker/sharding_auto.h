// A generation's side of sharding.scope AUTO (job.proto): it gathers what the pure choices of
// worker/zero/sharding_choice.h need — the rendezvous' hosts, every rank's memory verdict on
// holding its host's replica (through the generation's store), the bus bandwidth the backend
// measures across the hosts — and turns their results into the groups and the spec the engine
// is built from, with the reason rank 0 reports (SHARDING_CHOSEN).
#ifndef WEFT_WORKER_SHARDING_AUTO_H_
#define WEFT_WORKER_SHARDING_AUTO_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/store.h"
#include "worker/device_backend.h"
#include "worker/zero/sharding_groups.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

struct AutoScope {
  zero::ShardingGroups groups;
  std::string reason;            // zero::ChooseScope's
  bool shard_optimizer = false;  // HOST with replica_optimizer OPTIMIZER_SHARDED
};

// The groups of `spec` (scope AUTO) over `rank_hosts` (every rank's host, in rank order) for
// rank `rank`. Where HOST groups are possible, each rank checks it could hold its host's
// replica (CheckShardedStateFits) and posts its verdict under "auto-scope/<rank>" in `store`
// (the generation's), and where the job could share its optimizer out over the replicas, its
// verdict on that under "auto-scope-sharded/<rank>"; all ranks read all verdicts (waiting up
// to `timeout`), so they decide alike. A store failure is returned (the rendezvous' peers are
// gone or the generation ended).
absl::StatusOr<AutoScope> ChooseAutoScope(Store* store, int rank,
                                          const std::vector<std::string>& rank_hosts,
                                          const weft::v1::JobSpec& spec,
                                          const DeviceOptions& device, absl::Duration timeout);

// The backend's BeforeEngine for `spec` under `scope`: the spec with the scope it chose and,
// under HOST, the replica format zero::ChooseReplicaFormat picks at the measured bandwidth
// (the compute estimated at `peak_flops`). Writes the whole reason to *note (which must
// outlive the backend's creation).
BeforeEngine SettleAutoSpec(const weft::v1::JobSpec& spec, const AutoScope& scope,
                            double peak_flops, std::string* note);

}  // namespace weft::worker

#endif  // WEFT_WORKER_SHARDING_AUTO_H_
