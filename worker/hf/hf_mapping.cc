#include "worker/hf/hf_mapping.h"

#include <string_view>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::hf {
namespace {

// Which rows of a Weft tensor one Hugging Face tensor fills.
enum class Rows {
  kLive,        // all of them but the vocabulary padding
  kQ,           // qkvw (or qkvb) [0, Q)
  kK,           // qkvw [Q, Q + KV)
  kV,           // qkvw [Q + KV, Q + 2 KV)
  kFirstHalf,   // gate_up [0, I)
  kSecondHalf,  // gate_up [I, 2 I)
};

// Weft's tensor `weft` (its name in the unit, without the block prefix) holds the Hugging Face
// tensor `hf` ("{l}" is the layer) in the rows `rows`.
struct Rule {
  const char* weft;
  const char* hf;
  Rows rows;
  bool transposed;
};

constexpr Rule kGpt2Rules[] = {
    {"wte", "transformer.wte.weight", Rows::kLive, false},
    {"wpe", "transformer.wpe.weight", Rows::kLive, false},
    {"lnfw", "transformer.ln_f.weight", Rows::kLive, false},
    {"lnfb", "transformer.ln_f.bias", Rows::kLive, false},
    {"ln1w", "transformer.h.{l}.ln_1.weight", Rows::kLive, false},
    {"ln1b", "transformer.h.{l}.ln_1.bias", Rows::kLive, false},
    {"qkvw", "transformer.h.{l}.attn.c_attn.weight", Rows::kLive, true},
    {"qkvb", "transformer.h.{l}.attn.c_attn.bias", Rows::kLive, false},
    {"attprojw", "transformer.h.{l}.attn.c_proj.weight", Rows::kLive, true},
    {"attprojb", "transformer.h.{l}.attn.c_proj.bias", Rows::kLive, false},
    {"ln2w", "transformer.h.{l}.ln_2.weight", Rows::kLive, false},
    {"ln2b", "transformer.h.{l}.ln_2.bias", Rows::kLive, false},
    {"fcw", "transformer.h.{l}.mlp.c_fc.weight", Rows::kLive, true},
    {"fcb", "transformer.h.{l}.mlp.c_fc.bias", Rows::kLive, false},
    {"fcprojw", "transformer.h.{l}.mlp.c_proj.weight", Rows::kLive, true},
    {"fcprojb", "transformer.h.{l}.mlp.c_proj.bias", Rows::kLive, false},
};

constexpr Rule kLlamaRules[] = {
    {"embed", "model.embed_tokens.weight", Rows::kLive, false},
    {"norm", "model.norm.weight", Rows::kLive, false},
    {"lm_head", "lm_head.weight", Rows::kLive, false},
    {"attn_norm", "model.layers.{l}.input_layernorm.weight", Rows::kLive, false},
    {"qkvw", "model.layers.{l}.self_attn.q_proj.weight", Rows::kQ, false},
    {"qkvw", "model.layers.{l}.self_attn.k_proj.weight", Rows::kK, false},
    {"qkvw", "model.layers.{l}.self_attn.v_proj.weight", Rows::kV, false},
    {"attn_out", "model.layers.{l}.self_attn.o_proj.weight", Rows::kLive, false},
    {"mlp_norm", "model.layers.{l}.post_attention_layernorm.weight", Rows::kLive, false},
    {"gate_up", "model.layers.{l}.mlp.gate_proj.weight", Rows::kFirstHalf, false},
    {"gate_up", "model.layers.{l}.mlp.up_proj.weight", Rows::kSecondHalf, false},
    {"down", "model.layers.{l}.mlp.down_proj.weight", Rows::kLive, false},
    // Qwen2's q/k/v biases and Qwen3's head norms; the other families have no such tensors.
    {"qkvb", "model.layers.{l}.self_attn.q_proj.bias", Rows::kQ, false},
    {"qkvb", "model.layers.{l}.self_attn.k_proj.bias", Rows::kK, false},
    {"qkvb", "model.layers.{l}.self_attn.v_proj.bias", Rows::kV, false},
    {"q_norm", "model.layers.{l}.self_attn.q_norm.weight", Rows::kLive, false},
    {"k_norm", "model.layers.{l}.self_attn.k_norm.weight", Rows::kLive, false},
};

// The architectures whose tensors kLlamaRules names (engine/llama's families).
bool IsLlamaFamilyName(const std::string& name) {
  return name == "llama" || name == "qwen2" || name == "qwen3" || name == "mistral";
}

// [begin, end) rows of `t` (rows x cols) that `rows` selects; q_width is the query rows of
// qkvw and qkvb (Q), so KV = (rows - Q) / 2.
std::pair<int64_t, int64_t> RowRange(const engine::TensorInfo& t, int64_t cols, int64_t q_width,
                                     Rows rows) {
  const int64_t all = t.shape[0];
  const int64_t kv = (all - q_width) / 2;
  switch (rows) {
    case Rows::kLive:
      return {0, static_cast<int64_t>(t.live_size) / cols};
    case Rows::kQ:
      return {0, q_width};
    case Rows::kK:
      return {q_width, q_width + kv};
    case Rows::kV:
      return {q_width + kv, all};
    case Rows::kFirstHalf:
      return {0, all / 2};
    case Rows::kSecondHalf:
      return {all / 2, all};
  }
  return {0, 0};
}

// The tensor's name within its unit: "h.3.qkvw" -> "qkvw".
std::string ShortName(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(dot + 1);
}

}  // namespace

absl::StatusOr<std::vector<HfTensorMap>> HfTensorMapping(const engine::ModelArch& arch) {
  const std::string family = arch.name();
  const Rule* begin = nullptr;
  const Rule* end = nullptr;
  if (family == "gpt2") {
    begin = std::begin(kGpt2Rules);
    end = std::end(kGpt2Rules);
  } else if (IsLlamaFamilyName(family)) {
    begin = std::begin(kLlamaRules);
    end = std::end(kLlamaRules);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("no Hugging Face mapping for architecture ", family,
                     " (only gpt2, llama, qwen2, qwen3 and mistral)"));
  }
  // The query rows of the fused q/k/v tensors (GPT-2's c_attn is mapped whole).
  const auto* llama = dynamic_cast<const engine::LlamaArch*>(&arch);
  const int64_t q_width = llama != nullptr ? llama->config().q_width() : 0;
  std::vector<HfTensorMap> out;
  for (int u = 0; u < arch.NumUnits(); ++u) {
    const std::string layer = absl::StrCat(u - 1);
    for (const engine::TensorInfo& t : arch.UnitTensors(u)) {
      const int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
      bool mapped = false;
      for (const Rule* rule = begin; rule != end; ++rule) {
        if (ShortName(t.name) != rule->weft) continue;
        mapped = true;
        const auto [r0, r1] = RowRange(t, cols, q_width, rule->rows);
        HfTensorMap m;
        m.name = absl::StrReplaceAll(rule->hf, {{"{l}", layer}});
        m.unit = u;
        m.offset = t.offset + static_cast<size_t>(r0 * cols);
        m.rows = r1 - r0;
        m.cols = cols;
        m.transposed = rule->transposed;
        m.shape = t.shape.size() == 1 ? std::vector<int64_t>{m.rows}
                  : m.transposed      ? std::vector<int64_t>{cols, m.rows}
                                      : std::vector<int64_t>{m.rows, cols};
        out.push_back(std::move(m));
      }
      if (!mapped) {
        return absl::InternalError(absl::StrCat("the Hugging Face mapping of ", family,
                                                " has no rule for tensor ", t.name));
      }
    }
  }
  return out;
}

size_t UnitOffsetOf(const HfTensorMap& m, int64_t index) {
  if (!m.transposed) return m.offset + static_cast<size_t>(index);
  // Hugging Face's (c, r), of shape (cols, rows), is Weft's (r, c).
  const int64_t c = index / m.rows;
  const int64_t r = index % m.rows;
  return m.offset + static_cast<size_t>(r * m.cols + c);
}

std::string HfAlternateName(const std::string& name) {
  const std::string kPrefix = "transformer.";
  if (!absl::StartsWith(name, kPrefix)) return "";
  return name.substr(kPrefix.size());
}

bool IsIgnorableHfTensor(const std::string& name, const engine::ModelArch& arch) {
  if (arch.name() == "gpt2") {
    return absl::EndsWith(name, ".attn.bias") || absl::EndsWith(name, ".attn.masked_bias") ||
           name == "lm_head.weight";
  }
  if (IsLlamaFamilyName(arch.name())) {
    return absl::EndsWith(name, ".rotary_emb.inv_freq") ||
           (name == "lm_head.weight" && arch.UnitTensors(0).size() == 2);
  }
  return false;
}

}  // namespace weft::hf
