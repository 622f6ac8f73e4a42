// The CUDA layers of GPT-2 and Llama as the GPU engine trains them (bf16 mixed precision), each
// with its forward and backward in one .cu file per layer. Every pointer is DEVICE memory, dense
// row-major, with the shapes of worker/engine/cpu/ops.h (N = B * T positions, C channels, Vp
// padded vocabulary). Activations and their gradients are bf16; statistics (LayerNorm
// mean/rstd, softmax logsumexp, losses) and every PARAMETER gradient are fp32; arithmetic
// inside a kernel is fp32.
//
// Contract (an op named as a CPU op has that op's accumulate contract; GeluBackwardOverwrite's
// name says where it differs):
//  - Parameter gradients (float*) ACCUMULATE (+=).
//  - Activation gradients (bf16*) are WRITTEN (=) except where a comment says "+=" (the
//    residual stream's gradient, which several consumers add into).
//  - Nothing is written but the outputs / gradient buffers named.
//  - Every launcher enqueues on `stream` (taken LAST) and returns without synchronizing.
//    Its absl::Status reports argument errors and launch errors (cudaGetLastError after the
//    launch); an error in a kernel's execution surfaces at the caller's next synchronization.
//  - `scratch` arguments are device workspace the caller owns, sized by the matching
//    *ScratchFloats function; nothing is kept in them between calls.
//  - Deterministic run to run unless a comment says otherwise. Parameter-gradient reductions
//    over rows (LayerNorm, BiasBackward, SumOfSquares) are two-phase: per-block fp32 partials
//    in `scratch`, then a second kernel adds them in a fixed order.
//  - Requirements, checked (INVALID_ARGUMENT naming the argument): non-null pointers; sizes
//    positive (n == 0 is a no-op only for the optimizer helpers, whose shards may be empty);
//    bf16 tensors are accessed as 16-byte vectors of 8 values, so every bf16 pointer of a layer
//    op is 16-byte aligned and the row lengths C, OC, T, Vp and the head size C / NH are
//    multiples of 8 (V need not be); the elementwise ops (GELU) take any n.
// Tolerances against the CPU fp32 ops are stated in tests/worker/engine/cuda/bf16_ops_test.cc,
// those of Llama's ops (against host references) in llama_ops_test.cc.
#ifndef WEFT_WORKER_ENGINE_CUDA_OPS_H_
#define WEFT_WORKER_ENGINE_CUDA_OPS_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/engine/cuda/plan_sizes.h"

namespace weft::engine {
struct AdamWConfig;  // worker/engine/adamw.h; not included so nvcc never parses protobuf.
}  // namespace weft::engine

namespace weft::engine::cuda {

using bf16 = __nv_bfloat16;

// ---- encoder.cu ----
absl::Status EncoderForward(bf16* out,              // (B, T, C)
                            const int32_t* tokens,  // (B, T)
                            const bf16* wte,        // (Vp, C)
                            const bf16* wpe,        // (maxT, C)
                            int b, int t, int c, cudaStream_t stream);

// The order the embedding backward adds dout's rows into dwte, so that it is bit-deterministic
// without atomics: built on the host from the host's copy of the tokens (the model has it in
// SetBatch), copied to the device as `data`. The n positions are grouped by token, in position
// order within a token; each token's positions are cut into segments of at most
// kEmbeddingSegment. A token of one segment adds its rows straight onto its dwte row; a token
// of several sums each segment into a slot of a scratch buffer, and then its slots in order.
// Either way every dwte element sees the same additions in the same order on every run.
inline constexpr int kEmbeddingSegment = 32;
struct EmbeddingGradPlan {
  int n = 0;
  int segments = 0;
  int combines = 0;            // tokens of more than one segment
  int slots = 0;               // scratch rows those segments fill
  std::vector<int32_t> data;   // order (n), then 4 per segment, then 3 per combine
};
// INVALID_ARGUMENT naming the position of a token outside [0, vp).
absl::StatusOr<EmbeddingGradPlan> PlanEmbeddingGrad(const int32_t* tokens, int n, int vp);
// The most ints a plan of n positions has, and the scratch (floats) its slots need at width c:
// what a model sizes its buffers by.
size_t EmbeddingGradPlanMaxInts(int n);
size_t EmbeddingGradScratchFloats(int n, int c);

// dwte += the rows of dout per token in `plan`'s order (plan_device: plan.data on the device,
// scratch: EmbeddingGradScratchFloats(plan.n, c) floats): bit-deterministic. dwpe (GPT-2's
// positions) is reduced over b in order: deterministic too.
absl::Status EncoderBackward(float* dwte,                // (Vp, C) +=
                             float* dwpe,                // (maxT, C) +=
                             const bf16* dout,           // (B, T, C)
                             const EmbeddingGradPlan& plan, const int32_t* plan_device,
                             float* scratch, int b, int t, int c, cudaStream_t stream);

// Llama's encoder, the token embedding alone (no positions): out[b, t, :] = wte[tokens[b, t], :].
absl::Status EmbeddingForward(bf16* out,              // (B, T, C)
                              const int32_t* tokens,  // (B, T)
                              const bf16* wte,        // (Vp, C)
                              int b, int t, int c, cudaStream_t stream);
// The backward's dwte as EncoderBackward's (deterministic, in `plan`'s order).
absl::Status EmbeddingBackward(float* dwte,              // (Vp, C) +=
                               const bf16* dout,         // (B, T, C)
                               const EmbeddingGradPlan& plan, const int32_t* plan_device,
                               float* scratch, int b, int t, int c, cudaStream_t stream);

// ---- layernorm.cu ----
absl::Status LayerNormForward(bf16* out,           // (N, C)
                              float* mean,         // (N)
                              float* rstd,         // (N)
                              const bf16* inp,     // (N, C)
                              const bf16* weight,  // (C)
                              const bf16* bias,    // (C)
                              int n, int c, cudaStream_t stream);
size_t LayerNormBackwardScratchFloats(int n, int c);
absl::Status LayerNormBackward(bf16* dinp,          // (N, C) += (the residual stream)
                               float* dweight,      // (C) +=
                               float* dbias,        // (C) +=
                               const bf16* dout,    // (N, C)
                               const bf16* inp,     // (N, C)
                               const bf16* weight,  // (C)
                               const float* mean,   // (N)
                               const float* rstd,   // (N)
                               float* scratch,      // LayerNormBackwardScratchFloats(n, c)
                               int n, int c, cudaStream_t stream);

// ---- rmsnorm.cu (Llama): out = x * rstd * weight, rstd = 1 / sqrt(mean(x^2) + eps), the
// statistics in fp32 ----
absl::Status RmsNormForward(bf16* out,           // (N, C)
                            float* rstd,         // (N)
                            const bf16* inp,     // (N, C)
                            const bf16* weight,  // (C)
                            int n, int c, float eps, cudaStream_t stream);
size_t RmsNormBackwardScratchFloats(int n, int c);
absl::Status RmsNormBackward(bf16* dinp,          // (N, C) += (the residual stream)
                             float* dweight,      // (C) +=
                             const bf16* dout,    // (N, C)
                             const bf16* inp,     // (N, C)
                             const bf16* weight,  // (C)
                             const float* rstd,   // (N)
                             float* scratch,      // RmsNormBackwardScratchFloats(n, c)
                             int n, int c, cudaStream_t stream);

// ---- qk_norm.cu (Qwen3): RMSNorm of each q head and each k head of the qkv projection's
// output over its HS values, before rotary; one weight (HS) shared by the NH q heads, one by
// the NKV k heads; v is not normalized. qkv is (N, W), W = (NH + 2 NKV) HS, rows [q (NH heads)
// | k (NKV) | v (NKV)] as flash attention's (NH * HS need not be the model width). HS a
// multiple of 8 up to 256 (a head is one group of at most a warp, 8 values a thread); eps > 0.
// cpu::QkNormForward / QkNormBackward are the same op. ----
// q and k heads of qkv normalized IN PLACE: x <- x * rstd * weight, rstd = 1 / sqrt(mean(x^2)
// + eps) over the head's HS values, statistics in fp32. qk_raw must not alias qkv.
absl::Status QkNormForward(bf16* qkv,             // (N, W) in place: q and k heads; v untouched
                           bf16* qk_raw,          // (N, (NH + NKV) HS) written (=): q | k before
                                                  // the norm, for the backward; nullptr: not kept
                           const bf16* q_weight,  // (HS)
                           const bf16* k_weight,  // (HS)
                           int n, int nh, int nkv, int hs, float eps, cudaStream_t stream);
size_t QkNormBackwardScratchFloats(int n, int nh, int nkv, int hs);
// dq, dk IN PLACE in dqkv: on entry the gradient w.r.t. the normalized q, k; on exit (=) w.r.t.
// the raw ones; dv untouched. dq_weight, dk_weight accumulate (+=) in fp32, deterministic (two
// phases through `scratch`). rstd is recomputed from qk_raw (the same eps as the forward's).
// dqkv must not alias qk_raw.
absl::Status QkNormBackward(bf16* dqkv,            // (N, W) in place
                            float* dq_weight,      // (HS) +=
                            float* dk_weight,      // (HS) +=
                            const bf16* qk_raw,    // (N, (NH + NKV) HS), QkNormForward's
                            const bf16* q_weight,  // (HS)
                            const bf16* k_weight,  // (HS)
                            float* scratch,        // QkNormBackwardScratchFloats(n, nh, nkv, hs)
                            int n, int nh, int nkv, int hs, float eps, cudaStream_t stream);

// ---- rope.cu (Llama's rotary embeddings, Hugging Face's rotate-half convention: within a
// head, element i < HS/2 pairs with i + HS/2 and the pair turns by angle t * inv_freq[i]).
// The tables are (maxT, HS/2) fp32. qkv is the (B, T, (NH + 2 NKV) HS) projection output of
// flash attention's layout; the NH q heads and NKV k heads are rotated IN PLACE, v untouched.
// HS % 16 == 0 (each half is read as 8-wide vectors). ----
// cos_table[t, i] = cos(t * inv_freq[i]), sin_table likewise, angles in fp32 as Hugging Face
// computes them. inv_freq (HS/2) is device memory.
absl::Status RopeTables(float* cos_table, float* sin_table, const float* inv_freq, int max_t,
                        int half, cudaStream_t stream);
// `positions` (DEVICE, or nullptr): row (b, t) turns by the angles of table row
// positions[b * T + t] instead of t, so packed documents each start again at position 0
// (positions[b, t] = t - doc_starts[b, t], doc_starts as flash attention's). nullptr is
// position t, bit for bit the plain rotation. Requires 0 <= positions[b, t] < max_t of the
// tables (not checked: the values are on the device).
absl::Status RopeForward(bf16* qkv,                // (B, T, (NH + 2 NKV) HS) in place
                         const int32_t* positions,  // (B, T) or nullptr
                         const float* cos_table, const float* sin_table, int b, int t, int nh,
                         int nkv, int hs, cudaStream_t stream);
// The transpose (rotation by -angle) of the gradients dq, dk in place in dqkv; dv untouched.
// `positions` as RopeForward's (the same ones).
absl::Status RopeBackward(bf16* dqkv,               // (B, T, (NH + 2 NKV) HS) in place
                          const int32_t* positions,  // (B, T) or nullptr
                          const float* cos_table, const float* sin_table, int b, int t, int nh,
                          int nkv, int hs, cudaStream_t stream);

// ---- swiglu.cu (Llama's MLP activation): gate_up rows are [gate (I) | up (I)],
// out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). I % 8 == 0. ----
absl::Status SwiGluForward(bf16* out,            // (N, I)
                           const bf16* gate_up,  // (N, 2I)
                           int n, int i, cudaStream_t stream);
// dgate_up WRITTEN (=): [dout * up * silu'(gate) | dout * silu(gate)]. dgate_up may alias
// gate_up (in place); dout must not alias either.
absl::Status SwiGluBackward(bf16* dgate_up,       // (N, 2I)
                            const bf16* dout,     // (N, I)
                            const bf16* gate_up,  // (N, 2I)
                            int n, int i, cudaStream_t stream);

// ---- gelu.cu (tanh approximation). The model fuses both into its MLP GEMMs (matmul.h);
// these are the standalone kernels of the same formula. ----
absl::Status GeluForward(bf16* out, const bf16* inp, int64_t n, cudaStream_t stream);
// dinp = gelu'(inp) * dout, WRITTEN (=), where cpu::GeluBackward accumulates (+=); dinp may
// alias dout (in place).
absl::Status GeluBackwardOverwrite(bf16* dinp, const bf16* inp, const bf16* dout, int64_t n,
                                   cudaStream_t stream);

// ---- bias.cu: dbias[o] += sum_n dout[n, o] (a Linear layer's bias gradient) ----
size_t BiasBackwardScratchFloats(int n, int oc);
absl::Status BiasBackward(float* dbias,      // (OC) +=
                          const bf16* dout,  // (N, OC)
                          float* scratch,    // BiasBackwardScratchFloats(n, oc)
                          int n, int oc, cudaStream_t stream);

// ---- attention.cu: the non-GEMM parts of causal attention; the GEMMs are cuBLAS batched
// (gpt2_model.cc). Heads: q | k | v each a contiguous C/NH slice per head, as the CPU op.
// C % NH == 0 and the head size C / NH a multiple of 8; T a multiple of 8 for the softmax. ----
// (B, T, 3C) -> q, k, v each (B, NH, T, HS), HS = C / NH.
absl::Status AttentionSplitHeads(bf16* q, bf16* k, bf16* v, const bf16* qkv, int b, int t,
                                 int c, int nh, cudaStream_t stream);
// (B, NH, T, HS) -> (B, T, C).
absl::Status AttentionMergeHeads(bf16* out, const bf16* y, int b, int t, int c, int nh,
                                 cudaStream_t stream);
// The inverses for the backward: (B, T, C) -> (B, NH, T, HS), and dq, dk, dv (B, NH, T, HS)
// -> dqkv (B, T, 3C) (written, =).
absl::Status AttentionSplitGrad(bf16* dy, const bf16* dout, int b, int t, int c, int nh,
                                cudaStream_t stream);
absl::Status AttentionMergeGrads(bf16* dqkv, const bf16* dq, const bf16* dk, const bf16* dv,
                                 int b, int t, int c, int nh, cudaStream_t stream);
// Document masking (packed sequences), shared by the softmax below and flash attention:
// doc_starts (B, T) int32 DEVICE, or nullptr. Query position t of sequence b attends only to
// keys k with doc_starts[b * T + t] <= k <= t (block-diagonal causal); the keys before its
// document get probability 0, as those after t do. nullptr is plain causal attention, bit for
// bit. Preconditions, which the caller guarantees (the values are on the device, not
// checked): 0 <= doc_starts[b, t] <= t, and each sequence is segmented into documents:
// doc_starts[b, t] is t (t starts a document) or doc_starts[b, t - 1]. So doc_starts is
// nondecreasing in t, which the kernels rely on to skip whole tiles.
// Sliding window (Mistral's, the rule of transformers 4.57), shared the same way: `window` w,
// right after doc_starts. w > 0: query t sees keys k with max(doc_start(t), t - w + 1) <= k <= t
// (w keys including itself, fewer at a document's or the sequence's start; doc_start(t) = 0
// without doc_starts): the keys before that get probability 0 too. w == 0: no window, today's
// kernels and bits; w >= T is the same (no key is that far back). w < 0 is INVALID_ARGUMENT.
// The window's bound is nondecreasing in t like a doc start, so flash attention skips the
// tiles wholly before it as it skips those before a document.
//
// rows = B * NH * T rows of length T, row r's position in its sequence is r % T and its
// sequence r / (NH * T). Columns outside the row's keys are never read (only zero-filled), so
// they may hold anything. In place: att holds the raw scores q.k on entry and
// P = softmax(scale * scores) on exit, causal (0 above the diagonal, i.e. at columns > r % T,
// and, with doc_starts or a window, 0 at columns before the row's first key); lse[r] =
// logsumexp of the row's scaled scores (fp32), kept for the backward. `nh` is only read with
// doc_starts (the window needs only r % T). This path (GPT-2's at head sizes flash attention
// does not support) supports document masking and the window as flash attention does, but
// computes the full (T, T) GEMMs: only flash attention skips the masked tiles.
absl::Status CausalSoftmaxForward(bf16* att, float* lse,
                                  const int32_t* doc_starts,  // (B, T) or nullptr
                                  int window,                 // >= 0; 0: none
                                  int64_t rows, int t, int nh, float scale, cudaStream_t stream);
// Recomputes P in place from the raw scores and lse (the backward does not keep P).
absl::Status CausalSoftmaxRecompute(bf16* att, const float* lse,
                                    const int32_t* doc_starts,  // (B, T) or nullptr
                                    int window,                 // >= 0; 0: none
                                    int64_t rows, int t, int nh, float scale, cudaStream_t stream);
// In place on datt: datt = scale * P * (datt - sum_j P[j] * datt[j]) per row, causal (0 above
// the diagonal and before the row's doc_starts or window): the gradient w.r.t. the raw scores
// given P and dL/dP.
absl::Status CausalSoftmaxBackward(bf16* datt, const bf16* att,
                                   const int32_t* doc_starts,  // (B, T) or nullptr
                                   int window,                 // >= 0; 0: none
                                   int64_t rows, int t, int nh, float scale, cudaStream_t stream);

// ---- flash_attention.cu: fused causal attention (tensor cores, the (T, T) scores never hit
// memory), grouped-query (NKV kv heads shared by NH query heads; GPT-2 is NKV = NH), on the
// model's own layouts (no head split / merge, no repeated k/v): q, k, v are read straight from
// the qkv projection's output (B, T, W), W = (NH + 2 NKV) HS, rows [q (NH heads) | k (NKV) |
// v (NKV)], each head HS consecutive channels (GPT-2: W = 3C with the heads of
// AttentionSplitHeads); query head h reads kv head h / (NH / NKV). y and dy are (B, T, C),
// C = NH * HS (element (b, h, t, d) at (b * T + t) * C + h * HS + d); scale = 1 / sqrt(HS).
// Any T >= 1, B * NH >= 1 and NKV dividing NH; HS in {16, 32, 64, 128}, any other head size
// is UNIMPLEMENTED (GPT-2 falls back to the cuBLAS + softmax path above). Same semantics as
// that path, but the scores stay fp32 (never rounded to bf16). Deterministic.
// doc_starts: document masking as above (nullptr: plain causal, the same kernels, speed and
// bits as without the argument). Every kernel (forward, Hopper forward, dQ, both dK/dV) SKIPS
// the tiles that lie wholly outside a document instead of masking them, so packed short
// documents cost about their own attention: forward + backward 5x faster than full causal at
// Llama-3.2-1B's shape, T = 4096, 150- to 450-token documents, on an H200 (cuda_ops_bench
// --docmask). `window`: the sliding window as above, the same kernels as doc_starts (the
// walks start at the first key tile some row's window reaches, and the dK/dV walk stops at the
// last query tile that reaches the key tile), so attention costs about T * w instead of
// T^2 / 2: forward + backward at Mistral-7B's attention, T = 16384, w = 4096, on an H200
// (cuda_ops_bench --window) 10.2 ms against 21.6 ms causal (0.47; the visible pairs are 0.44). The
// backward must get the forward's doc_starts and window (else it is the gradient of another
// function); with documents or a short window it runs its dK/dV kernel beside the dQ one on a
// second stream of the calling thread (made on first use and kept), forked from `stream` and joined
// back before it returns, so to the caller the work is still ordered on `stream`. ----
bool FlashAttentionSupported(int hs);
// y = softmax(scale * q k^T, causal) v per query head; lse[(b * NH + h) * T + t] = logsumexp
// of that row's scaled causal scores.
absl::Status FlashAttentionForward(bf16* y,                    // (B, T, C) written (=)
                                   float* lse,                 // (B * NH * T)
                                   const bf16* qkv,            // (B, T, W)
                                   const int32_t* doc_starts,  // (B, T) or nullptr
                                   int window,                 // >= 0; 0: none
                                   int b, int nh, int nkv, int t, int hs, cudaStream_t stream);
// The forward's kernels: kAuto runs the Hopper one where it runs (FlashAttentionHopperForward),
// else the mma.sync one, which runs on every supported GPU and head size. Asking for kHopper
// where it does not run is FAILED_PRECONDITION. The two agree to fp32 rounding (their sums run
// in different orders), each deterministic. For tests and benchmarks; the models use kAuto.
enum class FlashAttentionKernel { kAuto, kMmaSync, kHopper };
// Whether the Hopper forward (wgmma, HS 64 or 128) runs on the current device: an sm_90 GPU
// (H100, H200) running this build's sm_90a code.
bool FlashAttentionHopperForward(int hs);
absl::Status FlashAttentionForwardWith(FlashAttentionKernel kernel, bf16* y, float* lse,
                                       const bf16* qkv,
                                       const int32_t* doc_starts,  // (B, T) or nullptr
                                       int window,                 // >= 0; 0: none
                                       int b, int nh, int nkv, int t, int hs, cudaStream_t stream);
size_t FlashAttentionBackwardScratchFloats(int b, int nh, int t, int hs);
// dq, dk, dv written (=) into dqkv at the places q, k, v have in qkv (every element of dqkv is
// written; a shared k/v head gets the sum over its query heads), from the forward's y and lse
// (P is recomputed tile by tile). dqkv must not alias qkv.
absl::Status FlashAttentionBackward(bf16* dqkv,                 // (B, T, W) written (=)
                                    const bf16* dy,             // (B, T, C) dL/dy
                                    const bf16* y,              // (B, T, C) the forward's output
                                    const float* lse,           // (B * NH * T) the forward's lse
                                    const bf16* qkv,            // (B, T, W) the forward's input
                                    const int32_t* doc_starts,  // (B, T) or nullptr
                                    int window,                 // >= 0; 0: none
                                    float* scratch,  // FlashAttentionBackwardScratchFloats
                                    int b, int nh, int nkv, int t, int hs, cudaStream_t stream);
// The backward with its dK/dV kernel chosen as FlashAttentionForwardWith chooses the forward's
// (kHopper: a wgmma dK/dV kernel where FlashAttentionHopperForward holds, FAILED_PRECONDITION
// elsewhere; dQ is the mma.sync kernel either way). kAuto is what FlashAttentionBackward runs.
absl::Status FlashAttentionBackwardWith(FlashAttentionKernel kernel, bf16* dqkv, const bf16* dy,
                                        const bf16* y, const float* lse, const bf16* qkv,
                                        const int32_t* doc_starts,  // (B, T) or nullptr
                                        int window,                 // >= 0; 0: none
                                        float* scratch, int b, int nh, int nkv, int t, int hs,
                                        cudaStream_t stream);

// ---- classifier.cu: softmax + cross-entropy over the first V of Vp columns (V <= Vp,
// Vp % 8 == 0; padding columns are never read) ----
// In place: the logits (N, Vp) become the gradient of grad_scale * sum of the N losses:
//   dlogits[n, j] = grad_scale * (softmax[n, j] - (j == targets[n])) for j < V, 0 for j >= V
// (a caller chunking a batch of N_total rows passes grad_scale = loss_scale / N_total).
// losses[n] = -log softmax[n, targets[n]] (fp32).
// A target < 0 (Hugging Face's labels = -100) marks row n IGNORED: losses[n] = 0 and the whole
// dlogits row (all Vp columns) is 0; its logits are not read. grad_scale is the caller's to
// choose (e.g. loss_scale / the number of rows not ignored).
absl::Status CrossEntropyForwardBackward(bf16* logits,            // (N, Vp) in/out
                                         float* losses,           // (N)
                                         const int32_t* targets,  // (N), each in [0, V) or < 0
                                         int n, int v, int vp, float grad_scale,
                                         cudaStream_t stream);

// ---- adamw.cu + adamw.cc: the fp32 master update (and, optionally, its bf16 copy) ----
// engine::AdamWUpdate's semantics (worker/engine/adamw.h) on a device-resident run of a flat
// shard whose elements all decay (`decay`) or all do not: g = grad_scale * grads[i];
// decoupled decay applied to the parameter before the Adam step; `step` 1-based; bias
// corrections computed in double on the host. With params_bf16 (may be null),
// params_bf16[i] = bf16(params[i]) too, of the updated parameter (or, for a skipped step, of
// the unchanged one). `grad_scale` is read from DEVICE memory (*grad_scale), so clipping by a
// norm computed on the GPU needs no host round trip.
absl::Status AdamWUpdate(float* params, bf16* params_bf16 /* nullable */, const float* grads,
                         float* m, float* v, size_t n, bool decay, const AdamWConfig& config,
                         int64_t step, const float* grad_scale /* device scalar */,
                         cudaStream_t stream);
// out[i] = bf16(in[i]).
absl::Status CastToBf16(bf16* out, const float* in, size_t n, cudaStream_t stream);
// *out += sum_i x[i]^2 (fp32 partial sums, fixed order): a shard's part of the global grad norm.
// `scratch`: SumOfSquaresScratchFloats(n) floats (plan_sizes.h).
absl::Status SumOfSquares(float* out /* device scalar, += */, const float* x, size_t n,
                          float* scratch, cudaStream_t stream);
// stats (device) = [sum of squares, loss sum, targets that count] of the gradient of the mean
// loss over ALL `all_targets` positions. With m = all_targets / targets (1 when equal, 0 when
// no target counts: worker/zero/training_engine.h's MaskedMean) the gradient of the mean over
// the targets that count is m times it, of norm g = m * sqrt(sum of squares), and
// grad_scale (device scalar) = m * (clip > 0 && g > clip ? clip / g : 1), or NaN when g is not
// finite, which makes AdamWUpdate leave everything as it was (a skipped step;
// engine::GradScaleFor is the host's rule).
absl::Status ClipScale(float* grad_scale, const float* stats, double all_targets, float clip,
                       cudaStream_t stream);

namespace internal {
// The host-folded scalars of one AdamW step (adamw.cc computes them from AdamWConfig, so
// adamw.cu needs no protobuf-dependent header).
struct AdamWScalars {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float lr_wd;  // lr * weight_decay
  float correction1;
  float correction2;
};
// AdamWUpdate's launcher (adamw.cu). Callers use AdamWUpdate.
absl::Status LaunchAdamW(float* params, bf16* params_bf16, const float* grads, float* m,
                         float* v, size_t n, bool decay, const AdamWScalars& scalars,
                         const float* grad_scale, cudaStream_t stream);
}  // namespace internal

}  // namespace weft::engine::cuda

#endif  // WEFT_WORKER_ENGINE_CUDA_OPS_H_
