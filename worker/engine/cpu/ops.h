// The CPU layers of GPT-2, each with its forward and backward (one .cc file per layer, see
// the contract at the top of each). Templates on the element type T, instantiated for float
// (the engine) and double (gradient checks in tests).
//
// Contract shared by every backward:
//  - Parameter gradients ACCUMULATE (+=): gradient accumulation over micro-batches and the
//    tied token embedding (read by the encoder and by the LM head) need no special casing.
//  - Input gradients also accumulate (+=), as in llm.c: a caller that wants plain gradients
//    zeroes the buffer first; a residual stream can accumulate both branches into one buffer.
//  - Nothing is written but the gradient buffers (and, where named, scratch).
// Shapes: N = B * T positions; C channels; OC output channels; NH heads; V real vocabulary,
// Vp padded vocabulary. Every tensor is dense row-major.
#ifndef WEFT_WORKER_ENGINE_CPU_OPS_H_
#define WEFT_WORKER_ENGINE_CPU_OPS_H_

#include <cstdint>

namespace weft::engine::cpu {

// LayerNorm epsilon of GPT-2.
inline constexpr double kLayerNormEps = 1e-5;

// ---- encoder.cc: token + position embedding ----
template <typename T>
void EncoderForward(T* out,                 // (B, T, C)
                    const int32_t* tokens,  // (B, T), each in [0, V)
                    const T* wte,           // (Vp, C)
                    const T* wpe,           // (maxT, C), rows [0, T) used
                    int b, int t, int c);
template <typename T>
void EncoderBackward(T* dwte,                // (Vp, C) +=
                     T* dwpe,                // (maxT, C) +=
                     const T* dout,          // (B, T, C)
                     const int32_t* tokens,  // (B, T)
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

// ---- attention.cc: causal multi-head self-attention (no projections) ----
template <typename T>
void AttentionForward(T* out,        // (B, T, C)
                      T* att,        // (B, NH, T, T) softmax, kept for backward; 0 above diagonal
                      const T* qkv,  // (B, T, 3C): q | k | v, each head a contiguous C/NH slice
                      int b, int t, int c, int nh);
template <typename T>
void AttentionBackward(T* dqkv,        // (B, T, 3C) +=
                       T* scratch,     // (T, T) workspace
                       const T* dout,  // (B, T, C)
                       const T* qkv,   // (B, T, 3C)
                       const T* att,   // (B, NH, T, T)
                       int b, int t, int c, int nh);

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
// their gradient is exactly 0 and the loss equals the unpadded loss.
template <typename T>
double SoftmaxCrossEntropyForwardBackward(T* logits,  // (N, Vp) in: logits, out: dlogits
                                          T* losses,  // (N) per-position loss
                                          const int32_t* targets,  // (N), each in [0, V)
                                          int n, int v, int vp, T loss_scale);

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_OPS_H_
