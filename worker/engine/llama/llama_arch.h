// Llama's parameter layout, initialisation and rotary frequencies (device-independent), and
// those of the families that are Llama with a difference or two (LlamaFamily); their models are
// engine/cpu/llama_model.h (fp32) and engine/cuda/llama_model.h (bf16).
//
//   unit 0 ("head"):  embed (Vp, C), norm (C), lm_head (Vp, C) — lm_head only when untied
//   unit 1+l (block l): attn_norm (C), qkvw (Q + 2 KV, C), [qkvb (Q + 2 KV)], [q_norm (D),
//                       k_norm (D)], attn_out (C, Q), mlp_norm (C), gate_up (2 I, C), down (C, I)
// with head size D (head_dim, by default C / NH), Q = NH * D and KV = NKV * D; qkvb is Qwen2's,
// q_norm and k_norm Qwen3's. Weights are (out, in) like PyTorch's Linear. The fused matrices
// stack Hugging Face's separate ones row-wise — qkvw is [q_proj; k_proj; v_proj] (qkvb their
// biases likewise), gate_up is [gate_proj; up_proj] — so each Hugging Face tensor is one
// contiguous range of a unit (imports read it in place; worker/hf has the mapping).
//
// Rotary embeddings follow Hugging Face's convention: within a head, element i and element
// i + D/2 form the pair rotated by angle position * inv_freq[i] (i < D/2), so imported q/k
// weights need no permutation.
#ifndef WEFT_WORKER_ENGINE_LLAMA_LLAMA_ARCH_H_
#define WEFT_WORKER_ENGINE_LLAMA_LLAMA_ARCH_H_

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "weft/v1/job.pb.h"
#include "worker/engine/model_arch.h"

namespace weft::engine {

// What a family changes in Llama's block (weft.v1.Architecture's LLAMA-family values).
enum class LlamaFamily {
  kLlama,
  kQwen2,    // biases on q, k and v (qkvb)
  kQwen3,    // an RMSNorm over each q and each k head (q_norm, k_norm), before rotary
  kMistral,  // sliding-window attention (sliding_window)
};

struct LlamaConfig {
  LlamaFamily family = LlamaFamily::kLlama;
  int num_layers = 0;
  int hidden_size = 0;        // C
  int num_heads = 0;          // NH
  int head_dim = 0;           // D, even; 0 means C / NH (NH must then divide C)
  int num_kv_heads = 0;       // NKV; divides NH
  int intermediate_size = 0;  // I: SwiGLU width
  int vocab_size = 0;         // V: token ids are in [0, V)
  int padded_vocab_size = 0;  // Vp >= V: rows of embed (and lm_head) allocated
  int context_length = 0;     // maxT
  double rope_theta = 10000.0;
  // Rotary scaling (weft.v1.RopeScaling); llama3 false means none.
  bool rope_llama3 = false;
  double rope_factor = 0.0;
  double rope_low_freq_factor = 0.0;
  double rope_high_freq_factor = 0.0;
  int rope_original_context_length = 0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  // Mistral: query i sees keys j with i - sliding_window < j <= i; 0 sees every earlier key.
  int sliding_window = 0;

  bool qkv_bias() const { return family == LlamaFamily::kQwen2; }
  bool qk_norm() const { return family == LlamaFamily::kQwen3; }
  int head_size() const {  // D
    return head_dim > 0 ? head_dim : hidden_size / std::max(num_heads, 1);
  }
  int q_width() const { return num_heads * head_size(); }          // Q
  int kv_width() const { return num_kv_heads * head_size(); }      // KV
  int qkv_width() const { return q_width() + 2 * kv_width(); }
};

// The family of a LLAMA-family architecture (LLAMA, QWEN2, QWEN3, MISTRAL); nullopt for any
// other (GPT2, unknown values).
std::optional<LlamaFamily> LlamaFamilyOf(weft::v1::Architecture architecture);

// Sizes from a normalized ModelSpec (a LLAMA-family architecture, defaults applied;
// padded_vocab_size 0 takes V rounded up to a multiple of 128).
LlamaConfig LlamaConfigFromSpec(const weft::v1::ModelSpec& spec);
// What is wrong with `config` for a Llama model, one "field: problem" per violation (empty: ok).
std::vector<std::string> LlamaConfigProblems(const LlamaConfig& config);

// Index of each tensor in the head: the layout order.
enum LlamaHeadTensor : int { kLlamaEmbed, kLlamaNorm, kLlamaLmHead };
// The tensors a block may hold. For LLAMA and MISTRAL the first six are also their places in
// UnitTensors(1 + l); the families' own tensors are numbered after them but lie after qkvw, so
// models find every tensor through LlamaBlockOffsets.
enum LlamaBlockTensor : int {
  kLlamaAttnNorm,
  kLlamaQkvw,
  kLlamaAttnOut,
  kLlamaMlpNorm,
  kLlamaGateUp,
  kLlamaDown,
  kLlamaQkvb,   // QWEN2
  kLlamaQNorm,  // QWEN3
  kLlamaKNorm,  // QWEN3
  kLlamaNumBlockTensors
};
// A tensor the family does not have.
inline constexpr size_t kLlamaAbsent = ~size_t{0};
using LlamaBlockOffsets = std::array<size_t, kLlamaNumBlockTensors>;

// The rotary inverse frequencies inv_freq[i], i in [0, D/2), scaling applied: computed in
// double (Hugging Face computes them in fp32; the two agree to fp32 rounding).
std::vector<double> RopeInverseFrequencies(const LlamaConfig& config);

class LlamaArch final : public ModelArch {
 public:
  explicit LlamaArch(const LlamaConfig& config) : config_(config) {}

  const LlamaConfig& config() const { return config_; }

  // "llama", "qwen2", "qwen3" or "mistral": model files are weft-<name>-fp32.
  std::string name() const override;
  int num_layers() const override { return config_.num_layers; }
  int vocab_size() const override { return config_.vocab_size; }
  int padded_vocab_size() const override { return config_.padded_vocab_size; }
  int context_length() const override { return config_.context_length; }
  size_t UnitSize(int unit) const override;
  // Init (ModelArch::InitUnit reads it from here): N(0, 0.02) matrices and embeddings
  // (attn_out and down scaled by 1 / sqrt(2 * num_layers), as GPT-2 does for projections into
  // the residual stream), unit norm weights; vocabulary padding rows are 0.
  // q/k/v biases 0, q/k head norms 1.
  std::vector<TensorInfo> UnitTensors(int unit) const override;
  // Where each tensor of a block lies in its unit (kLlamaAbsent for the family's missing ones).
  LlamaBlockOffsets BlockOffsets() const;
  // Untied: the embedding ends where the final norm starts. Tied: 0.
  size_t HeadOutputBegin() const override {
    return config_.tie_word_embeddings
               ? 0
               : static_cast<size_t>(config_.padded_vocab_size) * config_.hidden_size;
  }

 private:
  const LlamaConfig config_;
};

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_LLAMA_LLAMA_ARCH_H_
