#include "worker/hf/hf_config.h"

#include <cstdint>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::hf {
namespace {

using Json = nlohmann::ordered_json;
using weft::v1::ModelSpec;
using weft::v1::RopeScaling;

// Keys of every transformers config that do not change the model's math (generation settings,
// token ids, labels, bookkeeping).
const std::set<std::string>& HarmlessKeys() {
  static const auto* keys = new std::set<std::string>{
      "torch_dtype", "dtype", "transformers_version", "_name_or_path",
      "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
      "initializer_range", "use_cache", "return_dict", "output_hidden_states",
      "output_attentions", "torchscript", "tokenizer_class", "task_specific_params", "id2label",
      "label2id", "problem_type", "prefix", "finetuning_task", "is_decoder",
      "is_encoder_decoder", "chunk_size_feed_forward", "tie_encoder_decoder", "max_length",
      "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
      "no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "use_bfloat16",
      "pruned_heads",
      // GPT2DoubleHeadsModel's classifier head, which a causal LM does not have.
      "summary_activation", "summary_first_dropout", "summary_proj_to_labels", "summary_type",
      "summary_use_proj"};
  return *keys;
}

// Reads the keys of a config.json object, remembering which it consumed so that the rest can
// be refused, and collecting every problem instead of stopping at the first.
class KeyReader {
 public:
  KeyReader(const Json& config, std::vector<std::string>* problems)
      : config_(config), problems_(problems) {}

  // The value of `key`, nullptr when absent or null.
  const Json* Get(const std::string& key) {
    seen_.insert(key);
    const auto it = config_.find(key);
    return it == config_.end() || it->is_null() ? nullptr : &*it;
  }
  // Whether `key` is there with the value null: "none" to transformers, where an absent key
  // takes the class's default.
  bool IsNull(const std::string& key) const {
    const auto it = config_.find(key);
    return it != config_.end() && it->is_null();
  }
  int64_t Int(const std::string& key, int64_t absent) {
    const Json* v = Get(key);
    if (v == nullptr) return absent;
    if (!v->is_number_integer()) return Malformed(key, *v, "an integer"), absent;
    return v->get<int64_t>();
  }
  double Number(const std::string& key, double absent) {
    const Json* v = Get(key);
    if (v == nullptr) return absent;
    if (!v->is_number()) return Malformed(key, *v, "a number"), absent;
    return v->get<double>();
  }
  bool Bool(const std::string& key, bool absent) {
    const Json* v = Get(key);
    if (v == nullptr) return absent;
    if (!v->is_boolean()) return Malformed(key, *v, "true or false"), absent;
    return v->get<bool>();
  }
  std::string String(const std::string& key, const std::string& absent) {
    const Json* v = Get(key);
    if (v == nullptr) return absent;
    if (!v->is_string()) return Malformed(key, *v, "a string"), absent;
    return v->get<std::string>();
  }
  // Refuses `key` unless it is false (or absent, when `absent` is false).
  void RequireFalse(const std::string& key, bool absent, const std::string& why) {
    if (Bool(key, absent)) Refuse(key, "true", why);
  }
  // Reads a dropout probability: any value in [0, 1) is accepted, because dropout is how a
  // model was regularised in training, not part of its weights or its forward math at
  // inference; Weft trains without it (docs/models.md), so the real GPT-2 configs (0.1) import.
  void AcceptDropout(const std::string& key, double absent) {
    const double p = Number(key, absent);
    if (!(p >= 0.0 && p < 1.0)) Refuse(key, Json(p).dump(), "a dropout probability is in [0, 1)");
  }
  void Refuse(const std::string& key, const std::string& value, const std::string& why) {
    problems_->push_back(absl::StrCat("key \"", key, "\" is ", value, ": ", why));
  }
  // Refuses every key neither read nor harmless.
  void RefuseUnknownKeys() {
    for (const auto& [key, value] : config_.items()) {
      if (seen_.count(key) == 0 && HarmlessKeys().count(key) == 0) {
        Refuse(key, value.dump(),
               "not a key Weft knows; refusing it rather than ignoring what may change the "
               "model");
      }
    }
  }

 private:
  void Malformed(const std::string& key, const Json& v, const char* want) {
    problems_->push_back(absl::StrCat("key \"", key, "\" must be ", want, ", got ", v.dump()));
  }

  const Json& config_;
  std::vector<std::string>* problems_;
  std::set<std::string> seen_;
};

// An integer size of the config and the ModelSpec field it sets.
struct SizeKey {
  const char* key;
  int64_t absent;  // transformers' default
  void (ModelSpec::*set)(int32_t);
};

void ReadSizes(KeyReader& r, std::initializer_list<SizeKey> keys, ModelSpec* spec) {
  for (const SizeKey& k : keys) (spec->*k.set)(static_cast<int32_t>(r.Int(k.key, k.absent)));
}

// GPT-2 as Weft implements it (llm.c's): GELU (tanh), LayerNorm eps 1e-5, scaled dot-product
// attention, tied head, MLP 4C. transformers' GPT2Config defaults fill absent keys.
ModelSpec Gpt2Spec(KeyReader& r) {
  ModelSpec spec;
  spec.set_architecture(weft::v1::GPT2);
  ReadSizes(r,
            {{"n_layer", 12, &ModelSpec::set_num_layers},
             {"n_embd", 768, &ModelSpec::set_hidden_size},
             {"n_head", 12, &ModelSpec::set_num_heads},
             {"vocab_size", 50257, &ModelSpec::set_vocab_size},
             {"n_positions", 1024, &ModelSpec::set_context_length}},
            &spec);
  const int64_t n_ctx = r.Int("n_ctx", spec.context_length());
  if (n_ctx != spec.context_length()) {
    r.Refuse("n_ctx", absl::StrCat(n_ctx),
             absl::StrCat("must equal n_positions (", spec.context_length(), ")"));
  }
  const std::string act = r.String("activation_function", "gelu_new");
  if (act != "gelu_new") {
    r.Refuse("activation_function", Json(act).dump(), "Weft's GPT-2 uses gelu_new only");
  }
  if (const Json* inner = r.Get("n_inner");
      inner != nullptr && *inner != Json(4 * int64_t{spec.hidden_size()})) {
    r.Refuse("n_inner", inner->dump(),
             absl::StrCat("Weft's GPT-2 MLP is 4 * n_embd (", 4 * spec.hidden_size(), ") wide"));
  }
  const double eps = r.Number("layer_norm_epsilon", 1e-5);
  if (eps != 1e-5) r.Refuse("layer_norm_epsilon", Json(eps).dump(), "Weft's GPT-2 uses 1e-05");
  if (!r.Bool("scale_attn_weights", true)) {
    r.Refuse("scale_attn_weights", "false", "Weft always scales attention by 1/sqrt(head size)");
  }
  r.RequireFalse("scale_attn_by_inverse_layer_idx", false, "not supported by Weft");
  r.RequireFalse("reorder_and_upcast_attn", false, "not supported by Weft");
  r.RequireFalse("add_cross_attention", false, "Weft's GPT-2 has no cross-attention");
  if (!r.Bool("tie_word_embeddings", true)) {
    r.Refuse("tie_word_embeddings", "false", "Weft's GPT-2 ties the LM head to wte");
  }
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) r.AcceptDropout(key, 0.1);
  return spec;
}

// rope_theta and the scaling, from "rope_parameters" (newer transformers) or the older
// "rope_theta" + "rope_scaling" keys.
void ReadLlamaRope(KeyReader& r, ModelSpec* spec) {
  const Json* params = r.Get("rope_parameters");
  const Json* scaling = params != nullptr ? params : r.Get("rope_scaling");
  const std::string where = params != nullptr ? "rope_parameters" : "rope_scaling";
  double theta = r.Number("rope_theta", 10000.0);
  std::string type = "default";
  if (scaling != nullptr) {
    if (!scaling->is_object()) {
      r.Refuse(where, scaling->dump(), "must be an object or null");
      return;
    }
    if (params != nullptr && params->contains("rope_theta") && (*params)["rope_theta"].is_number()) {
      theta = (*params)["rope_theta"].get<double>();
    }
    const auto t = scaling->contains("rope_type") ? scaling->find("rope_type") : scaling->find("type");
    if (t != scaling->end() && t->is_string()) type = t->get<std::string>();
  }
  spec->set_rope_theta(theta);
  RopeScaling* out = spec->mutable_rope_scaling();
  if (type == "default") {
    out->set_kind(RopeScaling::NONE);
    return;
  }
  if (type != "llama3") {
    r.Refuse(where, scaling->dump(),
             absl::StrCat("rope type \"", type, "\" is not supported; Weft implements none "
                          "(default) and llama3"));
    return;
  }
  out->set_kind(RopeScaling::LLAMA3);
  auto number = [&](const char* key) {
    const auto it = scaling->find(key);
    if (it == scaling->end() || !it->is_number()) {
      r.Refuse(where, scaling->dump(), absl::StrCat("llama3 scaling needs a number \"", key, "\""));
      return 0.0;
    }
    return it->get<double>();
  };
  out->set_factor(number("factor"));
  out->set_low_freq_factor(number("low_freq_factor"));
  out->set_high_freq_factor(number("high_freq_factor"));
  out->set_original_context_length(
      static_cast<int32_t>(number("original_max_position_embeddings")));
}

// transformers' defaults of a Llama-family config class, for the keys a config.json may omit.
struct LlamaFamilyDefaults {
  weft::v1::Architecture architecture;
  const char* model_type;
  const char* hf_class;  // the ...ForCausalLM class the weights are laid out for
  int64_t layers, hidden, heads, kv_heads, intermediate, vocab, max_positions;
  int64_t head_dim;  // 0: hidden / heads
  double rms_norm_eps;
};

constexpr LlamaFamilyDefaults kLlamaFamilies[] = {
    // kv_heads 0: num_attention_heads.
    {weft::v1::LLAMA, "llama", "LlamaForCausalLM", 32, 4096, 32, 0, 11008, 32000, 2048, 0, 1e-6},
    {weft::v1::QWEN2, "qwen2", "Qwen2ForCausalLM", 32, 4096, 32, 32, 22016, 151936, 32768, 0, 1e-6},
    {weft::v1::QWEN3, "qwen3", "Qwen3ForCausalLM", 32, 4096, 32, 32, 22016, 151936, 32768, 128,
     1e-6},
    {weft::v1::MISTRAL, "mistral", "MistralForCausalLM", 32, 4096, 32, 8, 14336, 32000, 131072, 0,
     1e-6},
};

const LlamaFamilyDefaults* FindLlamaFamily(const std::string& model_type) {
  for (const LlamaFamilyDefaults& f : kLlamaFamilies) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

const LlamaFamilyDefaults& DefaultsOf(weft::v1::Architecture architecture) {
  for (const LlamaFamilyDefaults& f : kLlamaFamilies) {
    if (f.architecture == architecture) return f;
  }
  return kLlamaFamilies[0];
}

// Qwen's configs describe a window they apply only with use_sliding_window, and then only
// above max_window_layers: Weft implements the configs that leave it off (every released
// Qwen2.5 and Qwen3 dense model), where all layers attend to every earlier position.
void ReadQwenWindow(KeyReader& r, int64_t layers) {
  r.Get("sliding_window");
  r.Int("max_window_layers", 28);
  if (r.Bool("use_sliding_window", false)) {
    r.Refuse("use_sliding_window", "true",
             "Weft implements Qwen's full attention in every layer, not its per-layer windows");
  }
  if (const Json* types = r.Get("layer_types"); types != nullptr) {
    bool full = types->is_array() && static_cast<int64_t>(types->size()) == layers;
    for (const Json& t : full ? *types : Json::array()) full = full && t == "full_attention";
    if (!full) {
      r.Refuse("layer_types", types->dump(),
               absl::StrCat("Weft implements one \"full_attention\" entry for each of the ", layers,
                            " layers"));
    }
  }
}

// A Llama-family model as Weft implements it (engine/llama): SiLU-gated MLP without biases,
// attention without an output bias; QWEN2 adds q/k/v biases, QWEN3 q/k head norms, MISTRAL a
// sliding window. transformers' config defaults fill absent keys.
ModelSpec LlamaFamilySpec(KeyReader& r, const LlamaFamilyDefaults& f) {
  ModelSpec spec;
  spec.set_architecture(f.architecture);
  ReadSizes(r,
            {{"num_hidden_layers", f.layers, &ModelSpec::set_num_layers},
             {"hidden_size", f.hidden, &ModelSpec::set_hidden_size},
             {"num_attention_heads", f.heads, &ModelSpec::set_num_heads},
             {"intermediate_size", f.intermediate, &ModelSpec::set_intermediate_size},
             {"vocab_size", f.vocab, &ModelSpec::set_vocab_size},
             {"max_position_embeddings", f.max_positions, &ModelSpec::set_context_length}},
            &spec);
  spec.set_num_kv_heads(static_cast<int32_t>(
      r.Int("num_key_value_heads", f.kv_heads > 0 ? f.kv_heads : spec.num_heads())));
  spec.set_rms_norm_eps(r.Number("rms_norm_eps", f.rms_norm_eps));
  spec.set_tie_word_embeddings(r.Bool("tie_word_embeddings", false));
  ReadLlamaRope(r, &spec);
  const std::string act = r.String("hidden_act", "silu");
  if (act != "silu") r.Refuse("hidden_act", Json(act).dump(), "Weft's Llama MLP uses silu only");
  // null (Mistral's way of saying "the default") is hidden / heads too. Written into the spec
  // only where it is not hidden / heads, the spec's own default.
  if (spec.num_heads() > 0) {
    const int64_t natural = spec.hidden_size() / spec.num_heads();
    const int64_t head_dim = r.Int("head_dim", f.head_dim > 0 ? f.head_dim : natural);
    if (head_dim != natural || spec.hidden_size() % spec.num_heads() != 0) {
      spec.set_head_dim(static_cast<int32_t>(head_dim));
    }
  }
  switch (f.architecture) {
    case weft::v1::LLAMA:
      r.RequireFalse("attention_bias", false, "Weft's Llama attention has no biases");
      r.RequireFalse("mlp_bias", false, "Weft's Llama MLP has no biases");
      if (const Json* window = r.Get("sliding_window"); window != nullptr) {
        r.Refuse("sliding_window", window->dump(),
                 "Llama attends to every earlier position (a windowed model is model_type "
                 "\"mistral\")");
      }
      if (const int64_t tp = r.Int("pretraining_tp", 1); tp != 1) {
        r.Refuse("pretraining_tp", absl::StrCat(tp), "only 1 is supported");
      }
      break;
    case weft::v1::QWEN2:
      ReadQwenWindow(r, spec.num_layers());
      break;
    case weft::v1::QWEN3:
      r.RequireFalse("attention_bias", false,
                     "Weft's Qwen3 attention has no biases (its q and k are normalized instead)");
      ReadQwenWindow(r, spec.num_layers());
      break;
    case weft::v1::MISTRAL: {
      // null is no window (full causal attention); absent, MistralConfig's 4096.
      const int64_t window = r.Int("sliding_window", r.IsNull("sliding_window") ? 0 : 4096);
      if (window < 0) r.Refuse("sliding_window", absl::StrCat(window), "must be >= 0 or null (no window)");
      spec.set_sliding_window(static_cast<int32_t>(window));
      break;
    }
    default:
      break;
  }
  r.AcceptDropout("attention_dropout", 0.0);
  return spec;
}

// The spec `config_text` describes, and every problem found on the way (unsupported keys).
struct Derived {
  ModelSpec spec;
  std::vector<std::string> problems;
};

// "architectures" (optional) names the transformers classes the weights were saved from: each
// must be a class of `model_type`'s family that Weft implements, or the weights may be laid out
// for another model (a Mistral or Qwen2 checkpoint saved with model_type "llama").
void CheckArchitectures(const std::string& model_type, KeyReader& r) {
  const Json* architectures = r.Get("architectures");
  if (architectures == nullptr) return;
  std::set<std::string> ok = {"GPT2LMHeadModel", "GPT2DoubleHeadsModel"};
  if (const LlamaFamilyDefaults* family = FindLlamaFamily(model_type); family != nullptr) {
    ok = {family->hf_class};
  }
  bool supported = architectures->is_array();
  for (const Json& a : supported ? *architectures : Json::array()) {
    supported = supported && a.is_string() && ok.count(a.get<std::string>()) > 0;
  }
  if (!supported) {
    r.Refuse("architectures", architectures->dump(),
             absl::StrCat("for model_type \"", model_type, "\" Weft implements ",
                          absl::StrJoin(ok, " or ")));
  }
}

absl::StatusOr<Derived> Derive(const std::string& config_text, const std::string& path) {
  Json config;
  try {
    config = Json::parse(config_text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  Derived d;
  KeyReader r(config, &d.problems);
  const std::string type = r.String("model_type", "");
  if (type == "gpt2") {
    d.spec = Gpt2Spec(r);
  } else if (const LlamaFamilyDefaults* family = FindLlamaFamily(type); family != nullptr) {
    d.spec = LlamaFamilySpec(r, *family);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": key \"model_type\" is ", Json(type).dump(),
                     ": Weft imports \"gpt2\", \"llama\", \"qwen2\", \"qwen3\" and "
                     "\"mistral\""));
  }
  CheckArchitectures(type, r);
  r.RefuseUnknownKeys();
  return d;
}

absl::Status Problems(const std::string& path, const std::vector<std::string>& problems) {
  if (problems.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const std::string& p : problems) lines.push_back(absl::StrCat(path, ": ", p));
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

template <typename T>
std::string ValueText(const T& value) {
  return absl::StrCat(value);
}
std::string ValueText(bool value) { return value ? "true" : "false"; }

// Appends "model.<field> is <want> but config.json <key> is <got>" when they differ.
template <typename T>
void Compare(const char* field, const T& want, const char* key, const T& got,
             std::vector<std::string>* problems) {
  if (want == got) return;
  problems->push_back(absl::StrCat("model.", field, " is ", ValueText(want), " but config.json ",
                                   key, " is ", ValueText(got)));
}

void CompareLlama(const ModelSpec& spec, const ModelSpec& hf, std::vector<std::string>* p) {
  const engine::LlamaConfig want = engine::LlamaConfigFromSpec(spec);
  const engine::LlamaConfig got = engine::LlamaConfigFromSpec(hf);
  Compare("num_layers", want.num_layers, "num_hidden_layers", got.num_layers, p);
  Compare("hidden_size", want.hidden_size, "hidden_size", got.hidden_size, p);
  Compare("num_heads", want.num_heads, "num_attention_heads", got.num_heads, p);
  Compare("num_kv_heads", want.num_kv_heads, "num_key_value_heads", got.num_kv_heads, p);
  Compare("head_dim", want.head_size(), "head_dim", got.head_size(), p);
  Compare("sliding_window", want.sliding_window, "sliding_window", got.sliding_window, p);
  Compare("intermediate_size", want.intermediate_size, "intermediate_size",
          got.intermediate_size, p);
  Compare("vocab_size", want.vocab_size, "vocab_size", got.vocab_size, p);
  if (want.context_length > got.context_length) {
    p->push_back(absl::StrCat("model.context_length is ", want.context_length,
                              " but config.json max_position_embeddings is ", got.context_length,
                              " (it must be at most that)"));
  }
  Compare("rope_theta", want.rope_theta, "rope_theta", got.rope_theta, p);
  if (want.rope_llama3 != got.rope_llama3) {
    p->push_back(absl::StrCat("model.rope_scaling.kind is ", want.rope_llama3 ? "LLAMA3" : "NONE",
                              " but config.json rope_scaling is ",
                              got.rope_llama3 ? "llama3" : "none"));
  }
  if (want.rope_llama3 && got.rope_llama3) {
    Compare("rope_scaling.factor", want.rope_factor, "rope_scaling.factor", got.rope_factor, p);
    Compare("rope_scaling.low_freq_factor", want.rope_low_freq_factor,
            "rope_scaling.low_freq_factor", got.rope_low_freq_factor, p);
    Compare("rope_scaling.high_freq_factor", want.rope_high_freq_factor,
            "rope_scaling.high_freq_factor", got.rope_high_freq_factor, p);
    Compare("rope_scaling.original_context_length", want.rope_original_context_length,
            "rope_scaling.original_max_position_embeddings", got.rope_original_context_length, p);
  }
  Compare("rms_norm_eps", want.rms_norm_eps, "rms_norm_eps", got.rms_norm_eps, p);
  Compare("tie_word_embeddings", want.tie_word_embeddings, "tie_word_embeddings",
          got.tie_word_embeddings, p);
}

void CompareGpt2(const ModelSpec& spec, const ModelSpec& hf, std::vector<std::string>* p) {
  Compare("num_layers", spec.num_layers(), "n_layer", hf.num_layers(), p);
  Compare("hidden_size", spec.hidden_size(), "n_embd", hf.hidden_size(), p);
  Compare("num_heads", spec.num_heads(), "n_head", hf.num_heads(), p);
  Compare("vocab_size", spec.vocab_size(), "vocab_size", hf.vocab_size(), p);
  Compare("context_length", spec.context_length(), "n_positions", hf.context_length(), p);
}

bool IsLlama(const ModelSpec& spec) {
  return engine::LlamaFamilyOf(spec.architecture()).has_value();
}

// The spec's architecture as config.json's model_type names it.
std::string ModelTypeOf(const ModelSpec& spec) {
  return IsLlama(spec) ? DefaultsOf(spec.architecture()).model_type : "gpt2";
}

}  // namespace

absl::StatusOr<ModelSpec> ModelSpecFromHfConfig(const std::string& config_text,
                                                const std::string& path) {
  absl::StatusOr<Derived> d = Derive(config_text, path);
  if (!d.ok()) return d.status();
  if (absl::Status s = Problems(path, d->problems); !s.ok()) return s;
  return d->spec;
}

absl::Status CheckHfConfig(const std::string& config_text, const std::string& path,
                           const ModelSpec& spec) {
  absl::StatusOr<Derived> d = Derive(config_text, path);
  if (!d.ok()) return d.status();
  std::vector<std::string> problems = d->problems;
  const weft::v1::Architecture want = spec.architecture() == weft::v1::ARCHITECTURE_UNSPECIFIED
                                          ? weft::v1::GPT2
                                          : spec.architecture();
  if (want != d->spec.architecture()) {
    problems.push_back(absl::StrCat("model.architecture is ", weft::v1::Architecture_Name(want),
                                    " but config.json model_type is \"", ModelTypeOf(d->spec),
                                    "\""));
  } else if (IsLlama(spec)) {
    CompareLlama(spec, d->spec, &problems);
  } else {
    CompareGpt2(spec, d->spec, &problems);
  }
  return Problems(path, problems);
}

std::string HfConfigJson(const ModelSpec& spec, model_io::Dtype dtype, const HfTokenIds& ids) {
  Json c = Json::object();
  const char* torch_dtype = dtype == model_io::Dtype::kBF16  ? "bfloat16"
                            : dtype == model_io::Dtype::kF16 ? "float16"
                                                         : "float32";
  if (IsLlama(spec)) {
    const engine::LlamaConfig l = engine::LlamaConfigFromSpec(spec);
    const LlamaFamilyDefaults& family = DefaultsOf(spec.architecture());
    c["architectures"] = {family.hf_class};
    c["model_type"] = family.model_type;
    c["num_hidden_layers"] = l.num_layers;
    c["hidden_size"] = l.hidden_size;
    c["num_attention_heads"] = l.num_heads;
    c["num_key_value_heads"] = l.num_kv_heads;
    c["head_dim"] = l.head_size();
    c["intermediate_size"] = l.intermediate_size;
    c["vocab_size"] = l.vocab_size;
    c["max_position_embeddings"] = l.context_length;
    c["hidden_act"] = "silu";
    c["rms_norm_eps"] = l.rms_norm_eps;
    c["rope_theta"] = l.rope_theta;
    c["rope_scaling"] = nullptr;
    if (l.rope_llama3) {
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", l.rope_factor},
                           {"low_freq_factor", l.rope_low_freq_factor},
                           {"high_freq_factor", l.rope_high_freq_factor},
                           {"original_max_position_embeddings", l.rope_original_context_length}};
    }
    c["tie_word_embeddings"] = l.tie_word_embeddings;
    c["attention_dropout"] = 0.0;
    switch (l.family) {
      case engine::LlamaFamily::kLlama:
        c["attention_bias"] = false;
        c["mlp_bias"] = false;
        c["pretraining_tp"] = 1;
        break;
      case engine::LlamaFamily::kQwen3:
        c["attention_bias"] = false;
        [[fallthrough]];
      case engine::LlamaFamily::kQwen2:
        c["use_sliding_window"] = false;
        c["sliding_window"] = nullptr;
        c["max_window_layers"] = l.num_layers;
        break;
      case engine::LlamaFamily::kMistral:
        c["sliding_window"] = l.sliding_window > 0 ? Json(l.sliding_window) : Json(nullptr);
        break;
    }
  } else {
    c["architectures"] = {"GPT2LMHeadModel"};
    c["model_type"] = "gpt2";
    c["n_layer"] = spec.num_layers();
    c["n_embd"] = spec.hidden_size();
    c["n_head"] = spec.num_heads();
    c["n_inner"] = nullptr;
    c["vocab_size"] = spec.vocab_size();
    c["n_positions"] = spec.context_length();
    c["activation_function"] = "gelu_new";
    c["layer_norm_epsilon"] = 1e-5;
    c["scale_attn_weights"] = true;
    c["scale_attn_by_inverse_layer_idx"] = false;
    c["reorder_and_upcast_attn"] = false;
    c["tie_word_embeddings"] = true;
    c["resid_pdrop"] = 0.0;
    c["embd_pdrop"] = 0.0;
    c["attn_pdrop"] = 0.0;
  }
  c["initializer_range"] = 0.02;
  c["use_cache"] = true;
  c["torch_dtype"] = torch_dtype;
  const auto id = [](int v) { return v < 0 ? Json(nullptr) : Json(v); };
  c["bos_token_id"] = id(ids.bos_id);
  c["eos_token_id"] = id(ids.eos_id);
  c["pad_token_id"] = id(ids.pad_id);
  return c.dump(2) + "\n";
}

}  // namespace weft::hf
