#include "worker/sharding_auto.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/model_arch.h"
#include "worker/mfu.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/sharding_choice.h"
#include "worker/zero/zero_engine.h"

namespace weft::worker {
namespace {

using weft::v1::ShardingSpec;

std::string VerdictKey(int rank) { return absl::StrCat("auto-scope/", rank); }

// The first rank's refusal, "rank R: why" (empty when every rank's verdict is: all fit). Not
// an absl::Status in a StatusOr: a StatusOr<Status> would take the store's error for a value.
absl::StatusOr<std::string> FirstRefusal(Store* store, int world, absl::Duration timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(VerdictKey(r));
  WEFT_RETURN_IF_ERROR(store->Wait(keys, timeout));
  for (int r = 0; r < world; ++r) {
    WEFT_ASSIGN_OR_RETURN(const std::string verdict, store->Get(keys[r]));
    if (!verdict.empty()) return absl::StrCat("rank ", r, ": ", verdict);
  }
  return std::string();
}

}  // namespace

absl::StatusOr<AutoScope> ChooseAutoScope(Store* store, int rank,
                                          const std::vector<std::string>& rank_hosts,
                                          const weft::v1::JobSpec& spec,
                                          const DeviceOptions& device, absl::Duration timeout) {
  const int world = static_cast<int>(rank_hosts.size());
  ShardingSpec host_scope;
  host_scope.set_scope(ShardingSpec::HOST);
  const absl::StatusOr<zero::ShardingGroups> host_groups =
      zero::ResolveShardingGroups(host_scope, rank_hosts);
  absl::Status fits = absl::OkStatus();
  // Only where HOST is on the table (several hosts, even ones) do the ranks weigh it; all of
  // them know that from the same hosts.
  if (host_groups.ok() && host_groups->hybrid()) {
    weft::v1::JobSpec as_host = spec;
    as_host.mutable_sharding()->set_scope(ShardingSpec::HOST);
    const absl::Status mine = CheckShardedStateFits(device, as_host, host_groups->group_size,
                                                    host_groups->replicas());
    // A refusal must not be empty: an empty verdict means "fits".
    const std::string verdict =
        mine.ok() ? "" : (mine.message().empty() ? mine.ToString() : std::string(mine.message()));
    WEFT_RETURN_IF_ERROR(store->Set(VerdictKey(rank), verdict));
    WEFT_ASSIGN_OR_RETURN(const std::string refusal, FirstRefusal(store, world, timeout));
    if (!refusal.empty()) fits = absl::ResourceExhaustedError(refusal);
  }
  zero::ScopeChoice choice = zero::ChooseScope(rank_hosts, fits);
  AutoScope out;
  out.groups = choice.scope == ShardingSpec::HOST ? *host_groups
                                                   : zero::ShardingGroups::Full(world);
  out.reason = std::move(choice.reason);
  return out;
}

BeforeEngine SettleAutoSpec(const weft::v1::JobSpec& spec, const AutoScope& scope,
                            double peak_flops, std::string* note) {
  return [spec, scope, peak_flops, note](comm::Communicator&,
                                         double gbps) -> absl::StatusOr<weft::v1::JobSpec> {
    weft::v1::JobSpec settled = spec;
    ShardingSpec* sharding = settled.mutable_sharding();
    *note = scope.reason;
    if (!scope.groups.hybrid()) {
      sharding->set_scope(ShardingSpec::WORLD);
      sharding->set_replica_reduce_format(ShardingSpec::WIRE_FP32);
      return settled;
    }
    sharding->set_scope(ShardingSpec::HOST);
    WEFT_ASSIGN_OR_RETURN(const std::unique_ptr<const engine::ModelArch> arch,
                          engine::MakeModelArch(spec.model()));
    const zero::ShardLayout layout(zero::UnitSizes(*arch), scope.groups.group_size, 0);
    zero::FormatChoiceInputs in;
    in.replicas = scope.groups.replicas();
    in.measured_gbps = gbps;
    for (int u = 0; u < layout.num_units(); ++u) in.shard_elements += layout.unit(u).shard;
    const weft::v1::TrainingSpec& t = spec.training();
    const zero::StepComputeEstimate compute = zero::EstimateStepComputeMs(
        TrainingFlopsPerToken(spec.model()),
        static_cast<double>(t.micro_batch_size()) * t.sequence_length() * t.grad_accum_steps(),
        t.grad_accum_steps(), peak_flops);
    in.step_compute_ms = compute.step_ms;
    in.last_backward_ms = compute.last_backward_ms;
    in.least_exact = spec.sharding().replica_reduce_format();
    const zero::FormatChoice format = zero::ChooseReplicaFormat(in);
    sharding->set_replica_reduce_format(format.format);
    absl::StrAppend(note, "; ", format.reason);
    return settled;
  };
}

}  // namespace weft::worker
