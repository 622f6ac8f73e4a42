#include "trainctl/trainctl_data.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "trainctl/data_batches.h"
#include "trainctl/data_inputs.h"
#include "trainctl/trainctl_output.h"
#include "nlohmann/json.hpp"
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

}  // namespace

DataCommands::DataCommands(CLI::App* app) {
  CLI::App* group = app->add_subcommand("data", "Prepare text for training (local, no daemon)");
  group->require_subcommand(1);

  train_tokenizer_ = group->add_subcommand(
      "train-tokenizer", "Train a SentencePiece tokenizer (BPE or unigram) on text");
  AddSharedInputOptions(train_tokenizer_, &inputs_, &jsonl_field_, &doc_separator_);
  train_tokenizer_->add_option("--out", out_, "The model file to write (*.model)")->required();
  train_tokenizer_->add_option("--vocab-size", vocab_size_, "Pieces in the vocabulary")
      ->required();
  train_tokenizer_->add_option("--model-type", model_type_, "SentencePiece model type")
      ->check(CLI::IsMember({"bpe", "unigram"}))
      ->capture_default_str();
  train_tokenizer_->add_option("--character-coverage", character_coverage_,
                               "Fraction of characters kept whole; the rest are spelled in "
                               "byte pieces")
      ->check(CLI::Range(0.5, 1.0))
      ->capture_default_str();
  train_tokenizer_->add_option("--threads", threads_,
                               "Training threads (the model depends on it; default 1)");

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
  const absl::Time start = absl::Now();
  absl::StatusOr<std::vector<dataprep::SourceFile>> files = dataprep::ExpandInputs(inputs_);
  if (!files.ok()) return Fail(files.status());
  data::SentencePieceTrainOptions options;
  options.model_type = model_type_ == "unigram"
                           ? data::SentencePieceTrainOptions::ModelType::kUnigram
                           : data::SentencePieceTrainOptions::ModelType::kBpe;
  options.vocab_size = vocab_size_;
  options.character_coverage = character_coverage_;
  if (threads_ > 0) options.num_threads = threads_;
  absl::StatusOr<std::vector<std::string>> documents =
      dataprep::ReadAllDocuments(*files, jsonl_field_, doc_separator_);
  if (!documents.ok()) return Fail(documents.status());
  int64_t bytes = 0;
  for (const std::string& d : *documents) bytes += static_cast<int64_t>(d.size());
  const size_t count = documents->size();
  options.documents = std::move(*documents);
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
