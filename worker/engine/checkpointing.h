// Activation checkpointing as the engines take it: the JobSpec's
// training.activation_checkpointing with AUTO already resolved (by the memory plan on a GPU,
// to kNone on the CPU). A model created at a level keeps, per block:
//   kNone       every activation its backward reads;
//   kSelective  the block input and the matmul outputs (and the small per-row statistics);
//               the backward first recomputes the norms' outputs and the MLP activation, and
//               either attention's output (keeping the mid-block residual) or, in the CUDA
//               Llama, the mid-block residual from the kept attention output;
//   kFull       the block input only; the backward first re-runs the block's forward.
// The recomputation runs the same kernels on the same inputs as the forward did, so the
// losses and gradients are identical to kNone's (bit for bit).
#ifndef WEFT_WORKER_ENGINE_CHECKPOINTING_H_
#define WEFT_WORKER_ENGINE_CHECKPOINTING_H_

#include <string>
#include <string_view>

#include "weft/v1/job.pb.h"

namespace weft::engine {

enum class Checkpointing { kNone, kSelective, kFull };

// A block activation's kind, which decides at which levels every layer keeps its own copy; a
// model keeps the others in one set all layers share and recomputes them in the backward.
enum class ActKind {
  kSaved,  // a matmul output (or the mid-block residual, or in the CUDA Llama attention's
           // output instead) or a per-row statistic: per layer at kNone and kSelective
  kCheap,  // a norm's output, the MLP activation, attention's output (and, on the CPU, its
           // softmax; in the CUDA Llama the mid-block residual instead): per layer at kNone
           // only
};

inline bool KeptPerLayer(Checkpointing level, ActKind kind) {
  return level == Checkpointing::kNone ||
         (level == Checkpointing::kSelective && kind == ActKind::kSaved);
}

// "none", "selective", "full": for logs, events and BENCH lines.
inline std::string_view CheckpointingName(Checkpointing level) {
  switch (level) {
    case Checkpointing::kNone: return "none";
    case Checkpointing::kSelective: return "selective";
    case Checkpointing::kFull: return "full";
  }
  return "?";
}

// The next lighter level: FULL -> SELECTIVE -> NONE (NONE stays).
inline Checkpointing Lighter(Checkpointing level) {
  return level == Checkpointing::kFull ? Checkpointing::kSelective : Checkpointing::kNone;
}

// A level per block: blocks [lighter_begin, lighter_end) at Lighter(level), the others at
// `level`. The memory plan's AUTO spends what a uniform level leaves free on the device this
// way (the lightest uniform level that fits, then as many blocks one step lighter as still
// fit); a level a job names runs uniform. Which blocks are lighter does not matter for time.
// For memory it can: with gradients over spent activations (worker/zero/zero_cuda.h) the last
// blocks' activations lie under gradients not yet written when the backward peaks, block 0's
// do not; beyond one GPU a lighter last block may take the head's gradient out of its turn.
// AUTO tries the first blocks and the last.
struct CheckpointingPlan {
  CheckpointingPlan() = default;
  // A uniform plan: implicit, so a plain level reads as one wherever a plan is taken.
  CheckpointingPlan(Checkpointing uniform) : level(uniform) {}  // NOLINT(runtime/explicit)
  // Blocks [0, lighter) one level lighter.
  CheckpointingPlan(Checkpointing base, int lighter) : level(base), lighter_end(lighter) {}
  // Blocks [begin, end) one level lighter.
  CheckpointingPlan(Checkpointing base, int begin, int end)
      : level(base), lighter_begin(begin), lighter_end(end) {}

  Checkpointing At(int layer) const {
    return layer >= lighter_begin && layer < lighter_end ? Lighter(level) : level;
  }
  int lighter_count() const {
    return lighter_end > lighter_begin ? lighter_end - lighter_begin : 0;
  }
  bool operator==(const CheckpointingPlan&) const = default;

  Checkpointing level = Checkpointing::kNone;
  int lighter_begin = 0;
  int lighter_end = 0;
};

// "full", or "full, selective for blocks 0-16" (or "... blocks 20-31"): for logs and events.
inline std::string DescribeCheckpointing(const CheckpointingPlan& plan) {
  std::string out(CheckpointingName(plan.level));
  if (plan.lighter_count() > 0 && plan.level != Checkpointing::kNone) {
    out += ", ";
    out += CheckpointingName(Lighter(plan.level));
    out += plan.lighter_count() == 1
               ? " for block " + std::to_string(plan.lighter_begin)
               : " for blocks " + std::to_string(plan.lighter_begin) + "-" +
                     std::to_string(plan.lighter_end - 1);
  }
  return out;
}

// The level a spec names; AUTO and UNSPECIFIED give `automatic` (the caller's resolution).
inline Checkpointing CheckpointingFromSpec(weft::v1::ActivationCheckpointing::Level level,
                                           Checkpointing automatic) {
  switch (level) {
    case weft::v1::ActivationCheckpointing::NONE: return Checkpointing::kNone;
    case weft::v1::ActivationCheckpointing::SELECTIVE: return Checkpointing::kSelective;
    case weft::v1::ActivationCheckpointing::FULL: return Checkpointing::kFull;
    default: return automatic;
  }
}

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_CHECKPOINTING_H_
