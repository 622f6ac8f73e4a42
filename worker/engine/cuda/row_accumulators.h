// How the CUDA backwards that reduce a whole row per warp in shared memory (LayerNorm,
// RMSNorm) are launched: host code alone, so that it is tested without a GPU.
#ifndef WEFT_WORKER_ENGINE_CUDA_ROW_ACCUMULATORS_H_
#define WEFT_WORKER_ENGINE_CUDA_ROW_ACCUMULATORS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace weft::engine::cuda::internal {

// Dynamic shared memory a kernel may plan on without asking the device: what every GPU the
// engine runs on (compute capability 8.0 and newer) grants one block that opts in (99 KiB on
// sm_86, sm_89 and sm_120, more on sm_80, sm_90 and sm_100). Shapes planned on it, rather than
// on this device's limit, are the same on every GPU, and so is the order of their sums.
inline constexpr size_t kPortableSharedBytes = 96 * 1024;

// The launch of a backward that keeps, in each warp, fp32 accumulators for a whole row in
// shared memory (`floats_per_channel` a channel: LayerNorm's dweight and dbias 2, RMSNorm's
// dweight 1), sums its warps in order into one partial row per block and leaves the partials to
// LaunchAddColumnSums: as many warps a block as fit kPortableSharedBytes, at most
// kMaxRowAccumulatorWarps, and at most kMaxRowAccumulatorBlocks blocks. A function of (n, c)
// alone, so the order of the sums is too.
inline constexpr int kMaxRowAccumulatorWarps = 4;
inline constexpr int kMaxRowAccumulatorBlocks = 1024;
struct RowAccumulatorLaunch {
  int warps = 0;  // a block; 0 when C is too wide for even one warp's accumulators
  int blocks = 0;  // partial rows (counted as with one warp when C is too wide)
  size_t shared_bytes = 0;
};

inline RowAccumulatorLaunch PlanRowAccumulators(int n, int c, int floats_per_channel) {
  const size_t per_warp = static_cast<size_t>(floats_per_channel) * c * sizeof(float);
  const size_t fit = per_warp == 0 ? kMaxRowAccumulatorWarps : kPortableSharedBytes / per_warp;
  RowAccumulatorLaunch launch;
  launch.warps = static_cast<int>(fit < kMaxRowAccumulatorWarps ? fit : kMaxRowAccumulatorWarps);
  const int warps = launch.warps > 0 ? launch.warps : 1;
  const int blocks = (n + warps - 1) / warps;
  launch.blocks = blocks < kMaxRowAccumulatorBlocks ? blocks : kMaxRowAccumulatorBlocks;
  launch.shared_bytes = launch.warps * per_warp;
  return launch;
}

// The widest C whose accumulators fit one warp.
inline int RowAccumulatorMaxChannels(int floats_per_channel) {
  return static_cast<int>(kPortableSharedBytes / (floats_per_channel * sizeof(float)));
}

// INVALID_ARGUMENT naming `op`, C and the widest C, when C is too wide for one warp.
inline absl::Status CheckRowAccumulatorWidth(const char* op, int c, int floats_per_channel) {
  const int widest = RowAccumulatorMaxChannels(floats_per_channel);
  if (c <= widest) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      op, ": c = ", c, " is wider than the ", widest,
      " channels whose accumulators fit in one block's shared memory"));
}

}  // namespace weft::engine::cuda::internal

#endif  // WEFT_WORKER_ENGINE_CUDA_ROW_ACCUMULATORS_H_
