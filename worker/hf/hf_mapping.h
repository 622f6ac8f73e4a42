// Where each Hugging Face tensor of a model lives in Weft's units: the one table import, export
// and the reference tests share (docs/models.md points here).
//
// GPT-2 (transformers' GPT2LMHeadModel; an import also accepts the names without the
// "transformer." prefix, as the original OpenAI upload has them). Conv1D weights are stored
// (in, out), the transpose of Weft's (out, in): marked T.
//   transformer.wte.weight (V, C)              head  wte, rows [0, V) (rows >= V are padding)
//   transformer.wpe.weight (maxT, C)           head  wpe
//   transformer.ln_f.weight|bias (C)           head  lnfw | lnfb
//   transformer.h.{l}.ln_1.weight|bias         block ln1w | ln1b
//   transformer.h.{l}.attn.c_attn.weight  T    block qkvw (3C, C); .bias -> qkvb
//   transformer.h.{l}.attn.c_proj.weight  T    block attprojw; .bias -> attprojb
//   transformer.h.{l}.ln_2.weight|bias         block ln2w | ln2b
//   transformer.h.{l}.mlp.c_fc.weight     T    block fcw (4C, C); .bias -> fcb
//   transformer.h.{l}.mlp.c_proj.weight   T    block fcprojw; .bias -> fcprojb
//   (no lm_head.weight: tied to wte)
// Llama (LlamaForCausalLM; weights (out, in) as in Weft):
//   model.embed_tokens.weight (V, C)           head  embed, rows [0, V)
//   model.norm.weight (C)                      head  norm
//   lm_head.weight (V, C)                      head  lm_head, rows [0, V) — untied models only
//   model.layers.{l}.input_layernorm.weight    block attn_norm
//   model.layers.{l}.self_attn.q_proj.weight   block qkvw rows [0, Q)
//   model.layers.{l}.self_attn.k_proj.weight   block qkvw rows [Q, Q + KV)
//   model.layers.{l}.self_attn.v_proj.weight   block qkvw rows [Q + KV, Q + 2 KV)
//   model.layers.{l}.self_attn.o_proj.weight   block attn_out
//   model.layers.{l}.post_attention_layernorm.weight  block mlp_norm
//   model.layers.{l}.mlp.gate_proj.weight      block gate_up rows [0, I)
//   model.layers.{l}.mlp.up_proj.weight        block gate_up rows [I, 2 I)
//   model.layers.{l}.mlp.down_proj.weight      block down
// Block l is unit 1 + l; the head is unit 0.
#ifndef WEFT_WORKER_HF_HF_MAPPING_H_
#define WEFT_WORKER_HF_HF_MAPPING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/engine/model_arch.h"

namespace weft::hf {

// One Hugging Face tensor: a block of `rows` x `cols` floats of Weft's (out, in) layout starting
// at float `offset` of `unit` (cols is 1 for a vector).
struct HfTensorMap {
  std::string name;            // Hugging Face's
  std::vector<int64_t> shape;  // Hugging Face's: {rows, cols}, {cols, rows} when transposed,
                               // {rows} for a vector
  int unit = 0;
  size_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 1;
  // Hugging Face stores the transpose (GPT-2's Conv1D): its element (c, r) is Weft's (r, c).
  bool transposed = false;

  size_t size() const { return static_cast<size_t>(rows * cols); }
};

// The float of the unit that holds element `index` (flat, row-major in Hugging Face's shape)
// of `m`.
size_t UnitOffsetOf(const HfTensorMap& m, int64_t index);

// Every Hugging Face tensor of `arch` (gpt2 or llama), by unit then offset. The mapped blocks
// and the vocabulary padding rows tile every unit exactly. INVALID_ARGUMENT for another
// architecture.
absl::StatusOr<std::vector<HfTensorMap>> HfTensorMapping(const engine::ModelArch& arch);

// Another name an import accepts for the Hugging Face tensor `name` ("" when none): GPT-2's
// names without the "transformer." prefix.
std::string HfAlternateName(const std::string& name);

// Whether a Hugging Face file may hold the tensor `name` although it is not in the mapping of
// `arch`: buffers that carry no weights (GPT-2's causal-mask "attn.bias" / "attn.masked_bias",
// rotary "inv_freq" caches) and the LM head a tied model saved anyway.
bool IsIgnorableHfTensor(const std::string& name, const engine::ModelArch& arch);

}  // namespace weft::hf

#endif  // WEFT_WORKER_HF_HF_MAPPING_H_
