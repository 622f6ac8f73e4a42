#include "worker/model_io/model_file.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/status_context.h"
#include "google/protobuf/text_format.h"
#include "worker/data/manifest.h"
#include "worker/model_io/safetensors.h"
#include "worker/data/sampler.h"
#include "worker/engine/cpu/model.h"

namespace weft::model_io {
namespace {

constexpr char kSpecKey[] = "weft.job_spec";
constexpr char kTokenizerKindKey[] = "weft.tokenizer.kind";
constexpr char kTokenizerModelKey[] = "weft.tokenizer.model";
constexpr char kTokenizerCrcKey[] = "weft.tokenizer.crc32c";
// tokenizer.json only (its bytes do not say): the ids of BOS and EOS, absent when none.
constexpr char kTokenizerBosKey[] = "weft.tokenizer.bos_id";
constexpr char kTokenizerEosKey[] = "weft.tokenizer.eos_id";
constexpr char kChatTemplateKey[] = "weft.chat.template";

// The tokenizer a manifest names, loaded and checked against what the manifest says of it.
absl::StatusOr<std::shared_ptr<const data::Tokenizer>> ManifestTokenizer(
    const std::string& manifest_path) {
  WEFT_ASSIGN_OR_RETURN(const data::DatasetManifest m, data::ReadManifest(manifest_path));
  if (m.tokenizer.kind == "bytes") return data::MakeByteTokenizer();
  const std::string file = data::ManifestFilePath(m, m.tokenizer.file);
  absl::StatusOr<std::string> bytes = data::ReadTokenizerFile(file);
  if (!bytes.ok()) return Annotate(bytes.status(), "data.manifest_path");
  auto tok = data::LoadTokenizerFromBytes(m.tokenizer.kind, *std::move(bytes), file,
                                          m.tokenizer.bos_id, m.tokenizer.eos_id);
  if (!tok.ok()) return Annotate(tok.status(), "data.manifest_path");
  const data::Tokenizer& t = **tok;
  if (t.fingerprint() != m.tokenizer.crc32c || t.vocab_size() != m.tokenizer.vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.manifest_path: ", file, ": tokenizer changed after its manifest was written: crc32c ",
        data::FormatCrc32c(t.fingerprint()), ", vocab_size ", t.vocab_size(), ", but the manifest ",
        m.dir, "/", data::kManifestFileName, " says ", data::FormatCrc32c(m.tokenizer.crc32c),
        ", ", m.tokenizer.vocab_size, " (tokenizer)"));
  }
  return std::shared_ptr<const data::Tokenizer>(std::move(*tok));
}

// A model file's tokenizer entries (none: nullptr, or bytes for a vocabulary of 256).
absl::StatusOr<std::shared_ptr<const data::Tokenizer>> TokenizerFromMetadata(
    const std::string& path, const std::map<std::string, std::string>& metadata, int vocab) {
  auto entry = [&](const char* key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  auto corrupt = [&](const char* key, absl::string_view what) {
    return absl::DataLossError(
        absl::StrCat(path, ": metadata ", key, " ", what, ": the tokenizer entry is corrupt"));
  };
  const std::string* kind = entry(kTokenizerKindKey);
  if (kind == nullptr) {
    if (vocab == 256) return std::shared_ptr<const data::Tokenizer>(data::MakeByteTokenizer());
    return std::shared_ptr<const data::Tokenizer>();
  }
  if (*kind == "bytes") return std::shared_ptr<const data::Tokenizer>(data::MakeByteTokenizer());
  if (*kind != "sentencepiece" && *kind != "tokenizer.json") {
    return corrupt(kTokenizerKindKey, absl::StrCat("is \"", *kind, "\", not \"bytes\", "
                                                   "\"sentencepiece\" or \"tokenizer.json\""));
  }
  const std::string* encoded = entry(kTokenizerModelKey);
  const std::string* crc_text = entry(kTokenizerCrcKey);
  std::string bytes;
  uint32_t crc = 0;
  if (encoded == nullptr) return corrupt(kTokenizerModelKey, "is missing");
  if (!absl::Base64Unescape(*encoded, &bytes)) return corrupt(kTokenizerModelKey, "is not base64");
  if (crc_text == nullptr || !data::ParseCrc32c(*crc_text, &crc)) {
    return corrupt(kTokenizerCrcKey, "is missing or not \"0x\" and 8 hex digits");
  }
  int special[2] = {-1, -1};  // BOS, EOS
  for (int i = 0; i < 2; ++i) {
    const char* key = i == 0 ? kTokenizerBosKey : kTokenizerEosKey;
    const std::string* id = entry(key);
    if (id != nullptr && !absl::SimpleAtoi(*id, &special[i])) {
      return corrupt(key, "is not an integer");
    }
  }
  auto tok = data::LoadTokenizerFromBytes(*kind, std::move(bytes), path, special[0], special[1]);
  if (!tok.ok()) return corrupt(kTokenizerModelKey, tok.status().message());
  if ((*tok)->fingerprint() != crc) {
    return corrupt(kTokenizerModelKey,
                   absl::StrCat("has crc32c ", data::FormatCrc32c((*tok)->fingerprint()), ", but ",
                                kTokenizerCrcKey, " says ", *crc_text));
  }
  if ((*tok)->vocab_size() > vocab) {
    return corrupt(kTokenizerModelKey, absl::StrCat("has ", (*tok)->vocab_size(),
                                                    " pieces, more than the model's vocabulary ",
                                                    vocab));
  }
  return std::shared_ptr<const data::Tokenizer>(std::move(*tok));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const data::Tokenizer>> LoadJobTokenizer(
    const weft::v1::JobSpec& spec) {
  const weft::v1::DataSpec& d = spec.data();
  if (!d.manifest_path().empty()) return ManifestTokenizer(d.manifest_path());
  const int vocab = spec.model().vocab_size();
  if (d.tokenizer_path().empty()) {
    if (d.format() == weft::v1::DATA_FORMAT_TEXT_BYTES || vocab == 256) {
      return std::shared_ptr<const data::Tokenizer>(data::MakeByteTokenizer());
    }
    return std::shared_ptr<const data::Tokenizer>();
  }
  if (d.format() == weft::v1::DATA_FORMAT_TEXT_BYTES) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.tokenizer_path: ", d.tokenizer_path(), ": a tokenizer, but "
        "data.format DATA_FORMAT_TEXT_BYTES reads bytes, not its ids (leave tokenizer_path empty, "
        "or prepare the text with `trainctl data prepare --tokenizer`)"));
  }
  auto tok = data::LoadTokenizerFile(d.tokenizer_path());
  if (!tok.ok()) return Annotate(tok.status(), "data.tokenizer_path");
  if ((*tok)->vocab_size() > vocab) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.tokenizer_path: ", d.tokenizer_path(), ": the tokenizer has ", (*tok)->vocab_size(),
        " pieces, more than model.vocab_size ", vocab, " (set model.vocab_size >= ",
        (*tok)->vocab_size(), ")"));
  }
  return std::shared_ptr<const data::Tokenizer>(std::move(*tok));
}

absl::StatusOr<std::string> LoadJobChatTemplate(const weft::v1::JobSpec& spec) {
  const std::string& path = spec.data().manifest_path();
  if (path.empty()) return std::string();
  absl::StatusOr<data::DatasetManifest> m = data::ReadManifest(path);
  if (!m.ok()) return Annotate(m.status(), "data.manifest_path");
  return m->chat_template;
}

absl::StatusOr<std::map<std::string, std::string>> TokenizerMetadata(
    const data::Tokenizer* tokenizer, int model_vocab_size) {
  std::map<std::string, std::string> metadata;
  if (tokenizer == nullptr) return metadata;
  if (tokenizer->vocab_size() > model_vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokenizer has ", tokenizer->vocab_size(),
                     " pieces, more than the model's vocabulary ", model_vocab_size));
  }
  metadata[kTokenizerKindKey] = std::string(tokenizer->kind());
  if (tokenizer->kind() != "bytes") {
    metadata[kTokenizerModelKey] = absl::Base64Escape(tokenizer->model_bytes());
    metadata[kTokenizerCrcKey] = data::FormatCrc32c(tokenizer->fingerprint());
  }
  if (tokenizer->kind() == "tokenizer.json") {
    if (tokenizer->bos_id() >= 0) metadata[kTokenizerBosKey] = absl::StrCat(tokenizer->bos_id());
    if (tokenizer->eos_id() >= 0) metadata[kTokenizerEosKey] = absl::StrCat(tokenizer->eos_id());
  }
  return metadata;
}

absl::StatusOr<std::map<std::string, std::string>> ModelFileMetadata(
    const data::Tokenizer* tokenizer, int model_vocab_size, const std::string& chat_template) {
  WEFT_ASSIGN_OR_RETURN(auto metadata, TokenizerMetadata(tokenizer, model_vocab_size));
  if (!chat_template.empty()) metadata[kChatTemplateKey] = chat_template;
  return metadata;
}

absl::Status SaveModel(const std::string& path, const weft::v1::JobSpec& spec,
                       const std::vector<std::vector<float>>& units,
                       const data::Tokenizer* tokenizer, const std::string& chat_template) {
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec.model()));
  if (static_cast<int>(units.size()) != arch->NumUnits()) {
    return absl::InternalError(
        absl::StrCat("SaveModel: ", units.size(), " units, the model has ", arch->NumUnits()));
  }
  auto metadata = ModelFileMetadata(tokenizer, arch->vocab_size(), chat_template);
  if (!metadata.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("SaveModel: ", metadata.status().message()));
  }
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<ModelFileWriter> file,
                        ModelFileWriter::Begin(path, spec, *metadata));
  for (int u = 0; u < arch->NumUnits(); ++u) WEFT_RETURN_IF_ERROR(file->WriteUnit(u, units[u]));
  return file->Commit();
}

absl::StatusOr<std::unique_ptr<ModelFileWriter>> ModelFileWriter::Begin(
    const std::string& path, const weft::v1::JobSpec& spec,
    const std::map<std::string, std::string>& extra_metadata) {
  std::unique_ptr<ModelFileWriter> writer(new ModelFileWriter());
  writer->path_ = path;
  WEFT_ASSIGN_OR_RETURN(writer->arch_, engine::MakeModelArch(spec.model()));
  const engine::ModelArch& arch = *writer->arch_;
  std::vector<TensorHeader> tensors;
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
  WEFT_ASSIGN_OR_RETURN(writer->file_, SafetensorsWriter::Begin(path, tensors, metadata));
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
  WEFT_ASSIGN_OR_RETURN(SafetensorsFile file, ReadSafetensors(path));
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
  std::map<std::string, const TensorData*> by_name;
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
  WEFT_ASSIGN_OR_RETURN(model.tokenizer,
                        TokenizerFromMetadata(path, file.metadata, model.arch->vocab_size()));
  if (auto chat = file.metadata.find(kChatTemplateKey); chat != file.metadata.end()) {
    model.chat_template = chat->second;
  }
  return model;
}

namespace {

// The prompt's ids: the tokenizer's encoding of its text, or whitespace-separated ids. An empty
// prompt starts where a document does: after an EOS (SentencePiece), a newline (bytes), id 0.
absl::StatusOr<std::vector<int32_t>> PromptTokens(const data::Tokenizer* tokenizer,
                                                  const std::string& prompt, int vocab) {
  std::vector<int32_t> tokens;
  if (tokenizer != nullptr) {
    auto encoded = tokenizer->Encode(prompt);
    if (!encoded.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--prompt: ", encoded.status().message()));
    }
    tokens = std::move(*encoded);
    if (tokens.empty()) {
      if (tokenizer->eos_id() >= 0) {
        tokens.push_back(tokenizer->eos_id());
      } else {
        WEFT_RETURN_IF_ERROR(tokenizer->EncodeTo("\n", &tokens));
      }
    }
    return tokens;
  }
  for (absl::string_view piece : absl::StrSplit(prompt, ' ', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id) || id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("--prompt: this model reads token ids in [0, ", vocab, "), got \"",
                       std::string(piece), "\""));
    }
    tokens.push_back(id);
  }
  if (tokens.empty()) tokens.push_back(0);
  return tokens;
}

}  // namespace

absl::StatusOr<GeneratedTokens> GenerateTokens(const LoadedModel& model,
                                               absl::Span<const int32_t> prompt,
                                               const SampleOptions& options, int vocab,
                                               absl::Span<const int32_t> stop_ids) {
  const engine::ModelArch& arch = *model.arch;
  const int context = arch.context_length();
  WEFT_RETURN_IF_ERROR(
      data::CheckSamplingParams(options.temperature, options.top_k, options.tokens, vocab));
  if (prompt.empty()) return absl::InvalidArgumentError("no prompt to continue");
  for (int32_t id : prompt) {
    if (id < 0 || id >= arch.vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token ", id, " is outside the model's vocabulary [0, ", arch.vocab_size(), ")"));
    }
  }
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  // Activations for the longest window this call runs, not the whole context: attention keeps
  // (NH, T, T) scores, which at a Llama-3 context (131,072) would not fit in any memory.
  const int max_t = static_cast<int>(
      std::min<int64_t>(context, static_cast<int64_t>(tokens.size()) + options.tokens));
  WEFT_ASSIGN_OR_RETURN(
      const std::unique_ptr<engine::cpu::CpuModel> cpu,
      engine::cpu::CreateCpuModel(arch, 1, max_t, engine::Checkpointing::kNone));
  uint64_t rng = options.seed;
  GeneratedTokens out;
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
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) {
      out.stop_id = next;
      break;
    }
    tokens.push_back(next);
    out.ids.push_back(next);
  }
  return out;
}

absl::StatusOr<std::string> GenerateText(const LoadedModel& model, const std::string& prompt,
                                         const SampleOptions& options) {
  const engine::ModelArch& arch = *model.arch;
  const data::Tokenizer* tokenizer = model.tokenizer.get();
  // Ids past the tokenizer's vocabulary (a padded model vocabulary) never occurred in training
  // and have no text: they are not drawn.
  const int vocab = tokenizer != nullptr ? tokenizer->vocab_size() : arch.vocab_size();
  WEFT_RETURN_IF_ERROR(
      data::CheckSamplingParams(options.temperature, options.top_k, options.tokens, vocab));
  WEFT_ASSIGN_OR_RETURN(std::vector<int32_t> tokens,
                        PromptTokens(tokenizer, prompt, arch.vocab_size()));
  // EOS ends the document.
  std::vector<int32_t> stop;
  if (tokenizer != nullptr && tokenizer->eos_id() >= 0) stop.push_back(tokenizer->eos_id());
  WEFT_ASSIGN_OR_RETURN(const GeneratedTokens sampled,
                        GenerateTokens(model, tokens, options, vocab, stop));
  const size_t prompt_length = tokens.size();
  tokens.insert(tokens.end(), sampled.ids.begin(), sampled.ids.end());
  const absl::Span<const int32_t> generated = absl::MakeConstSpan(tokens).subspan(prompt_length);
  if (tokenizer == nullptr) return absl::StrJoin(generated, " ");
  // Decoded with the prompt, then the prompt's text cut off: the continuation's first piece may
  // finish a character the prompt started, and SentencePiece drops the space that leads the
  // first piece of a text ("▁The" decodes to "The"), which would glue the continuation's
  // first word to the prompt if decoded alone.
  const absl::Span<const int32_t> all = absl::MakeConstSpan(tokens);
  const std::string prompt_text = tokenizer->Decode(all.first(prompt_length));
  std::string text = tokenizer->Decode(all);
  if (absl::StartsWith(text, prompt_text)) return text.substr(prompt_text.size());
  return tokenizer->Decode(generated);
}

namespace {

// ||a - b|| / ||b|| from the two sums of squares; infinite when b is all zeros.
double RelativeL2(double delta_squares, double base_squares) {
  return base_squares > 0 ? std::sqrt(delta_squares / base_squares)
                          : std::numeric_limits<double>::infinity();
}

}  // namespace

absl::StatusOr<ModelDifference> CompareModels(const LoadedModel& a, const LoadedModel& b) {
  if (a.arch->name() != b.arch->name()) {
    return absl::InvalidArgumentError(absl::StrCat("model.architecture: ", a.arch->name(),
                                                   " against ", b.arch->name()));
  }
  if (a.arch->NumUnits() != b.arch->NumUnits()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.num_layers: ", a.arch->num_layers(), " against ", b.arch->num_layers()));
  }
  ModelDifference diff;
  double all_delta_squares = 0, all_base_squares = 0;
  for (int u = 0; u < a.arch->NumUnits(); ++u) {
    const std::vector<engine::TensorInfo> tensors = a.arch->UnitTensors(u);
    const std::vector<engine::TensorInfo> other = b.arch->UnitTensors(u);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const engine::TensorInfo& t = tensors[i];
      if (i >= other.size() || other[i].name != t.name || other[i].shape != t.shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor ", t.name, " of shape [", absl::StrJoin(t.shape, ", "), "] against ",
            i >= other.size() ? "none"
                              : absl::StrCat(other[i].name, " of shape [",
                                             absl::StrJoin(other[i].shape, ", "), "]")));
      }
      const float* x = a.units[u].data() + t.offset;
      const float* y = b.units[u].data() + t.offset;
      TensorDifference d{t.name, t.size};
      double delta_squares = 0, base_squares = 0;
      for (size_t k = 0; k < t.size; ++k) {
        base_squares += static_cast<double>(y[k]) * y[k];
        uint32_t xb, yb;
        std::memcpy(&xb, &x[k], sizeof(xb));
        std::memcpy(&yb, &y[k], sizeof(yb));
        if (xb == yb) continue;
        ++d.differing;
        const double delta = static_cast<double>(x[k]) - y[k];
        d.max_abs = std::max(d.max_abs, std::abs(delta));
        delta_squares += delta * delta;
      }
      diff.elements += t.size;
      all_delta_squares += delta_squares;
      all_base_squares += base_squares;
      if (d.differing == 0) continue;
      d.relative = RelativeL2(delta_squares, base_squares);
      diff.differing += d.differing;
      diff.max_abs = std::max(diff.max_abs, d.max_abs);
      diff.max_relative = std::max(diff.max_relative, d.relative);
      diff.tensors.push_back(std::move(d));
    }
    if (tensors.size() != other.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("unit ", u, ": ", tensors.size(), " tensors against ", other.size()));
    }
  }
  if (diff.differing > 0) {
    diff.relative = RelativeL2(all_delta_squares, all_base_squares);
  }
  return diff;
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
  WEFT_ASSIGN_OR_RETURN(const std::unique_ptr<engine::cpu::CpuModel> cpu,
                        engine::cpu::CreateCpuModel(arch, 1, t, engine::Checkpointing::kNone));
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

}  // namespace weft::model_io
