#include "worker/sharding_auto.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "worker/engine/model_arch.h"
#include "worker/mfu.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/sharding_choice.h"
#include "worker/zero/zero_engine.h"

namespace weft::worker {
namespace {

using weft::v1::ShardingSpec;

// A rank's verdict on holding its host's replica, with the job's optimizer ("auto-scope/") or
// with the optimizer shared out over the replicas ("auto-scope-sharded/").
std::string VerdictKey(absl::string_view kind, int rank) { return absl::StrCat(kind, rank); }
constexpr absl::string_view kReplicated = "auto-scope/";
constexpr absl::string_view kSharded = "auto-scope-sharded/";

// Posts this rank's verdict: empty means "fits", so a refusal must not be.
absl::Status PostVerdict(Store* store, absl::string_view kind, int rank,
                         const absl::Status& mine) {
  const std::string verdict =
      mine.ok() ? "" : (mine.message().empty() ? mine.ToString() : std::string(mine.message()));
  return store->Set(VerdictKey(kind, rank), verdict);
}

// The first rank's refusal, "rank R: why" (empty when every rank's verdict is: all fit). Not
// an absl::Status in a StatusOr: a StatusOr<Status> would take the store's error for a value.
absl::StatusOr<std::string> FirstRefusal(Store* store, absl::string_view kind, int world,
                                         absl::Duration timeout) {
  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(VerdictKey(kind, r));
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
  std::optional<absl::Status> sharded_fits;
  // Only where HOST is on the table (several hosts, even ones) do the ranks weigh it; all of
  // them know that from the same hosts. The job's own optimizer first; then, where the job
  // could take it (its optimizer neither shared out already nor offloaded), the optimizer
  // shared out over the replicas. Every rank posts both verdicts before reading any.
  if (host_groups.ok() && host_groups->hybrid()) {
    weft::v1::JobSpec as_host = spec;
    as_host.mutable_sharding()->set_scope(ShardingSpec::HOST);
    const int group = host_groups->group_size, replicas = host_groups->replicas();
    WEFT_RETURN_IF_ERROR(PostVerdict(store, kReplicated, rank,
                                     CheckShardedStateFits(device, as_host, group, replicas)));
    const bool weigh_sharded =
        as_host.sharding().replica_optimizer() != ShardingSpec::OPTIMIZER_SHARDED &&
        !spec.optimizer().offload() && !spec.optimizer().offload_auto();
    if (weigh_sharded) {
      weft::v1::JobSpec as_sharded = as_host;
      as_sharded.mutable_sharding()->set_replica_optimizer(ShardingSpec::OPTIMIZER_SHARDED);
      WEFT_RETURN_IF_ERROR(PostVerdict(
          store, kSharded, rank, CheckShardedStateFits(device, as_sharded, group, replicas)));
    }
    WEFT_ASSIGN_OR_RETURN(const std::string refusal,
                          FirstRefusal(store, kReplicated, world, timeout));
    if (!refusal.empty()) fits = absl::ResourceExhaustedError(refusal);
    if (weigh_sharded) {
      WEFT_ASSIGN_OR_RETURN(const std::string sharded,
                            FirstRefusal(store, kSharded, world, timeout));
      sharded_fits = sharded.empty() ? absl::OkStatus() : absl::ResourceExhaustedError(sharded);
    }
  }
  zero::ScopeChoice choice = zero::ChooseScope(rank_hosts, fits, sharded_fits);
  AutoScope out;
  out.groups = choice.scope == ShardingSpec::HOST ? *host_groups
                                                   : zero::ShardingGroups::Full(world);
  out.shard_optimizer = choice.shard_optimizer;
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
      sharding->set_replica_optimizer(ShardingSpec::OPTIMIZER_REPLICATED);
      return settled;
    }
    sharding->set_scope(ShardingSpec::HOST);
    if (scope.shard_optimizer) {
      sharding->set_replica_optimizer(ShardingSpec::OPTIMIZER_SHARDED);
    }
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
