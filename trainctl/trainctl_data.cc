#include "trainctl/trainctl_data.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "trainctl/data_batches.h"
#include "trainctl/data_inputs.h"
#include "trainctl/trainctl_output.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/bpe_trainer.h"
#include "worker/data/chat_template.h"
#include "worker/data/manifest.h"
#include "worker/data/tokenizer.h"

namespace weft {
namespace {

using trainctl::Fail;

void AddSharedInputOptions(CLI::App* command, std::vector<std::string>* inputs,
                           std::string* jsonl_field, std::string* doc_separator) {
  command
      ->add_option("INPUTS", *inputs,
                   "Text files, directories (recursively) or globs; *.jsonl files hold one "
                   "JSON object per line")
      ->required();
  command->add_option("--jsonl-field", *jsonl_field, "The field of a JSONL object that is the "
                                                     "document")
      ->capture_default_str();
  command->add_option("--doc-separator", *doc_separator,
                      "A line equal to this splits a text file into documents (\"%\" for "
                      "fortune files); without it a file is one document");
}

// Writes `bytes` to `path` through a temporary sibling renamed into place.
absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string temp = absl::StrCat(path, ".tmp-", ::getpid());
  FILE* f = std::fopen(temp.c_str(), "wb");
  if (f == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat("--out ", path, ": cannot create ", temp));
  }
  absl::Cleanup remove_temp = [&] { std::remove(temp.c_str()); };
  const bool written = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const bool flushed = std::fflush(f) == 0 && ::fdatasync(::fileno(f)) == 0;
  const int error = errno;
  std::fclose(f);
  if (!written || !flushed) {
    return absl::ErrnoToStatus(error, absl::StrCat(path, ": write failed"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": rename from ", temp, " failed"));
  }
  std::move(remove_temp).Cancel();
  return absl::OkStatus();
}

// The trainer names its options as BpeTrainOptions spells them; the user typed flags.
absl::Status AsTrainFlagError(const absl::Status& status) {
  static constexpr std::pair<absl::string_view, absl::string_view> kFlags[] = {
      {"vocab_size", "--vocab-size"}, {"style", "--style"},
      {"special_tokens", "--special"}, {"bos_token", "--bos"},
      {"eos_token", "--eos"},         {"min_frequency", "--min-frequency"},
      {"threads", "--threads"},       {"documents", "INPUTS"}};
  absl::string_view message = status.message();
  for (const auto& [field, flag] : kFlags) {
    if (!absl::StartsWith(message, field)) continue;
    message.remove_prefix(field.size());
    // special_tokens[i]: the flag's value says which one.
    if (absl::StartsWith(message, "[")) message.remove_prefix(message.find(']') + 1);
    return absl::Status(status.code(), absl::StrCat(flag, message));
  }
  return status;
}

}  // namespace

DataCommands::DataCommands(CLI::App* app) {
  CLI::App* group = app->add_subcommand("data", "Prepare text for training (local, no daemon)");
  group->require_subcommand(1);

  train_tokenizer_ = group->add_subcommand(
      "train-tokenizer",
      "Train a tokenizer on text: a SentencePiece model (BPE or unigram), or a byte-level BPE "
      "tokenizer.json (--kind tokenizer.json)");
  AddSharedInputOptions(train_tokenizer_, &inputs_, &jsonl_field_, &doc_separator_);
  train_tokenizer_->add_option("--kind", kind_,
                               "What to train: a SentencePiece model, or a Hugging Face "
                               "byte-level BPE tokenizer.json")
      ->check(CLI::IsMember({"sentencepiece", "tokenizer.json"}))
      ->capture_default_str();
  train_tokenizer_
      ->add_option("--out", out_,
                   "The model file to write (*.model); with --kind tokenizer.json the "
                   "directory to write tokenizer.json and tokenizer_config.json in")
      ->required();
  train_tokenizer_
      ->add_option("--vocab-size", vocab_size_,
                   "Pieces in the vocabulary (tokenizer.json: the 256 byte tokens, the merged "
                   "ones and the special tokens)")
      ->required();
  train_tokenizer_->add_option("--model-type", model_type_, "SentencePiece model type")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  train_tokenizer_->add_option("--character-coverage", character_coverage_,
                               "SentencePiece: fraction of characters kept whole; the rest are "
                               "spelled in byte pieces")
      ->check(CLI::Range(0.5, 1.0))
      ->capture_default_str();
  // Checked by the trainer, not CLI11, so that every bad value is refused in the same words.
  train_tokenizer_->add_option("--style", style_,
                               "tokenizer.json: the pre-tokenizer of a model family, gpt2, "
                               "llama3 or qwen2 (NFC, digits one by one)")
      ->capture_default_str();
  // One token per --special: a list that took every word after it would swallow INPUTS.
  train_tokenizer_
      ->add_option("--special", specials_,
                   "tokenizer.json: a special token (repeat the flag for more; default: the "
                   "style's, e.g. <|begin_of_text|> <|end_of_text|> ... for llama3)")
      ->allow_extra_args(false);
  train_tokenizer_->add_option("--bos", bos_,
                               "tokenizer.json: the special token tokenizer_config.json names "
                               "as bos_token (\"\" for none; default: the style's)");
  train_tokenizer_->add_option("--eos", eos_,
                               "tokenizer.json: the special token tokenizer_config.json names "
                               "as eos_token, which prepare puts between documents");
  train_tokenizer_->add_option("--min-frequency", min_frequency_,
                               "tokenizer.json: pairs seen fewer times are not merged")
      ->capture_default_str();
  train_tokenizer_->add_option("--threads", threads_,
                               "Training threads (SentencePiece: the model depends on it, "
                               "default 1; tokenizer.json: counting, default one per core, the "
                               "result does not depend on it)");

  prepare_ = group->add_subcommand(
      "prepare", "Tokenize text into a dataset directory: token shards and manifest.json");
  AddSharedInputOptions(prepare_, &inputs_, &jsonl_field_, &doc_separator_);
  prepare_->add_option("--out", out_, "The dataset directory to write")->required();
  CLI::Option* tokenizer =
      prepare_->add_option("--tokenizer", tokenizer_,
                           "SentencePiece model (*.model) or Hugging Face tokenizer.json (*.json)");
  CLI::Option* bytes = prepare_->add_flag("--bytes", bytes_, "Bytes as tokens (vocabulary 256)");
  tokenizer->excludes(bytes);
  prepare_->add_option("--val-fraction", val_fraction_,
                       "Fraction of documents held out for validation (by a hash of the seed "
                       "and the document's index)")
      ->capture_default_str();
  prepare_->add_option("--seed", seed_, "Seed of the validation split")->capture_default_str();
  prepare_->add_option("--shard-tokens", shard_tokens_,
                       "Tokens per shard file (default 67108864)");
  prepare_->add_option("--threads", threads_, "Encoding threads (default: one per core); the "
                                              "output does not depend on it");
  prepare_->add_flag("--force", force_,
                     "Replace an existing DIR that holds another Weft dataset (never an input, "
                     "a directory holding one, or anything but a dataset)");
  prepare_->add_flag("-q,--quiet", quiet_, "No progress on stderr");
  CLI::Option* chat = prepare_->add_flag(
      "--chat", chat_,
      "Conversations for supervised fine-tuning: JSONL lines of {\"messages\": [{\"role\": "
      "\"system\"|\"user\"|\"assistant\", \"content\": ...}, ...]} or {\"prompt\": ..., "
      "\"completion\": ...}, rendered by --template, one document each, with a token flags "
      "file (targets, conversation starts) beside every shard");
  CLI::Option* chat_template = prepare_->add_option(
      "--template", chat_template_,
      absl::StrCat("With --chat: the chat template (",
                   absl::StrJoin(data::ChatTemplate::Names(), ", "), ")"));
  CLI::Option* loss_mask =
      prepare_->add_option("--loss-mask", loss_mask_,
                           "With --chat: the tokens that are targets, the assistant's messages "
                           "(with their end-of-turn token) or all")
          ->capture_default_str();
  chat->needs(chat_template);
  chat_template->needs(chat);
  loss_mask->needs(chat);
  chat->excludes(bytes);
  chat->excludes(prepare_->get_option("--jsonl-field"));
  chat->excludes(prepare_->get_option("--doc-separator"));

  batches_ = group->add_subcommand(
      "batches",
      "Print as JSON the rows a job's ranks read for one training step or the validation pass "
      "(inputs, targets with -1 ignored, documents): the input of "
      "tests/fixtures/hf/masked_loss.py, to check the loss the job reports");
  batches_->add_option("SPEC", spec_path_, "The job spec (text format) the job was submitted with")
      ->required();
  batches_->add_option("--split", split_, "val: the validation pass; train: one training step")
      ->check(CLI::IsMember({"val", "train"}))
      ->capture_default_str();
  batches_->add_option("--step", step_,
                       "With --split train: the 0-based step (the job reports it as step + 1)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  batches_->add_option("--world", world_,
                       "The job's world size (default: resources.min_workers when it equals "
                       "max_workers)")
      ->check(CLI::PositiveNumber);
}

bool DataCommands::Parsed() const {
  return train_tokenizer_->parsed() || prepare_->parsed() || batches_->parsed();
}

int DataCommands::Run(bool json) const {
  if (train_tokenizer_->parsed()) return TrainTokenizer(json);
  if (prepare_->parsed()) return Prepare(json);
  if (batches_->parsed()) return Batches();
  return Fail(absl::InvalidArgumentError("data: no subcommand"));
}

int DataCommands::TrainTokenizer(bool json) const {
  const auto given = [&](const char* flag) {
    return train_tokenizer_->get_option(flag)->count() > 0;
  };
  if (kind_ == "tokenizer.json") {
    for (const char* flag : {"--model-type", "--character-coverage"}) {
      if (given(flag)) {
        return Fail(absl::InvalidArgumentError(
            absl::StrCat(flag, " is for --kind sentencepiece, not tokenizer.json")));
      }
    }
    return TrainBpe(json);
  }
  for (const char* flag : {"--style", "--special", "--bos", "--eos", "--min-frequency"}) {
    if (given(flag)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          flag, " is for --kind tokenizer.json (the SentencePiece model is the default kind)")));
    }
  }
  const absl::Time start = absl::Now();
  data::SentencePieceTrainOptions options;
  options.model_type = model_type_ == "unigram"
                           ? data::SentencePieceTrainOptions::ModelType::kUnigram
                           : data::SentencePieceTrainOptions::ModelType::kBpe;
  options.vocab_size = vocab_size_;
  options.character_coverage = character_coverage_;
  if (threads_ > 0) options.num_threads = threads_;
  absl::StatusOr<TrainingText> text = ReadTrainingText();
  if (!text.ok()) return Fail(text.status());
  const int64_t bytes = text->bytes;
  const size_t count = text->documents.size();
  options.documents = std::move(text->documents);
  absl::StatusOr<std::string> model = data::TrainSentencePiece(options);
  if (!model.ok()) return Fail(model.status());
  if (absl::Status s = WriteFileAtomically(out_, *model); !s.ok()) return Fail(s);
  auto tokenizer = data::LoadSentencePieceFromBytes(*model, out_);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string crc = data::FormatCrc32c((*tokenizer)->fingerprint());
  if (json) {
    trainctl::PrintJsonObject({{"out", out_},
                               {"model_type", model_type_},
                               {"vocab_size", (*tokenizer)->vocab_size()},
                               {"crc32c", crc},
                               {"documents", count},
                               {"bytes", bytes},
                               {"seconds", seconds}});
  } else {
    std::cout << absl::StrFormat(
        "wrote %s: SentencePiece %s, %d pieces (unk 0, bos 1, eos 2), crc32c %s; trained on %d "
        "documents (%.1f MB) in %.1f s\n",
        out_, model_type_, (*tokenizer)->vocab_size(), crc, count, bytes / 1e6, seconds);
  }
  return 0;
}

absl::StatusOr<DataCommands::TrainingText> DataCommands::ReadTrainingText() const {
  absl::StatusOr<std::vector<dataprep::SourceFile>> files = dataprep::ExpandInputs(inputs_);
  if (!files.ok()) return files.status();
  absl::StatusOr<std::vector<std::string>> documents =
      dataprep::ReadAllDocuments(*files, jsonl_field_, doc_separator_);
  if (!documents.ok()) return documents.status();
  TrainingText text;
  for (const std::string& d : *documents) text.bytes += static_cast<int64_t>(d.size());
  text.documents = std::move(*documents);
  return text;
}

int DataCommands::TrainBpe(bool json) const {
  const absl::Time start = absl::Now();
  const auto given = [&](const char* flag) {
    return train_tokenizer_->get_option(flag)->count() > 0;
  };
  data::BpeTrainOptions options;
  options.vocab_size = vocab_size_;
  options.style = style_;
  if (given("--special")) options.special_tokens = specials_;
  if (given("--bos")) options.bos_token = bos_;
  if (given("--eos")) options.eos_token = eos_;
  options.min_frequency = min_frequency_;
  options.threads = threads_;
  // Bad flags are refused before a large text is read.
  if (absl::Status s = data::CheckBpeTrainOptions(options); !s.ok()) {
    return Fail(AsTrainFlagError(s));
  }
  std::error_code error;
  if (std::filesystem::exists(out_, error) && !std::filesystem::is_directory(out_, error)) {
    return Fail(absl::InvalidArgumentError(absl::StrCat(
        "--out ", out_, ": not a directory (--kind tokenizer.json writes tokenizer.json and "
        "tokenizer_config.json into a directory)")));
  }
  absl::StatusOr<TrainingText> text = ReadTrainingText();
  if (!text.ok()) return Fail(text.status());
  const int64_t bytes = text->bytes;
  const size_t count = text->documents.size();
  options.documents = std::move(text->documents);
  absl::StatusOr<data::BpeTrainResult> trained = data::TrainBpeTokenizer(options);
  if (!trained.ok()) return Fail(AsTrainFlagError(trained.status()));
  options.documents = {};
  std::filesystem::create_directories(out_, error);
  if (error) {
    return Fail(absl::ErrnoToStatus(error.value(), absl::StrCat("--out ", out_, ": cannot "
                                                                "create the directory")));
  }
  const std::string tokenizer_path = (std::filesystem::path(out_) / "tokenizer.json").string();
  const std::string config_path =
      (std::filesystem::path(out_) / "tokenizer_config.json").string();
  // The config first: a tokenizer.json beside a stale config would get the wrong BOS and EOS.
  if (absl::Status s = WriteFileAtomically(config_path, trained->tokenizer_config_json);
      !s.ok()) {
    return Fail(s);
  }
  if (absl::Status s = WriteFileAtomically(tokenizer_path, trained->tokenizer_json); !s.ok()) {
    return Fail(s);
  }
  // Read back as prepare will read it: the file and its config agree with what was trained.
  auto tokenizer = data::LoadBpeTokenizerFile(tokenizer_path);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::string crc = data::FormatCrc32c((*tokenizer)->fingerprint());
  const int special_count = options.special_tokens.has_value()
                                ? static_cast<int>(options.special_tokens->size())
                                : static_cast<int>(data::BpeStyleSpecialTokens(style_).size());
  if (json) {
    trainctl::PrintJsonObject({{"out", out_},
                               {"kind", "tokenizer.json"},
                               {"style", style_},
                               {"vocab_size", (*tokenizer)->vocab_size()},
                               {"merges", trained->merges},
                               {"special_tokens", special_count},
                               {"bos_id", (*tokenizer)->bos_id()},
                               {"eos_id", (*tokenizer)->eos_id()},
                               {"crc32c", crc},
                               {"documents", count},
                               {"bytes", bytes},
                               {"words", trained->words},
                               {"count_seconds", trained->count_seconds},
                               {"merge_seconds", trained->merge_seconds},
                               {"seconds", seconds}});
  } else {
    std::cout << absl::StrFormat(
        "wrote %s and tokenizer_config.json: byte-level BPE, %s style, %d tokens (256 bytes, "
        "%d merges, %d special; bos %s, eos %s), crc32c %s; trained on %d documents (%.1f MB, "
        "%d distinct pre-tokens) in %.1f s\n",
        tokenizer_path, style_, (*tokenizer)->vocab_size(), trained->merges, special_count,
        (*tokenizer)->bos_id() < 0 ? "none" : absl::StrCat((*tokenizer)->bos_id()),
        (*tokenizer)->eos_id() < 0 ? "none" : absl::StrCat((*tokenizer)->eos_id()), crc, count,
        bytes / 1e6, trained->words, seconds);
    if ((*tokenizer)->vocab_size() < vocab_size_) {
      std::cout << absl::StrFormat(
          "the text ran out of pairs seen --min-frequency (%d) times: %d tokens of the %d "
          "asked for\n",
          min_frequency_, (*tokenizer)->vocab_size(), vocab_size_);
    }
  }
  return 0;
}

int DataCommands::Prepare(bool json) const {
  if (tokenizer_.empty() && !bytes_) {
    return Fail(absl::InvalidArgumentError(
        "data prepare: pass --tokenizer FILE (a SentencePiece model) or --bytes"));
  }
  dataprep::PrepareOptions options;
  options.inputs = inputs_;
  options.out_dir = out_;
  options.tokenizer_path = tokenizer_;
  options.jsonl_field = jsonl_field_;
  options.doc_separator = doc_separator_;
  options.val_fraction = val_fraction_;
  options.seed = seed_;
  if (shard_tokens_ != 0) options.shard_tokens = shard_tokens_;
  options.threads = threads_;
  options.force = force_;
  if (chat_) {
    options.chat_template = chat_template_;
    options.loss_mask = loss_mask_;
  }
  options.progress = quiet_                         ? dataprep::Progress::kNone
                     : ::isatty(STDERR_FILENO) == 1 ? dataprep::Progress::kBar
                                                    : dataprep::Progress::kLines;
  absl::StatusOr<dataprep::PrepareResult> result = dataprep::PrepareDataset(options);
  if (!result.ok()) return Fail(result.status());
  const dataprep::PrepareResult& r = *result;
  if (json) {
    nlohmann::json out = {{"out", out_},
                          {"up_to_date", r.up_to_date},
                          {"input_bytes", r.input_bytes},
                          {"train_tokens", r.train_tokens},
                          {"val_tokens", r.val_tokens},
                          {"train_documents", r.train_documents},
                          {"val_documents", r.val_documents},
                          {"train_shards", r.train_shards},
                          {"val_shards", r.val_shards},
                          {"seconds", r.seconds}};
    if (chat_) {
      out["train_target_tokens"] = r.train_target_tokens;
      out["val_target_tokens"] = r.val_target_tokens;
    }
    trainctl::PrintJsonObject(out);
  } else if (r.up_to_date) {
    std::cout << out_ << " is up to date (same inputs and options)\n";
  } else {
    std::cout << absl::StrFormat(
        "wrote %s: train %d tokens in %d shards (%d documents), validation %d tokens in %d "
        "shards (%d documents); %.1f MB in %.1f s (%.1f MB/s)\n",
        out_, r.train_tokens, r.train_shards, r.train_documents, r.val_tokens, r.val_shards,
        r.val_documents, r.input_bytes / 1e6, r.seconds,
        r.input_bytes / 1e6 / std::max(r.seconds, 1e-6));
    if (chat_) {
      std::cout << absl::StrFormat(
          "chat template %s, loss mask %s: %d train and %d validation tokens are targets\n",
          chat_template_, loss_mask_, r.train_target_tokens, r.val_target_tokens);
    }
  }
  return 0;
}

int DataCommands::Batches() const {
  absl::StatusOr<weft::v1::JobSpec> spec = ReadJobSpecFile(spec_path_);
  if (!spec.ok()) return Fail(spec.status());
  // What the coordinator hands the workers: the defaults filled in (sequence_length,
  // val_batches, ...), which decide the batches.
  spec = NormalizeJobSpec(*std::move(spec));
  if (!spec.ok()) return Fail(spec.status());
  int world = world_;
  if (world == 0) {
    const weft::v1::ResourceSpec& resources = spec->resources();
    if (resources.min_workers() != resources.max_workers()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
          "data batches: ", spec_path_, " lets the job run on ", resources.min_workers(), " to ",
          resources.max_workers(), " workers: pass --world (the rows depend on it)")));
    }
    world = resources.min_workers();
  }
  absl::StatusOr<dataprep::JobBatches> batches = dataprep::ReadJobBatches(
      *spec, split_ == "train" ? data::Split::kTrain : data::Split::kVal, step_, world);
  if (!batches.ok()) return Fail(batches.status());
  std::cout << dataprep::MaskedLossBatchJson(*batches).dump() << "\n";
  return 0;
}

}  // namespace weft
