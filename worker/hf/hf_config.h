// A Hugging Face model's config.json and Weft's ModelSpec, both ways: deriving the spec a
// checkpoint needs (`trainctl model from-hf`), checking a job's spec against a checkpoint
// before importing it, and writing the config.json of an export.
//
// What is understood (transformers' class defaults apply to absent keys, as from_pretrained
// does):
//   gpt2:  n_layer, n_embd, n_head, vocab_size, n_positions (= context_length: wpe has that
//          many rows).
//   llama: num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads,
//          intermediate_size, vocab_size, max_position_embeddings (>= context_length: no weight
//          depends on it), rope_theta, rope_scaling (null or rope_type "llama3"; also the newer
//          "rope_parameters" form), rms_norm_eps, tie_word_embeddings.
// Every key that would change the math in a way Weft does not implement (a bias, a sliding
// window, another activation or rotary scaling, dropout, ...) is refused, naming it, and so is
// an "architectures" class Weft does not implement for the model_type (gpt2: GPT2LMHeadModel,
// GPT2DoubleHeadsModel; llama: LlamaForCausalLM); keys that do not change the math
// (torch_dtype, token ids, ...) are accepted; any key this file does not know is refused too,
// rather than silently ignored.
#ifndef WEFT_WORKER_HF_HF_CONFIG_H_
#define WEFT_WORKER_HF_HF_CONFIG_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model_io/safetensors.h"
#include "worker/hf/hf_tokenizer.h"
#include "weft/v1/job.pb.h"

namespace weft::hf {

// The ModelSpec `config_text` (the contents of the file `path`, which only labels errors)
// describes, defaults left unset where Weft's equal transformers' (padded_vocab_size).
// INVALID_ARGUMENT listing every unsupported or malformed key, one per line, each naming it.
absl::StatusOr<weft::v1::ModelSpec> ModelSpecFromHfConfig(const std::string& config_text,
                                                          const std::string& path);

// OK when `config_text` describes exactly `spec` (a normalized ModelSpec); otherwise
// INVALID_ARGUMENT listing every unsupported key and every field that differs, as
// "model.<field> is X but config.json <key> is Y".
absl::Status CheckHfConfig(const std::string& config_text, const std::string& path,
                           const weft::v1::ModelSpec& spec);

// The config.json of `spec` (normalized) for weights stored as `dtype`: model_type,
// architectures, every size and option, torch_dtype, and bos/eos/pad_token_id from `ids`
// (null where -1: transformers' GPT-2 defaults, 50256, would name no token of a Weft model).
std::string HfConfigJson(const weft::v1::ModelSpec& spec, model_io::Dtype dtype,
                         const HfTokenIds& ids = {});

}  // namespace weft::hf

#endif  // WEFT_WORKER_HF_HF_CONFIG_H_
