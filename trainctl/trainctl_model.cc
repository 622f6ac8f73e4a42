#include "trainctl/trainctl_model.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "trainctl/trainctl_output.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "google/protobuf/text_format.h"
#include "nlohmann/json.hpp"
#include "worker/hf/hf_checkpoint.h"
#include "worker/hf/hf_config.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using trainctl::Fail;

int FromHf(const std::string& dir, bool json) {
  const std::string path = (std::filesystem::path(dir) / hf::kHfConfigFile).string();
  std::ifstream in(path);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat(path, ": cannot read")));
  std::ostringstream text;
  text << in.rdbuf();
  auto spec = hf::ModelSpecFromHfConfig(text.str(), path);
  if (!spec.ok()) return Fail(spec.status());
  // The ModelSpec itself: what a job spec's `model` takes (init_from_hf_dir is the directory).
  if (json) return trainctl::PrintJsonExit(*spec);
  std::string out;
  google::protobuf::TextFormat::PrintToString(*spec, &out);
  std::cout << "# The model of " << dir << " (context_length is the longest the weights allow; "
            << "a Llama job may take less). Paste into a job spec:\n"
            << "model {\n";
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) std::cout << "  " << line << "\n";
  std::cout << "}\ninit_from_hf_dir: \"" << std::filesystem::absolute(dir).string() << "\"\n";
  return 0;
}

}  // namespace

void HfExportFlags::AddTo(CLI::App* command) {
  command->add_option("--dtype", dtype, "Hugging Face weights as bf16 or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}))
      ->capture_default_str();
  command->add_option("--max-shard-bytes", max_shard_bytes,
                      "Split the weights into files of at most this many bytes (with an index)")
      ->capture_default_str();
}

absl::StatusOr<hf::HfExportOptions> HfExportFlags::Options() const {
  hf::HfExportOptions options;
  if (dtype == "bf16") {
    options.dtype = model_io::Dtype::kBF16;
  } else if (dtype == "fp32") {
    options.dtype = model_io::Dtype::kF32;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype \"", dtype, "\": use bf16 or fp32"));
  }
  if (max_shard_bytes == 0) {
    return absl::InvalidArgumentError("--max-shard-bytes: must be > 0");
  }
  options.max_shard_bytes = max_shard_bytes;
  return options;
}

int ExportHfDirectory(const weft::v1::JobSpec& job_spec,
                      const std::vector<std::vector<float>>& units,
                      std::shared_ptr<const data::Tokenizer> tokenizer, const std::string& out_dir,
                      const HfExportFlags& flags, bool json, const std::string& source) {
  absl::StatusOr<hf::HfExportOptions> options = flags.Options();
  if (!options.ok()) return Fail(options.status());
  options->tokenizer = tokenizer;
  weft::v1::JobSpec spec = job_spec;
  ApplyJobSpecDefaults(&spec);
  if (absl::Status s = hf::ExportHf(out_dir, spec.model(), units, *options); !s.ok()) {
    return Fail(s);
  }
  const std::string kind = tokenizer == nullptr ? "none" : std::string(tokenizer->kind());
  if (tokenizer == nullptr) {
    std::cerr << "trainctl: warning: " << source << " records no tokenizer: " << out_dir
              << " has no tokenizer files, so transformers cannot make text with it (token "
                 "ids only)\n";
  }
  if (json) {
    trainctl::PrintJsonObject({{"source", source}, {"path", out_dir}, {"format", "hf"},
                               {"dtype", flags.dtype}, {"tokenizer", kind}});
  } else {
    std::cout << "exported " << source << " to " << out_dir << " (Hugging Face, " << flags.dtype
              << ", tokenizer: " << kind << ")\n";
  }
  return 0;
}

int ExportHfDirectory(const weft::v1::JobSpec& job_spec,
                      const std::vector<std::vector<float>>& units, const std::string& out_dir,
                      const HfExportFlags& flags, bool json, const std::string& source) {
  absl::StatusOr<std::shared_ptr<const data::Tokenizer>> tokenizer =
      model_io::LoadJobTokenizer(job_spec);
  if (!tokenizer.ok()) {
    std::cerr << "trainctl: warning: the tokenizer of " << source
              << " cannot be read here: " << tokenizer.status().message() << "\n";
  }
  return ExportHfDirectory(job_spec, units, tokenizer.ok() ? *tokenizer : nullptr, out_dir,
                           flags, json, source);
}

namespace {

// {"inputs": [[ids]], "logits": [[[row] per position]]}: the format check_export.py reads.
int PrintLogits(const model_io::LoadedModel& model, const std::string& tokens_flag) {
  std::vector<int32_t> tokens;
  for (absl::string_view piece : absl::StrSplit(tokens_flag, ' ', absl::SkipWhitespace())) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(piece, &id)) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat("--tokens: \"", std::string(piece), "\" is not a token id")));
    }
    tokens.push_back(id);
  }
  absl::StatusOr<std::vector<float>> logits = model_io::ModelLogits(model, tokens);
  if (!logits.ok()) return Fail(logits.status());
  const size_t v = model.arch->vocab_size();
  nlohmann::json rows = nlohmann::json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    rows.push_back(std::vector<float>(logits->begin() + i * v, logits->begin() + (i + 1) * v));
  }
  std::cout << nlohmann::json{{"inputs", {tokens}}, {"logits", {rows}}}.dump() << "\n";
  return 0;
}

// `trainctl model diff`: the tensors that differ, and whether the model's relative difference
// is within `tolerance` (0: bit-identical), which decides the exit status.
int PrintDifference(const model_io::ModelDifference& diff, double tolerance, bool json,
                    const std::string& a, const std::string& b) {
  const bool within = tolerance == 0 ? diff.identical() : diff.relative <= tolerance;
  if (json) {
    nlohmann::json tensors = nlohmann::json::array();
    for (const model_io::TensorDifference& t : diff.tensors) {
      tensors.push_back({{"name", t.name}, {"elements", t.elements}, {"differing", t.differing},
                         {"max_abs", t.max_abs}, {"relative", t.relative}});
    }
    trainctl::PrintJsonObject({{"identical", diff.identical()},
                               {"within_tolerance", within},
                               {"tolerance", tolerance},
                               {"elements", diff.elements},
                               {"differing", diff.differing},
                               {"max_abs", diff.max_abs},
                               {"relative", diff.relative},
                               {"max_relative", diff.max_relative},
                               {"tensors", tensors}});
  } else if (diff.identical()) {
    std::cout << "identical: " << diff.elements << " parameters, bit for bit\n";
  } else {
    std::vector<std::vector<std::string>> rows = {
        {"TENSOR", "ELEMENTS", "DIFFERING", "MAX ABS", "RELATIVE"}};
    for (const model_io::TensorDifference& t : diff.tensors) {
      rows.push_back({t.name, absl::StrCat(t.elements), absl::StrCat(t.differing),
                      absl::StrFormat("%.3g", t.max_abs), absl::StrFormat("%.3g", t.relative)});
    }
    trainctl::PrintTable(rows);
    std::cout << absl::StrFormat(
        "%d of %d parameters differ; relative difference %.3g (largest of a tensor %.3g; "
        "tolerance %g)\n",
        diff.differing, diff.elements, diff.relative, diff.max_relative, tolerance);
  }
  if (within) return 0;
  return Fail(absl::FailedPreconditionError(absl::StrFormat(
      "%s and %s differ beyond --tolerance %g (relative difference %.3g)", a, b, tolerance,
      diff.relative)));
}

}  // namespace

ModelCommands::ModelCommands(CLI::App* app) {
  group_ = app->add_subcommand("model", "Hugging Face models: derive a spec, export a model");
  group_->require_subcommand(1);
  from_hf_ = group_->add_subcommand(
      "from-hf", "Print the ModelSpec of a Hugging Face model directory (its config.json)");
  from_hf_->add_option("DIR", dir_, "Hugging Face model directory")->required();
  export_ = group_->add_subcommand(
      "export", "Write a trained model (a job's, or a model.safetensors) for Hugging Face, "
                "with its tokenizer, for transformers' text-generation pipeline");
  export_->add_option("SOURCE", source_, "A Weft model file (*.safetensors) or a finished job")
      ->required();
  export_->add_option("--out", out_dir_, "Output directory (must not exist, or be empty)")
      ->required();
  export_->add_option("--format", format_, "Output format")
      ->check(CLI::IsMember({"hf"}))
      ->capture_default_str();
  flags_.AddTo(export_);
  logits_ = group_->add_subcommand(
      "logits", "Print a model's logits for a token sequence as JSON (to compare with another "
                "implementation, e.g. transformers)");
  logits_->add_option("SOURCE", source_, "A Weft model file (*.safetensors) or a finished job")
      ->required();
  logits_->add_option("--tokens", tokens_, "Whitespace-separated token ids")->required();
  diff_ = group_->add_subcommand(
      "diff", "Compare two trained models tensor by tensor (a resumed run against an "
              "uninterrupted one); exits 1 when they differ beyond --tolerance");
  diff_->add_option("SOURCE", source_, "A Weft model file (*.safetensors) or a finished job")
      ->required();
  diff_->add_option("OTHER", other_, "The model to compare with (file or job)")->required();
  diff_->add_option("--tolerance", tolerance_,
                    "Largest relative L2 difference of the model accepted (0: bit-identical)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

bool ModelCommands::Parsed() const { return group_->parsed(); }

int ModelCommands::Run(bool json, const JobModelPath& job_model_path) const {
  if (from_hf_->parsed()) return FromHf(dir_, json);
  // A readable file is a model file; anything else names a job.
  const auto resolve = [&](const std::string& source) -> absl::StatusOr<std::string> {
    if (absl::EndsWith(source, ".safetensors") || ::access(source.c_str(), R_OK) == 0) {
      return source;
    }
    return job_model_path(source);
  };
  const auto load = [&](const std::string& source) -> absl::StatusOr<model_io::LoadedModel> {
    WEFT_ASSIGN_OR_RETURN(const std::string path, resolve(source));
    return model_io::LoadModel(path);
  };
  absl::StatusOr<std::string> path = resolve(source_);
  if (!path.ok()) return Fail(path.status());
  auto model = model_io::LoadModel(*path);
  if (!model.ok()) return Fail(model.status());
  if (logits_->parsed()) return PrintLogits(*model, tokens_);
  if (diff_->parsed()) {
    auto other = load(other_);
    if (!other.ok()) return Fail(other.status());
    auto diff = model_io::CompareModels(*model, *other);
    if (!diff.ok()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          source_, " and ", other_, " are not the same model: ", diff.status().message())));
    }
    return PrintDifference(*diff, tolerance_, json, source_, other_);
  }
  return ExportHfDirectory(model->spec, model->units, model->tokenizer, out_dir_, flags_, json,
                           *path);
}

}  // namespace weft
