// The CPU layers of GPT-2 and Llama, each with its forward and backward (one .cc file per layer,
// see the contract at the top of each). Templates on the element type T, instantiated for float
// (the engine) and double (gradient checks in tests).
//
// Contract shared by every backward:
//  - Parameter gradients ACCUMULATE (+=): gradient accumulation over micro-batches and the
//    tied token embedding (read by the encoder and by the LM head) need no special casing.
//  - Input gradients also accumulate (+=), as in llm.c: a caller that wants plain gradients
//    zeroes the buffer first; a residual stream can accumulate both branches into one buffer.
//    The exceptions are the rotary and q/k-norm backwards, which transform their gradient in
//    place (=), as their forwards transform q and k in place.
//  - Nothing is written but the gradient buffers (and, where named, scratch).
// Shapes: N = B * T positions; C channels; OC output channels; NH heads, NKV key/value heads
// (grouped-query attention), D head size; QKV = (NH + 2 NKV) * D; I the SwiGLU width; V real
// vocabulary, Vp padded vocabulary. Every tensor is dense row-major.
#ifndef WEFT_WORKER_ENGINE_CPU_OPS_H_
#define WEFT_WORKER_ENGINE_CPU_OPS_H_

#include <cstdint>

namespace weft::engine::cpu {

// LayerNorm epsilon of GPT-2.
inline constexpr double kLayerNormEps = 1e-5;

// ---- encoder.cc: token + position embedding ----
template <typename T>
void EncoderForward(T* out,                    // (B, T, C)
                    const int32_t* tokens,     // (B, T), each in [0, V)
                    const T* wte,              // (Vp, C)
                    const T* wpe,              // (maxT, C), rows [0, T) used; nullptr: none
                    const int32_t* positions,  // (B, T) rows of wpe, each < maxT; nullptr: t
                    int b, int t, int c);
template <typename T>
void EncoderBackward(T* dwte,                   // (Vp, C) +=
                     T* dwpe,                   // (maxT, C) += ; nullptr when the forward had none
                     const T* dout,             // (B, T, C)
                     const int32_t* tokens,     // (B, T)
                     const int32_t* positions,  // (B, T) as the forward's; nullptr: t
                     int b, int t, int c);

// ---- layernorm.cc ----
template <typename T>
void LayerNormForward(T* out,           // (N, C)
                      T* mean,          // (N) kept for backward
                      T* rstd,          // (N) kept for backward
                      const T* inp,     // (N, C)
                      const T* weight,  // (C)
                      const T* bias,    // (C)
                      int n, int c);
template <typename T>
void LayerNormBackward(T* dinp,          // (N, C) +=
                       T* dweight,       // (C) +=
                       T* dbias,         // (C) +=
                       const T* dout,    // (N, C)
                       const T* inp,     // (N, C)
                       const T* weight,  // (C)
                       const T* mean,    // (N)
                       const T* rstd,    // (N)
                       int n, int c);

// ---- rmsnorm.cc: out = x / sqrt(mean(x^2) + eps) * weight (Llama) ----
template <typename T>
void RmsNormForward(T* out,           // (N, C)
                    T* rrms,          // (N) reciprocal rms, kept for backward
                    const T* inp,     // (N, C)
                    const T* weight,  // (C)
                    int n, int c, double eps);
template <typename T>
void RmsNormBackward(T* dinp,          // (N, C) +=
                     T* dweight,       // (C) +=
                     const T* dout,    // (N, C)
                     const T* inp,     // (N, C)
                     const T* weight,  // (C)
                     const T* rrms,    // (N)
                     int n, int c);

// ---- rope.cc: rotary position embeddings on q and k, Hugging Face's pairing (element i with
// i + D/2 of a head, angle position * inv_freq[i]) ----
// cos/sin tables of positions [0, T): angles in double, then rounded to T.
template <typename T>
void RopeTables(T* cos,                  // (T, D/2)
                T* sin,                  // (T, D/2)
                const double* inv_freq,  // (D/2), engine/llama RopeInverseFrequencies
                int t, int d);
// Rotates the q (NH heads) and k (NKV heads) parts of every row IN PLACE; v is untouched.
// Row (b, t) takes the angles of position positions[b, t] (< the tables' T), or t with nullptr.
template <typename T>
void RopeForward(T* qkv,                    // (B, T, QKV): q | k | v
                 const T* cos,              // (T, D/2)
                 const T* sin,              // (T, D/2)
                 const int32_t* positions,  // (B, T) or nullptr
                 int b, int t, int nh, int nkv, int d);
// Applies the transposed rotation to the dq and dk parts IN PLACE (=): the gradient w.r.t.
// the rotary input. dv is untouched.
template <typename T>
void RopeBackward(T* dqkv,                   // (B, T, QKV)
                  const T* cos,              // (T, D/2)
                  const T* sin,              // (T, D/2)
                  const int32_t* positions,  // (B, T) as the forward's, or nullptr
                  int b, int t, int nh, int nkv, int d);

// ---- qk_norm.cc (Qwen3): RMSNorm of each q head and each k head over its D values, before
// rotary; one weight (D) shared by the NH q heads, one by the NKV k heads ----
// Normalizes the q and k heads of every row IN PLACE, as RmsNormForward of each head:
// x = weight * (x * r), r = 1 / sqrt(mean(x^2) + eps). v is untouched.
template <typename T>
void QkNormForward(T* qkv,             // (N, QKV): q | k | v, q and k in place
                   T* qk_raw,          // (N, (NH + NKV) D) q | k before the norm, for backward
                   T* rrms,            // (N, NH + NKV) reciprocal rms per head, for backward
                   const T* q_weight,  // (D)
                   const T* k_weight,  // (D)
                   int n, int nh, int nkv, int d, double eps);
// dq and dk IN PLACE (=): the gradient w.r.t. the normalized heads on entry, w.r.t. the raw
// ones on exit. dv is untouched. dq_weight, dk_weight +=.
template <typename T>
void QkNormBackward(T* dqkv,            // (N, QKV)
                    T* dq_weight,       // (D) +=
                    T* dk_weight,       // (D) +=
                    const T* qk_raw,    // (N, (NH + NKV) D) the forward's
                    const T* rrms,      // (N, NH + NKV) the forward's
                    const T* q_weight,  // (D)
                    const T* k_weight,  // (D)
                    int n, int nh, int nkv, int d);

// ---- swiglu.cc: out = silu(gate) * up ----
template <typename T>
void SwiGluForward(T* out,        // (N, I)
                   const T* inp,  // (N, 2I): gate | up
                   int64_t n, int i);
template <typename T>
void SwiGluBackward(T* dinp,        // (N, 2I) +=
                    const T* dout,  // (N, I)
                    const T* inp,   // (N, 2I)
                    int64_t n, int i);

// ---- matmul.cc: out = inp @ weight^T + bias (a PyTorch Linear) ----
template <typename T>
void MatmulForward(T* out,           // (N, OC)
                   const T* inp,     // (N, C)
                   const T* weight,  // (OC, C)
                   const T* bias,    // (OC) or nullptr
                   int n, int c, int oc);
template <typename T>
void MatmulBackward(T* dinp,          // (N, C) +=
                    T* dweight,       // (OC, C) +=
                    T* dbias,         // (OC) += ; nullptr when the forward had no bias
                    const T* dout,    // (N, OC)
                    const T* inp,     // (N, C)
                    const T* weight,  // (OC, C)
                    int n, int c, int oc);

// ---- attention.cc: causal multi-head self-attention (no projections), block-diagonal over
// documents when doc_starts is given: query t of row b sees keys [doc_starts[b, t], t]
// (attention.cc states what doc_starts must hold) ----
template <typename T>
void AttentionForward(T* out,        // (B, T, C)
                      T* att,        // (B, NH, T, T) softmax, kept for backward; 0 where masked
                      const T* qkv,  // (B, T, 3C): q | k | v, each head a contiguous C/NH slice
                      const int32_t* doc_starts,  // (B, T) or nullptr: one document a row
                      int b, int t, int c, int nh);
template <typename T>
void AttentionBackward(T* dqkv,                    // (B, T, 3C) +=
                       T* scratch,                 // (T, T) workspace
                       const T* dout,              // (B, T, C)
                       const T* qkv,               // (B, T, 3C)
                       const T* att,               // (B, NH, T, T)
                       const int32_t* doc_starts,  // (B, T) as the forward's, or nullptr
                       int b, int t, int c, int nh);

// Grouped-query attention: query head h reads key/value head h / (NH / NKV). NKV == NH with
// D = C / NH is exactly the multi-head attention above (the same arithmetic, bit for bit).
// window > 0 (Mistral's sliding window): query t sees keys j with t - window < j <= t only;
// 0 is plain causal.
template <typename T>
void GqaAttentionForward(T* out,        // (B, T, NH * D)
                         T* att,        // (B, NH, T, T) softmax, kept for backward
                         const T* qkv,  // (B, T, QKV): q (NH * D) | k (NKV * D) | v (NKV * D)
                         const int32_t* doc_starts,  // (B, T) or nullptr
                         int window, int b, int t, int nh, int nkv, int d);
template <typename T>
void GqaAttentionBackward(T* dqkv,                    // (B, T, QKV) +=
                          T* scratch,                 // (T, T) workspace
                          const T* dout,              // (B, T, NH * D)
                          const T* qkv,               // (B, T, QKV)
                          const T* att,               // (B, NH, T, T)
                          const int32_t* doc_starts,  // (B, T) as the forward's, or nullptr
                          int window,                 // the forward's
                          int b, int t, int nh, int nkv, int d);

// ---- gelu.cc: tanh approximation of GELU, as GPT-2 ----
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);  // (N) each
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n);  // dinp (N) +=

// ---- residual.cc: out = inp1 + inp2 ----
template <typename T>
void ResidualForward(T* out, const T* inp1, const T* inp2, int64_t n);  // (N) each
template <typename T>
void ResidualBackward(T* dinp1, T* dinp2, const T* dout, int64_t n);  // dinp1, dinp2 (N) +=

// ---- classifier.cc: softmax + cross-entropy over the first V of Vp logits, fused ----
// Converts `logits` IN PLACE into d(loss_scale * mean(losses)) / dlogits and returns the mean
// loss (accumulated in double). Columns >= V are excluded from the softmax (as if -inf), so
// their gradient is exactly 0 and the loss equals the unpadded loss. A negative target is
// IGNORED (Hugging Face's labels = -100): its loss is 0 and its row of dlogits all 0; the mean
// still divides by N (the engine, which knows how many targets count over the global batch,
// rescales: worker/zero/training_engine.h).
template <typename T>
double SoftmaxCrossEntropyForwardBackward(T* logits,  // (N, Vp) in: logits, out: dlogits
                                          T* losses,  // (N) per-position loss
                                          const int32_t* targets,  // (N), in [0, V) or < 0
                                          int n, int v, int vp, T loss_scale);
// The LM head in front of it: logits = inp @ weight^T (no bias), then, for training
// (targets != nullptr), the fused loss above in place. Returns the mean loss, 0 for inference
// (the logits are kept). Its backward is MatmulBackward with the dlogits left in `logits`.
template <typename T>
double LmHeadForward(T* logits,               // (N, Vp): logits, or dlogits when training
                     T* losses,               // (N) per-position loss (training)
                     const T* inp,            // (N, C)
                     const T* weight,         // (Vp, C)
                     const int32_t* targets,  // (N), each in [0, V); nullptr: inference
                     int n, int c, int v, int vp, T loss_scale);

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_OPS_H_
