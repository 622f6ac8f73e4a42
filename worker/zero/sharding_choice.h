// sharding.scope AUTO (job.proto): the choice of scope and replica all-reduce format as pure
// functions of what a generation knows when it starts, each returning the choice and the
// reason the job's SHARDING_CHOSEN event carries. The generation run gathers the inputs (the
// hosts of the rendezvous, every rank's memory verdict, a timed all-reduce across the hosts)
// and applies the result; nothing here does I/O.
#ifndef WEFT_WORKER_ZERO_SHARDING_CHOICE_H_
#define WEFT_WORKER_ZERO_SHARDING_CHOICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "weft/v1/job.pb.h"

namespace weft::zero {

struct ScopeChoice {
  weft::v1::ShardingSpec::Scope scope = weft::v1::ShardingSpec::WORLD;
  // HOST only: the replicas share the optimizer out (replica_optimizer OPTIMIZER_SHARDED).
  bool shard_optimizer = false;
  std::string reason;
};

// HOST when the ranks (`rank_hosts`: each rank's host, in rank order) span several hosts with
// the same number of contiguous ranks each and every rank can hold its host's shard of the
// state (`host_fits`: OK, or the first refusal among the ranks); else HOST with the optimizer
// shared out over the replicas when every rank can hold that (`sharded_fits`, weighed only
// where the job could take it: not with an offloaded optimizer); WORLD otherwise.
ScopeChoice ChooseScope(const std::vector<std::string>& rank_hosts, const absl::Status& host_fits,
                        const std::optional<absl::Status>& sharded_fits = std::nullopt);

struct FormatChoiceInputs {
  int replicas = 2;
  // Bus bandwidth of an all-reduce across the hosts, measured at the start of the generation
  // (the mean over ranks, so that every rank decides the same).
  double measured_gbps = 0;
  // Elements of a rank's gradient shards: what the replica all-reduce carries each step.
  int64_t shard_elements = 0;
  // Estimated compute of a step and of its last micro-step's backward, which the replica
  // all-reduce overlaps (EstimateStepComputeMs).
  double step_compute_ms = 0;
  double last_backward_ms = 0;
  // sharding.replica_reduce_format: the least exact format the job allows.
  weft::v1::ShardingSpec::WireFormat least_exact = weft::v1::ShardingSpec::WIRE_FP32;
};

struct FormatChoice {
  weft::v1::ShardingSpec::WireFormat format = weft::v1::ShardingSpec::WIRE_FP32;
  std::string reason;
};

// The exposed share of a step a replica all-reduce may cost before a less exact format is
// worth its error: 5%.
inline constexpr double kExposedShareWorthLosing = 0.05;

// The most exact allowed format whose all-reduce, at the measured bandwidth, is hidden behind
// the last backward but for at most kExposedShareWorthLosing of the step; when none is, the
// least exposed.
FormatChoice ChooseReplicaFormat(const FormatChoiceInputs& in);

// A step's compute time, estimated from the model's FLOPs: 6 x parameters + attention per
// token (worker/mfu.h's count, `flops_per_token`), over `peak_flops` at an assumed 40% MFU;
// and the last micro-step's backward (two thirds of a micro-step).
struct StepComputeEstimate {
  double step_ms = 0;
  double last_backward_ms = 0;
};
StepComputeEstimate EstimateStepComputeMs(double flops_per_token, double tokens_per_rank_step,
                                          int grad_accum_steps, double peak_flops);

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_SHARDING_CHOICE_H_
