#include "worker/zero/memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace weft::zero {
namespace {

using engine::Checkpointing;

double GiB(size_t bytes) { return static_cast<double>(bytes) / (1u << 30); }

constexpr Checkpointing kLevels[] = {Checkpointing::kNone, Checkpointing::kSelective,
                                     Checkpointing::kFull};
// How far the "more GPUs" hint looks.
constexpr int kMaxWorldHint = 4096;

bool IsAuto(weft::v1::ActivationCheckpointing::Level level) {
  return level == weft::v1::ActivationCheckpointing::AUTO ||
         level == weft::v1::ActivationCheckpointing::LEVEL_UNSPECIFIED;
}

// What would fit instead, lightest change first; empty when nothing does.
std::vector<std::string> Alternatives(Checkpointing tried_last, size_t free_bytes,
                                      int micro_batch_size, int world, bool automatic,
                                      const MemoryPlanner& plan) {
  std::vector<std::string> out;
  if (!automatic) {
    for (Checkpointing level : kLevels) {
      const GpuMemoryPlan p = plan(level, micro_batch_size, world);
      if (p.total() <= free_bytes) {
        out.push_back(absl::StrFormat("training.activation_checkpointing: %s (%.2f GiB)",
                                      absl::AsciiStrToUpper(std::string(CheckpointingName(level))),
                                      GiB(p.total())));
        break;
      }
    }
  }
  // The most recomputation on offer keeps the other hints as small a change as they can be.
  const Checkpointing level = automatic ? Checkpointing::kFull : tried_last;
  for (int rows = micro_batch_size - 1; rows >= 1; --rows) {
    const GpuMemoryPlan p = plan(level, rows, world);
    if (p.total() <= free_bytes) {
      out.push_back(absl::StrFormat("training.micro_batch_size: %d (%.2f GiB)", rows,
                                    GiB(p.total())));
      break;
    }
  }
  for (int w = world + 1; w <= kMaxWorldHint; ++w) {
    const GpuMemoryPlan p = plan(level, micro_batch_size, w);
    if (p.total() <= free_bytes) {
      out.push_back(absl::StrFormat("resources.min_workers: %d GPUs (%.2f GiB each)", w,
                                    GiB(p.total())));
      break;
    }
  }
  return out;
}

// Under `level` (which fits), the most blocks one level lighter that still fit, the first
// blocks or the last (engine::CheckpointingPlan says why the end can matter; the first on a
// tie). Each lighter block only adds memory, so at either end the count that fits is found by
// bisection.
engine::CheckpointingPlan MostLighterBlocks(Checkpointing level, size_t free_bytes,
                                            int micro_batch_size, int world, int num_layers,
                                            const MemoryPlanner& plan) {
  const auto most = [&](const auto& lighter) {
    int lo = 0, hi = num_layers - 1;  // all lighter is the uniform level that did not fit
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (plan(lighter(mid), micro_batch_size, world).total() <= free_bytes) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };
  const auto first = [&](int k) { return engine::CheckpointingPlan(level, k); };
  const auto last = [&](int k) {
    return engine::CheckpointingPlan(level, num_layers - k, num_layers);
  };
  const int at_start = most(first);
  const int at_end = most(last);
  return at_end > at_start ? last(at_end) : first(at_start);
}

}  // namespace

std::string DescribeGpuMemoryPlan(const GpuMemoryPlan& plan) {
  return absl::StrFormat(
      "%.2f GiB (parameter/optimizer shards %.2f, gathered blocks and gradients %.2f, "
      "activations and gathered head %.2f%s, NCCL and runtime reserve %.2f%s)",
      GiB(plan.total()), GiB(plan.state_bytes), GiB(plan.working_bytes),
      GiB(plan.activation_bytes),
      plan.spent_activation_grad_bytes == 0
          ? ""
          : absl::StrFormat(" beyond the %.2f of shard gradients they hold",
                            GiB(plan.spent_activation_grad_bytes)),
      GiB(plan.reserve_bytes),
      plan.host_bytes == 0
          ? ""
          : absl::StrFormat("; plus %.2f GiB of pinned host memory for the offloaded optimizer",
                            GiB(plan.host_bytes)));
}

namespace {
// The levels a decision tries, lightest first: every one under AUTO, else the one named.
std::vector<Checkpointing> LevelsToTry(weft::v1::ActivationCheckpointing::Level requested) {
  if (IsAuto(requested)) return {std::begin(kLevels), std::end(kLevels)};
  return {engine::CheckpointingFromSpec(requested, Checkpointing::kNone)};
}
}  // namespace

MemoryDecision DecideMemory(weft::v1::ActivationCheckpointing::Level requested,
                            size_t free_bytes, int micro_batch_size, int world, int num_layers,
                            const MemoryPlanner& plan, std::string_view budget) {
  const bool automatic = IsAuto(requested);
  const std::vector<Checkpointing> candidates = LevelsToTry(requested);
  std::vector<std::string> too_big;
  MemoryDecision decision;
  for (Checkpointing level : candidates) {
    const GpuMemoryPlan p = plan(level, micro_batch_size, world);
    if (p.total() <= free_bytes) {
      decision.fits = true;
      decision.level = level;
      decision.plan = p;
      if (automatic && level != Checkpointing::kNone && num_layers > 1) {
        decision.level =
            MostLighterBlocks(level, free_bytes, micro_batch_size, world, num_layers, plan);
        decision.plan = plan(decision.level, micro_batch_size, world);
      }
      decision.reason = absl::StrFormat(
          "activation checkpointing %s (%s): %s per GPU of %.2f GiB %s%s",
          engine::DescribeCheckpointing(decision.level),
          automatic ? "chosen by AUTO" : "as asked", DescribeGpuMemoryPlan(decision.plan),
          GiB(free_bytes), budget,
          too_big.empty() ? "" : absl::StrCat("; ", absl::StrJoin(too_big, ", ")));
      return decision;
    }
    too_big.push_back(absl::StrFormat("%s would need %.2f GiB", CheckpointingName(level),
                                      GiB(p.total())));
    decision.plan = p;
    decision.level = level;
  }
  const std::vector<std::string> instead = Alternatives(
      decision.level.level, free_bytes, micro_batch_size, world, automatic, plan);
  decision.reason = absl::StrFormat(
      "GPU memory: the job needs %s per GPU at world size %d, micro_batch_size %d, activation "
      "checkpointing %s, but %.2f GiB is %s (%s). %s",
      DescribeGpuMemoryPlan(decision.plan), world, micro_batch_size,
      CheckpointingName(decision.level.level), GiB(free_bytes), budget,
      absl::StrJoin(too_big, ", "),
      instead.empty()
          ? "Nothing within reach fits: lower training.sequence_length or the model's size."
          : absl::StrCat("It would fit with ", absl::StrJoin(instead, ", or "), "."));
  return decision;
}

int FirstOffloadedUnit(const std::vector<size_t>& unit_sizes,
                       const weft::v1::OptimizerSpec& optimizer) {
  const int n = static_cast<int>(unit_sizes.size());
  if (!optimizer.offload()) return n;
  const double fraction = optimizer.offload_fraction();
  if (fraction <= 0.0 || fraction >= 1.0) return 0;
  double total = 0;
  for (size_t size : unit_sizes) total += static_cast<double>(size);
  double taken = 0;
  for (int first = n - 1; first >= 0; --first) {
    taken += static_cast<double>(unit_sizes[first]);
    if (taken >= fraction * total) return first;
  }
  return 0;
}

std::string OffloadFractionFor(const std::vector<size_t>& unit_sizes, int first) {
  double total = 0, taken = 0;
  for (size_t u = 0; u < unit_sizes.size(); ++u) {
    total += static_cast<double>(unit_sizes[u]);
    if (static_cast<int>(u) >= first) taken += static_cast<double>(unit_sizes[u]);
  }
  const double share = total > 0 ? taken / total : 1.0;
  weft::v1::OptimizerSpec optimizer;
  optimizer.set_offload(true);
  // Rounded down, a share never asks for more than these units; enough places make it no less.
  for (int places = 2; places <= 9; ++places) {
    const double scale = std::pow(10.0, places);
    const double rounded = std::floor(share * scale) / scale;
    optimizer.set_offload_fraction(rounded);
    if (rounded > 0 && FirstOffloadedUnit(unit_sizes, optimizer) == first) {
      return absl::StrFormat("%.*f", places, rounded);
    }
  }
  return absl::StrFormat("%.9f", share);
}

int LeastOffloadThatFits(int current_first, size_t free_bytes,
                         const std::function<GpuMemoryPlan(int first)>& plan_at) {
  // Each unit offloaded only lowers the device's need, so scanning down finds the least.
  for (int first = current_first - 1; first >= 0; --first) {
    if (plan_at(first).total() <= free_bytes) return first;
  }
  return -1;
}

std::string OffloadThatFits(const std::vector<size_t>& unit_sizes, int current_first,
                            size_t free_bytes,
                            const std::function<GpuMemoryPlan(int first)>& plan_at) {
  const int first = LeastOffloadThatFits(current_first, free_bytes, plan_at);
  if (first < 0) return "";
  const GpuMemoryPlan p = plan_at(first);
  return absl::StrFormat(
      "optimizer.offload: true with offload_fraction: %s (%.2f GiB per GPU, plus %.2f GiB of "
      "pinned host memory), or optimizer.offload_auto: true instead",
      first == 0 ? "1" : OffloadFractionFor(unit_sizes, first), GiB(p.total()),
      GiB(p.host_bytes));
}

absl::Status CheckHostMemory(const GpuMemoryPlan& plan, size_t host_available_bytes, int world,
                             int ranks_on_host) {
  ranks_on_host = std::max(ranks_on_host, 1);
  const size_t need = plan.host_bytes * static_cast<size_t>(ranks_on_host);
  if (need <= host_available_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "host memory: optimizer.offload needs %.2f GiB of pinned host memory per GPU at world "
      "size %d%s, but the host has %.2f GiB available (MemAvailable); run on more GPUs or "
      "hosts, with a smaller optimizer.offload_fraction, or without optimizer.offload",
      GiB(plan.host_bytes), world,
      ranks_on_host == 1
          ? ""
          : absl::StrFormat(", %.2f GiB for the job's %d ranks on this host", GiB(need),
                            ranks_on_host),
      GiB(host_available_bytes)));
}

namespace {

// A part of a CPU plan: GiB from one up, else MiB, so small parts do not read 0.00.
std::string Size(size_t bytes) {
  if (bytes >= (size_t{1} << 30)) return absl::StrFormat("%.2f GiB", GiB(bytes));
  return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1u << 20));
}

// The smallest group in (group, kMaxWorldHint] whose plan fits, or 0. A larger group never
// needs more (each shard only shrinks; the activations stay), so it is found by bisection.
int SmallestGroupThatFits(engine::Checkpointing level, size_t budget, int micro_batch_size,
                          int group, int stage, const CpuMemoryPlanner& plan) {
  if (plan(level, micro_batch_size, kMaxWorldHint, stage).total() > budget) return 0;
  int lo = group + 1, hi = kMaxWorldHint;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (plan(level, micro_batch_size, mid, stage).total() <= budget) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// What would fit instead of the refused job, lightest change first; empty when nothing does.
std::vector<std::string> CpuAlternatives(engine::Checkpointing tried_last, bool automatic,
                                         size_t budget, int micro_batch_size, int group,
                                         int stage, bool hybrid, const CpuMemoryPlanner& plan) {
  std::vector<std::string> out;
  const auto fits = [&](const CpuMemoryPlan& p) { return p.total() <= budget; };
  if (!automatic) {
    for (Checkpointing level : kLevels) {
      const CpuMemoryPlan p = plan(level, micro_batch_size, group, stage);
      if (level != tried_last && fits(p)) {
        out.push_back(absl::StrFormat(
            "training.activation_checkpointing: %s (%s)",
            absl::AsciiStrToUpper(std::string(CheckpointingName(level))), Size(p.total())));
        break;
      }
    }
  }
  // The most recomputation on offer keeps the other hints as small a change as they can be.
  const Checkpointing level = automatic ? Checkpointing::kFull : tried_last;
  for (int rows = micro_batch_size - 1; rows >= 1; --rows) {
    const CpuMemoryPlan p = plan(level, rows, group, stage);
    if (fits(p)) {
      out.push_back(absl::StrFormat("training.micro_batch_size: %d (%s)", rows, Size(p.total())));
      break;
    }
  }
  if (stage < 3) {
    const CpuMemoryPlan p = plan(level, micro_batch_size, group, 3);
    if (fits(p)) out.push_back(absl::StrFormat("zero_stage: 3 (%s)", Size(p.total())));
  }
  if (const int more = SmallestGroupThatFits(level, budget, micro_batch_size, group, stage, plan);
      more > 0) {
    const std::string need = Size(plan(level, micro_batch_size, more, stage).total());
    out.push_back(hybrid ? absl::StrFormat("sharding groups of %d ranks (%s per rank)", more, need)
                         : absl::StrFormat("resources.min_workers: %d, the added workers on "
                                           "other hosts (%s per rank)",
                                           more, need));
  }
  return out;
}

}  // namespace

std::string DescribeCpuMemoryPlan(const CpuMemoryPlan& plan) {
  return absl::StrFormat(
      "%s (parameter/optimizer state %s, gathered units and buffers %s, activations %s, "
      "checkpoint copy %s, communication and process reserve %s)",
      Size(plan.total()), Size(plan.state_bytes), Size(plan.working_bytes),
      Size(plan.activation_bytes), Size(plan.checkpoint_bytes), Size(plan.reserve_bytes));
}

CpuMemoryDecision DecideCpuMemory(weft::v1::ActivationCheckpointing::Level requested,
                                  size_t host_available_bytes, int ranks_on_host,
                                  int micro_batch_size, int group, int stage, bool hybrid,
                                  const CpuMemoryPlanner& plan) {
  ranks_on_host = std::max(ranks_on_host, 1);
  const size_t budget = host_available_bytes / static_cast<size_t>(ranks_on_host);
  const std::string available =
      ranks_on_host == 1
          ? absl::StrFormat("%s available on this host (MemAvailable)",
                            Size(host_available_bytes))
          : absl::StrFormat("%s available to each of the job's %d ranks on this host "
                            "(MemAvailable %s)",
                            Size(budget), ranks_on_host, Size(host_available_bytes));
  const bool automatic = IsAuto(requested);
  const std::vector<Checkpointing> candidates = LevelsToTry(requested);
  std::vector<std::string> too_big;
  CpuMemoryDecision decision;
  for (Checkpointing level : candidates) {
    decision.level = level;
    decision.plan = plan(level, micro_batch_size, group, stage);
    if (decision.plan.total() <= budget) {
      decision.fits = true;
      decision.reason = absl::StrFormat(
          "activation checkpointing %s (%s): %s per rank of %s%s", CheckpointingName(level),
          automatic ? "chosen by AUTO" : "as asked", DescribeCpuMemoryPlan(decision.plan),
          available, too_big.empty() ? "" : absl::StrCat("; ", absl::StrJoin(too_big, ", ")));
      return decision;
    }
    too_big.push_back(absl::StrFormat("%s would need %s", CheckpointingName(level),
                                      Size(decision.plan.total())));
  }
  const std::vector<std::string> instead = CpuAlternatives(
      decision.level, automatic, budget, micro_batch_size, group, stage, hybrid, plan);
  decision.reason = absl::StrFormat(
      "host memory: the job needs %s per rank at ZeRO stage %d over %d ranks, micro_batch_size "
      "%d, activation checkpointing %s, but %s (%s). %s",
      DescribeCpuMemoryPlan(decision.plan), stage, group, micro_batch_size,
      CheckpointingName(decision.level), available, absl::StrJoin(too_big, ", "),
      instead.empty()
          ? "Nothing within reach fits: lower training.sequence_length or the model's size."
          : absl::StrCat("It would fit with ", absl::StrJoin(instead, ", or "), "."));
  return decision;
}

size_t HostAvailableBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return SIZE_MAX;
}

}  // namespace weft::zero
