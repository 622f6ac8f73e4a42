#include "worker/model_io.h"

#include <algorithm>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "google/protobuf/text_format.h"
#include "worker/data/safetensors.h"
#include "worker/data/sampler.h"

namespace weft::worker {
namespace {

constexpr char kSpecKey[] = "weft.job_spec";

}  // namespace

absl::Status SaveModel(const std::string& path, const weft::v1::JobSpec& spec,
                       const std::vector<std::vector<float>>& units) {
  const engine::GptConfig config = engine::ConfigFromSpec(spec.model());
  if (static_cast<int>(units.size()) != engine::NumUnits(config)) {
    return absl::InternalError(absl::StrCat("SaveModel: ", units.size(), " units, the model has ",
                                            engine::NumUnits(config)));
  }
  std::vector<data::TensorData> tensors;
  for (int u = 0; u < engine::NumUnits(config); ++u) {
    for (const engine::TensorInfo& t : engine::UnitTensors(config, u)) {
      data::TensorData out;
      out.name = t.name;
      out.shape = t.shape;
      out.data.assign(units[u].begin() + t.offset, units[u].begin() + t.offset + t.size);
      tensors.push_back(std::move(out));
    }
  }
  std::string spec_text;
  google::protobuf::TextFormat::PrintToString(spec, &spec_text);
  return data::WriteSafetensors(path, tensors,
                                {{kSpecKey, spec_text}, {"format", "weft-gpt2-fp32"}});
}

absl::StatusOr<LoadedModel> LoadModel(const std::string& path) {
  WEFT_ASSIGN_OR_RETURN(data::SafetensorsFile file, data::ReadSafetensors(path));
  LoadedModel model;
  auto spec_it = file.metadata.find(kSpecKey);
  if (spec_it == file.metadata.end() ||
      !google::protobuf::TextFormat::ParseFromString(spec_it->second, &model.spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no readable ", kSpecKey, " metadata: not a Weft model"));
  }
  model.config = engine::ConfigFromSpec(model.spec.model());
  std::map<std::string, const data::TensorData*> by_name;
  for (const auto& t : file.tensors) by_name[t.name] = &t;
  for (int u = 0; u < engine::NumUnits(model.config); ++u) {
    std::vector<float> unit(engine::UnitSize(model.config, u));
    for (const engine::TensorInfo& t : engine::UnitTensors(model.config, u)) {
      auto it = by_name.find(t.name);
      if (it == by_name.end()) {
        return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", t.name, " missing"));
      }
      if (it->second->shape != t.shape || it->second->data.size() != t.size) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": tensor ", t.name, " has the wrong shape for the model"));
      }
      std::copy(it->second->data.begin(), it->second->data.end(), unit.begin() + t.offset);
    }
    model.units.push_back(std::move(unit));
  }
  return model;
}

absl::StatusOr<std::string> GenerateText(const LoadedModel& model, const std::string& prompt,
                                         const SampleOptions& options) {
  const engine::GptConfig& c = model.config;
  WEFT_RETURN_IF_ERROR(data::CheckSamplingParams(options.temperature, options.top_k,
                                                 options.tokens, c.vocab_size));
  const bool bytes = c.vocab_size == 256;
  std::vector<int32_t> tokens;
  if (bytes) {
    for (unsigned char ch : prompt) tokens.push_back(ch);
  } else {
    for (absl::string_view piece : absl::StrSplit(prompt, ' ', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(piece, &id) || id < 0 || id >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prompt: this model reads token ids in [0, ", c.vocab_size, "), got \"",
            std::string(piece), "\""));
      }
      tokens.push_back(id);
    }
  }
  if (tokens.empty()) tokens.push_back(bytes ? '\n' : 0);

  engine::GptCpu gpt(c, 1, c.context_length);
  uint64_t rng = options.seed;
  std::string out;
  for (int i = 0; i < options.tokens; ++i) {
    // The model sees at most its context: the most recent tokens.
    const int t = std::min<int>(static_cast<int>(tokens.size()), c.context_length);
    const int32_t* window = tokens.data() + tokens.size() - t;
    gpt.SetShape(1, t);
    gpt.EncoderForward(model.units[0].data(), window);
    for (int l = 0; l < c.num_layers; ++l) gpt.BlockForward(l, model.units[1 + l].data());
    gpt.ClassifierForward(model.units[0].data(), nullptr, 0.0f);
    const float* logits = gpt.Logits() + static_cast<size_t>(t - 1) * c.padded_vocab_size;
    const int32_t next =
        data::SampleToken(logits, c.vocab_size, options.temperature, options.top_k, &rng);
    tokens.push_back(next);
    if (bytes) {
      out.push_back(static_cast<char>(next));
    } else {
      absl::StrAppend(&out, out.empty() ? "" : " ", next);
    }
  }
  return out;
}

}  // namespace weft::worker
