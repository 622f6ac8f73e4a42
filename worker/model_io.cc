#include "worker/model_io.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "google/protobuf/text_format.h"
#include "worker/data/safetensors.h"
#include "worker/data/sampler.h"
#include "worker/engine/cpu/model.h"

namespace weft::worker {
namespace {

constexpr char kSpecKey[] = "weft.job_spec";

}  // namespace

absl::Status SaveModel(const std::string& path, const weft::v1::JobSpec& spec,
                       const std::vector<std::vector<float>>& units) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec.model()));
  if (static_cast<int>(units.size()) != arch->NumUnits()) {
    return absl::InternalError(
        absl::StrCat("SaveModel: ", units.size(), " units, the model has ", arch->NumUnits()));
  }
  std::vector<data::TensorData> tensors;
  for (int u = 0; u < arch->NumUnits(); ++u) {
    for (const engine::TensorInfo& t : arch->UnitTensors(u)) {
      data::TensorData out;
      out.name = t.name;
      out.shape = t.shape;
      out.data.assign(units[u].begin() + t.offset, units[u].begin() + t.offset + t.size);
      tensors.push_back(std::move(out));
    }
  }
  std::string spec_text;
  google::protobuf::TextFormat::PrintToString(spec, &spec_text);
  return data::WriteSafetensors(
      path, tensors,
      {{kSpecKey, spec_text}, {"format", absl::StrCat("weft-", arch->name(), "-fp32")}});
}

absl::StatusOr<std::unique_ptr<ModelFileWriter>> ModelFileWriter::Begin(
    const std::string& path, const weft::v1::JobSpec& spec,
    const std::map<std::string, std::string>& extra_metadata) {
  std::unique_ptr<ModelFileWriter> writer(new ModelFileWriter());
  writer->path_ = path;
  WEFT_ASSIGN_OR_RETURN(writer->arch_, engine::MakeModelArch(spec.model()));
  const engine::ModelArch& arch = *writer->arch_;
  std::vector<data::TensorHeader> tensors;
  for (int u = 0; u < arch.NumUnits(); ++u) {
    for (const engine::TensorInfo& t : arch.UnitTensors(u)) tensors.push_back({t.name, t.shape});
  }
  std::string spec_text;
  google::protobuf::TextFormat::PrintToString(spec, &spec_text);
  std::map<std::string, std::string> metadata = {
      {kSpecKey, spec_text}, {"format", absl::StrCat("weft-", arch.name(), "-fp32")}};
  for (const auto& [key, value] : extra_metadata) {
    if (!metadata.emplace(key, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": metadata key ", key, " is the model file's own"));
    }
  }
  WEFT_ASSIGN_OR_RETURN(writer->file_, data::SafetensorsWriter::Begin(path, tensors, metadata));
  return writer;
}

absl::Status ModelFileWriter::WriteUnit(int unit, const std::vector<float>& params) {
  if (unit != next_unit_ || unit >= arch_->NumUnits()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": unit ", unit,
                                                      " written out of order (next is ",
                                                      next_unit_, " of ", arch_->NumUnits(), ")"));
  }
  if (params.size() != arch_->UnitSize(unit)) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": unit ", unit, " has ",
                                                      params.size(), " floats, the model needs ",
                                                      arch_->UnitSize(unit)));
  }
  for (const engine::TensorInfo& t : arch_->UnitTensors(unit)) {
    WEFT_RETURN_IF_ERROR(file_->Append(params.data() + t.offset, t.size));
  }
  ++next_unit_;
  return absl::OkStatus();
}

absl::Status ModelFileWriter::Commit() {
  if (next_unit_ != arch_->NumUnits()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": commit after ", next_unit_,
                                                      " of ", arch_->NumUnits(), " units"));
  }
  return file_->Commit();
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
  auto arch = engine::MakeModelArch(model.spec.model());
  if (!arch.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", arch.status().message()));
  }
  model.arch = std::move(*arch);
  std::map<std::string, const data::TensorData*> by_name;
  for (const auto& t : file.tensors) by_name[t.name] = &t;
  for (int u = 0; u < model.arch->NumUnits(); ++u) {
    std::vector<float> unit(model.arch->UnitSize(u));
    for (const engine::TensorInfo& t : model.arch->UnitTensors(u)) {
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
  const engine::ModelArch& arch = *model.arch;
  const int vocab = arch.vocab_size();
  const int context = arch.context_length();
  WEFT_RETURN_IF_ERROR(
      data::CheckSamplingParams(options.temperature, options.top_k, options.tokens, vocab));
  const bool bytes = vocab == 256;
  std::vector<int32_t> tokens;
  if (bytes) {
    for (unsigned char ch : prompt) tokens.push_back(ch);
  } else {
    for (absl::string_view piece : absl::StrSplit(prompt, ' ', absl::SkipWhitespace())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(piece, &id) || id < 0 || id >= vocab) {
        return absl::InvalidArgumentError(
            absl::StrCat("--prompt: this model reads token ids in [0, ", vocab, "), got \"",
                         std::string(piece), "\""));
      }
      tokens.push_back(id);
    }
  }
  if (tokens.empty()) tokens.push_back(bytes ? '\n' : 0);

  // Activations for the longest window this call runs, not the whole context: attention keeps
  // (NH, T, T) scores, which at a Llama-3 context (131,072) would not fit in any memory.
  const int max_t = static_cast<int>(
      std::min<int64_t>(context, static_cast<int64_t>(tokens.size()) + options.tokens));
  const std::unique_ptr<engine::cpu::CpuModel> cpu =
      engine::cpu::CreateCpuModel(arch, 1, max_t, engine::Checkpointing::kNone);
  uint64_t rng = options.seed;
  std::string out;
  for (int i = 0; i < options.tokens; ++i) {
    // The model sees at most its context: the most recent tokens.
    const int t = std::min<int>(static_cast<int>(tokens.size()), context);
    const int32_t* window = tokens.data() + tokens.size() - t;
    cpu->SetShape(1, t);
    cpu->EncoderForward(model.units[0].data(), window);
    for (int l = 0; l < arch.num_layers(); ++l) cpu->BlockForward(l, model.units[1 + l].data());
    cpu->ClassifierForward(model.units[0].data(), nullptr, 0.0f);
    const float* logits = cpu->Logits() + static_cast<size_t>(t - 1) * arch.padded_vocab_size();
    const int32_t next = data::SampleToken(logits, vocab, options.temperature, options.top_k, &rng);
    tokens.push_back(next);
    if (bytes) {
      out.push_back(static_cast<char>(next));
    } else {
      absl::StrAppend(&out, out.empty() ? "" : " ", next);
    }
  }
  return out;
}

absl::StatusOr<std::vector<float>> ModelLogits(const LoadedModel& model,
                                               const std::vector<int32_t>& tokens) {
  const engine::ModelArch& arch = *model.arch;
  const int t = static_cast<int>(tokens.size());
  if (t < 1 || t > arch.context_length()) {
    return absl::InvalidArgumentError(absl::StrCat("--tokens: between 1 and the context length ",
                                                   arch.context_length(), " ids, got ", t));
  }
  for (int32_t id : tokens) {
    if (id < 0 || id >= arch.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat("--tokens: ids are in [0, ",
                                                     arch.vocab_size(), "), got ", id));
    }
  }
  const std::unique_ptr<engine::cpu::CpuModel> cpu =
      engine::cpu::CreateCpuModel(arch, 1, t, engine::Checkpointing::kNone);
  cpu->SetShape(1, t);
  cpu->EncoderForward(model.units[0].data(), tokens.data());
  for (int l = 0; l < arch.num_layers(); ++l) cpu->BlockForward(l, model.units[1 + l].data());
  cpu->ClassifierForward(model.units[0].data(), nullptr, 0.0f);
  std::vector<float> logits(static_cast<size_t>(t) * arch.vocab_size());
  for (int i = 0; i < t; ++i) {
    const float* row = cpu->Logits() + static_cast<size_t>(i) * arch.padded_vocab_size();
    std::copy(row, row + arch.vocab_size(), logits.begin() + static_cast<size_t>(i) * arch.vocab_size());
  }
  return logits;
}

}  // namespace weft::worker
