#include "worker/zero/sharding_choice.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/comm/wire_codec.h"
#include "worker/comm/work.h"
#include "worker/zero/sharding_groups.h"

namespace weft::zero {
namespace {

using weft::v1::ShardingSpec;

// The assumed share of the peak a step reaches, for the compute estimate: below the 60% Weft
// measures on one host, so that the estimate errs towards exposing communication.
constexpr double kAssumedMfu = 0.4;

// Bytes one rank sends in the replica all-reduce of `elements` in `format` over `replicas`.
double SentBytes(ShardingSpec::WireFormat format, int64_t elements, int replicas) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(elements, 0));
  const comm::WireFormat wire = ToWireFormat(format);
  if (wire == comm::WireFormat::kFp32) {
    return static_cast<double>(comm::RingSentBytes(comm::OpKind::kAllReduce, n, 4, replicas));
  }
  // An AllToAll and an AllGather of one chunk to every other replica.
  const size_t chunk_bytes = comm::WireChunkBytes(wire, comm::WireChunkValues(n, replicas));
  return 2.0 * static_cast<double>(replicas - 1) * static_cast<double>(chunk_bytes);
}

std::string FormatName(ShardingSpec::WireFormat format) {
  return ShardingSpec::WireFormat_Name(format);
}

}  // namespace

ScopeChoice ChooseScope(const std::vector<std::string>& rank_hosts,
                        const absl::Status& host_fits,
                        const std::optional<absl::Status>& sharded_fits) {
  std::vector<std::string> hosts;
  for (const std::string& h : rank_hosts) {
    if (hosts.empty() || hosts.back() != h) hosts.push_back(h);
  }
  if (hosts.size() <= 1) {
    return {ShardingSpec::WORLD, false, "WORLD: one host, so sharding over every rank keeps all "
                                 "traffic on the host's own links"};
  }
  ShardingSpec host_scope;
  host_scope.set_scope(ShardingSpec::HOST);
  const absl::StatusOr<ShardingGroups> groups = ResolveShardingGroups(host_scope, rank_hosts);
  if (!groups.ok()) {
    return {ShardingSpec::WORLD, false,
            absl::StrCat("WORLD: the hosts cannot be groups of HOST (", groups.status().message(),
                         ")")};
  }
  if (!host_fits.ok() && sharded_fits.has_value() && sharded_fits->ok()) {
    return {ShardingSpec::HOST, true,
            absl::StrCat("HOST with OPTIMIZER_SHARDED: ", hosts.size(), " hosts of ",
                         groups->group_size, " ranks each; a host's ranks cannot hold a replica "
                         "of the state with its whole optimizer (", host_fits.message(),
                         ") but can with AdamW's moments shared out over the ",
                         groups->replicas(), " replicas, so the gathers stay in the host and "
                         "a gradient reduce-scatter and a weight all-gather cross hosts")};
  }
  if (!host_fits.ok()) {
    const std::string sharded =
        sharded_fits.has_value()
            ? absl::StrCat("; nor with the optimizer shared out (", sharded_fits->message(), ")")
            : "";
    return {ShardingSpec::WORLD, false,
            absl::StrCat("WORLD: the ", groups->group_size, " ranks of a host cannot hold a "
                         "replica of the state (", host_fits.message(), ")", sharded,
                         ", so it is sharded across all ", rank_hosts.size(), " ranks of the ",
                         hosts.size(), " hosts")};
  }
  return {ShardingSpec::HOST, false,
          absl::StrCat("HOST: ", hosts.size(), " hosts of ", groups->group_size,
                       " ranks each; a host's ranks hold a replica of the state, so only the "
                       "replica all-reduce of the gradient shards crosses hosts")};
}

FormatChoice ChooseReplicaFormat(const FormatChoiceInputs& in) {
  const double bytes_per_ms = in.measured_gbps * 1e9 / 8 / 1000;
  std::string costs;
  FormatChoice chosen;
  double chosen_exposed = -1;
  bool settled = false;
  for (ShardingSpec::WireFormat f :
       {ShardingSpec::WIRE_FP32, ShardingSpec::WIRE_BF16, ShardingSpec::WIRE_INT8}) {
    if (f > in.least_exact) break;
    const double ms = bytes_per_ms > 0 ? SentBytes(f, in.shard_elements, in.replicas) /
                                             bytes_per_ms
                                       : INFINITY;
    const double exposed = std::max(0.0, ms - in.last_backward_ms);
    const double share = in.step_compute_ms > 0 ? exposed / in.step_compute_ms : INFINITY;
    absl::StrAppend(&costs, costs.empty() ? "" : ", ", FormatName(f), " ",
                    absl::StrFormat("%.0f ms (%.1f%% exposed)", ms, 100 * share));
    if (settled) continue;
    if (chosen_exposed < 0 || exposed < chosen_exposed) {
      chosen.format = f;
      chosen_exposed = exposed;
    }
    if (share <= kExposedShareWorthLosing) settled = true;
  }
  absl::StrAppend(&chosen.reason, "replica all-reduce ", FormatName(chosen.format), ": ",
                  absl::StrFormat("%.1f Gb/s measured across the hosts; ", in.measured_gbps),
                  "a step's all-reduce ", costs, " of an estimated ",
                  absl::StrFormat("%.0f ms step", in.step_compute_ms),
                  settled ? absl::StrFormat("; the most exact within %.0f%% exposed",
                                            100 * kExposedShareWorthLosing)
                          : "; none is hidden, so the least exposed",
                  in.least_exact == ShardingSpec::WIRE_FP32
                      ? " (sharding.replica_reduce_format allows only WIRE_FP32)"
                      : absl::StrCat(" (sharding.replica_reduce_format allows down to ",
                                     FormatName(in.least_exact), ")"));
  return chosen;
}

StepComputeEstimate EstimateStepComputeMs(double flops_per_token, double tokens_per_rank_step,
                                          int grad_accum_steps, double peak_flops) {
  StepComputeEstimate e;
  if (!(peak_flops > 0)) return e;
  e.step_ms = 1000 * flops_per_token * tokens_per_rank_step / (peak_flops * kAssumedMfu);
  e.last_backward_ms = e.step_ms * 2.0 / 3.0 / std::max(1, grad_accum_steps);
  return e;
}

}  // namespace weft::zero
