// The mixed-precision optimizer on device-resident flat shards: AdamW's kernel and launcher
// (adamw.cc folds the AdamWConfig and the bias corrections into scalars). Same per-element
// math as engine::AdamWUpdate (worker/engine/adamw.cc):
//   g = grad_scale * grads[i]; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2
//   p = p - lr * (m / c1) / (sqrt(v / c2) + eps) - lr * wd * p_old * (mask[i] != 0)
// Elementwise, so independent of the sharding; results match the CPU op to a few ulp (nvcc
// contracts multiply-adds into FMAs, the CPU build does not).
//
// fp32 master weights, m and v; the update optionally also writes a bf16 copy, and reads
// grad_scale on the device. Decay is per call (a run of elements that all decay or all do
// not): the engine keeps the runs, not a byte per parameter. Also the optimizer's helpers: the
// fp32 -> bf16 cast, and the global-norm clipping pieces (sum of squares in two phases with
// fixed-order partials, so deterministic; the clip factor computed on the device).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/engine/cuda/bf16.cuh"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/launch.cuh"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

using internal::AdamWScalars;

// One element's update: m and v in place, returns the new parameter.
__device__ inline float AdamWElement(float p, float g, float* m, float* v, bool decay,
                                     const AdamWScalars& a) {
  const float mi = a.beta1 * *m + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * *v + (1.0f - a.beta2) * g * g;
  *m = mi;
  *v = vi;
  const float m_hat = mi / a.correction1;
  const float v_hat = vi / a.correction2;
  // Decay reads the parameter before the Adam step, as PyTorch's AdamW and the CPU op.
  const float decay_term = decay ? a.lr_wd * p : 0.0f;
  return (p - a.lr * m_hat / (sqrtf(v_hat) + a.eps)) - decay_term;
}

// The elements are split at 16-byte boundaries (see Split): `head` scalar elements, then
// `vecs` float4s, then the scalar rest. Each float4 lane is one element's update exactly as
// the scalar path does it: vectorising changes the memory transactions, not the math.
struct Split {
  int64_t head;  // elements before the first 16-byte boundary
  int64_t vecs;  // float4s after it
  int64_t n;     // all elements
};

template <bool kWriteBf16>
__global__ void AdamWKernel(float* __restrict__ params,              // (n)
                            bf16* __restrict__ params_bf16,          // (n) when kWriteBf16
                            const float* __restrict__ grads,         // (n)
                            float* __restrict__ m,                   // (n)
                            float* __restrict__ v,                   // (n)
                            Split split, bool decay, AdamWScalars scalars,
                            const float* __restrict__ grad_scale) {  // device scalar
  const float scale = *grad_scale;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (isnan(scale)) {  // a skipped step (ClipScale: the gradient was not finite)
    // The copy still holds the (unchanged) master: a gather may send it in place of a cast.
    if constexpr (kWriteBf16) {
      for (int64_t i = first; i < split.n; i += stride) {
        params_bf16[i] = __float2bfloat16(params[i]);
      }
    }
    return;
  }
  const auto one = [&](int64_t i) {
    const float p = AdamWElement(params[i], grads[i] * scale, m + i, v + i, decay, scalars);
    params[i] = p;
    if constexpr (kWriteBf16) params_bf16[i] = __float2bfloat16(p);
  };
  float4* p4 = reinterpret_cast<float4*>(params + split.head);
  const float4* g4 = reinterpret_cast<const float4*>(grads + split.head);
  float4* m4 = reinterpret_cast<float4*>(m + split.head);
  float4* v4 = reinterpret_cast<float4*>(v + split.head);
  for (int64_t i = first; i < split.vecs; i += stride) {
    float4 p = p4[i];
    const float4 g = g4[i];
    float4 mi = m4[i];
    float4 vi = v4[i];
    p.x = AdamWElement(p.x, g.x * scale, &mi.x, &vi.x, decay, scalars);
    p.y = AdamWElement(p.y, g.y * scale, &mi.y, &vi.y, decay, scalars);
    p.z = AdamWElement(p.z, g.z * scale, &mi.z, &vi.z, decay, scalars);
    p.w = AdamWElement(p.w, g.w * scale, &mi.w, &vi.w, decay, scalars);
    p4[i] = p;
    m4[i] = mi;
    v4[i] = vi;
    if constexpr (kWriteBf16) {
      bf16* out = params_bf16 + split.head + 4 * i;
      out[0] = __float2bfloat16(p.x);
      out[1] = __float2bfloat16(p.y);
      out[2] = __float2bfloat16(p.z);
      out[3] = __float2bfloat16(p.w);
    }
  }
  // The scalar ends: at most 3 elements each, unless the arrays' alignments differ.
  const int64_t rest = split.head + 4 * split.vecs;
  for (int64_t i = first; i < split.head; i += stride) one(i);
  for (int64_t i = first; i < split.n - rest; i += stride) one(rest + i);
}

__global__ void CastToBf16Kernel(bf16* __restrict__ out,         // (n)
                                 const float* __restrict__ in,   // (n)
                                 Split split) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const float4* in4 = reinterpret_cast<const float4*>(in + split.head);
  // 4 bf16 are 8 bytes: aligned whenever `out` has the alignment of `in` halved (Split).
  uint2* out4 = reinterpret_cast<uint2*>(out + split.head);
  for (int64_t i = first; i < split.vecs; i += stride) {
    const float4 x = in4[i];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(x.x, x.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(x.z, x.w);
    out4[i] = make_uint2(*reinterpret_cast<const uint32_t*>(&lo),
                         *reinterpret_cast<const uint32_t*>(&hi));
  }
  const int64_t rest = split.head + 4 * split.vecs;
  for (int64_t i = first; i < split.head; i += stride) out[i] = __float2bfloat16(in[i]);
  for (int64_t i = rest + first; i < split.n; i += stride) out[i] = __float2bfloat16(in[i]);
}

// Where n floats at `p` cross 16-byte boundaries, when every other array of the call sits at
// the same offset modulo 16 bytes (`others`, in float units: bf16 arrays at half the offset
// in bytes); otherwise everything is scalar (head = n), which is still correct.
Split SplitAt(const float* p, size_t n, std::initializer_list<uintptr_t> other_offsets) {
  const uintptr_t off = reinterpret_cast<uintptr_t>(p) % 16;
  Split split{static_cast<int64_t>(n), 0, static_cast<int64_t>(n)};
  if (off % sizeof(float) != 0) return split;
  for (uintptr_t o : other_offsets) {
    if (o != off) return split;
  }
  const int64_t head = std::min<int64_t>(static_cast<int64_t>((16 - off) % 16 / sizeof(float)),
                                         static_cast<int64_t>(n));
  split.head = head;
  split.vecs = (static_cast<int64_t>(n) - head) / 4;
  return split;
}

uintptr_t Offset16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16; }

// Threads enough for the widest of the three parts.
int GridOf(const Split& s) {
  const int64_t rest = s.n - s.head - 4 * s.vecs;
  return internal::GridFor(std::max({s.vecs, s.head, rest, int64_t{1}}));
}

// Sum of squares phase 1: SumOfSquaresScratchFloats(n) blocks (plan_sizes.h), each over a
// fixed grid-stride subset of x; the count depends only on n, so the partials (and their
// order) are reproducible.
constexpr int kSumElementsPerThread = 8;
static_assert(static_cast<size_t>(internal::kBlockSize) * kSumElementsPerThread ==
                  kSumOfSquaresBlockElements,
              "plan_sizes.h's block of the sum of squares is this launch's");

int SumBlocks(size_t n) { return static_cast<int>(SumOfSquaresScratchFloats(n)); }

__global__ void SumOfSquaresPartialKernel(float* __restrict__ partials,  // (gridDim.x)
                                          const float* __restrict__ x,   // (n)
                                          int64_t n) {
  __shared__ float shared[internal::kWarpSize];
  float acc = 0.0f;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    acc += x[i] * x[i];
  }
  acc = internal::BlockSum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

// Phase 2, one block: *out += the partials' sum.
__global__ void SumOfSquaresFinalKernel(float* __restrict__ out,             // scalar +=
                                        const float* __restrict__ partials,  // (parts)
                                        int parts) {
  __shared__ float shared[internal::kWarpSize];
  float acc = 0.0f;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) acc += partials[i];
  acc = internal::BlockSum(acc, shared);
  if (threadIdx.x == 0) *out += acc;
}

__global__ void ClipScaleKernel(float* __restrict__ grad_scale,   // scalar
                                const float* __restrict__ stats,  // [sumsq, loss, targets]
                                double all_targets, float clip) {
  const double targets = rint(static_cast<double>(stats[2]));
  // training_engine.h's MaskedMean: exactly 1 when every target counts.
  const float m = targets <= 0.0           ? 0.0f
                  : targets == all_targets ? 1.0f
                                           : static_cast<float>(all_targets / targets);
  const float norm = m * sqrtf(stats[0]);
  // engine::GradScaleFor's rule: NaN marks a gradient that is not finite (skip the step).
  *grad_scale = !isfinite(norm)              ? __int_as_float(0x7fc00000)
                : clip > 0.0f && norm > clip ? m * (clip / norm)
                                             : m;
}

}  // namespace

namespace internal {

absl::Status LaunchAdamW(float* params, bf16* params_bf16, const float* grads, float* m,
                         float* v, size_t n, bool decay, const AdamWScalars& scalars,
                         const float* grad_scale, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  WEFT_BF16_RETURN_IF_ERROR(CheckPointers(
      "adamw", {NotNull(params, "params"), NotNull(grads, "grads"), NotNull(m, "m"),
                NotNull(v, "v"), NotNull(grad_scale, "grad_scale")}));
  // The bf16 copy is written element by element, so its alignment does not matter.
  const Split split = SplitAt(params, n, {Offset16(grads), Offset16(m), Offset16(v)});
  // A block per 256 float4s, each thread one (not GridOf's few waves of long-lived blocks):
  // the engine runs this update beside the forward's matmuls (ZeroCudaOptions::
  // update_in_next_forward), and short blocks let the scheduler slip them into the gaps.
  const int64_t rest = split.n - split.head - 4 * split.vecs;
  const int64_t widest = std::max({split.vecs, split.head, rest, int64_t{1}});
  const int64_t grid = (widest + kBlockSize - 1) / kBlockSize;
  if (grid > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("adamw: ", n, " elements in one call"));
  }
  if (params_bf16 == nullptr) {
    return Launch(AdamWKernel<false>, static_cast<unsigned>(grid), kBlockSize, 0, stream,
                  params, params_bf16, grads, m, v, split, decay, scalars, grad_scale);
  }
  return Launch(AdamWKernel<true>, static_cast<unsigned>(grid), kBlockSize, 0, stream, params,
                params_bf16, grads, m, v, split, decay, scalars, grad_scale);
}

}  // namespace internal

absl::Status CastToBf16(bf16* out, const float* in, size_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "cast to bf16", {internal::NotNull(out, "out"), internal::NotNull(in, "in")}));
  const Split split = SplitAt(in, n, {(2 * reinterpret_cast<uintptr_t>(out)) % 16});
  return internal::Launch(CastToBf16Kernel, GridOf(split), internal::kBlockSize, 0, stream, out,
                          in, split);
}

absl::Status SumOfSquares(float* out, const float* x, size_t n, float* scratch,
                          cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "sum of squares", {internal::NotNull(out, "out"), internal::NotNull(x, "x"),
                         internal::NotNull(scratch, "scratch")}));
  const int blocks = SumBlocks(n);
  WEFT_BF16_RETURN_IF_ERROR(internal::Launch(SumOfSquaresPartialKernel, blocks,
                                             internal::kBlockSize, 0, stream, scratch, x,
                                             static_cast<int64_t>(n)));
  return internal::Launch(SumOfSquaresFinalKernel, 1, 1024, 0, stream, out,
                          static_cast<const float*>(scratch), blocks);
}

absl::Status ClipScale(float* grad_scale, const float* stats, double all_targets, float clip,
                       cudaStream_t stream) {
  WEFT_BF16_RETURN_IF_ERROR(internal::CheckPointers(
      "clip scale",
      {internal::NotNull(grad_scale, "grad_scale"), internal::NotNull(stats, "stats")}));
  return internal::Launch(ClipScaleKernel, 1, 1, 0, stream, grad_scale, stats, all_targets, clip);
}

}  // namespace weft::engine::cuda
