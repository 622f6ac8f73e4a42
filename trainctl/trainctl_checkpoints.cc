#include "trainctl/trainctl_checkpoints.h"

#include <algorithm>
#include <iostream>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/checkpoint_client.h"
#include "trainctl/trainctl_output.h"
#include "common/rpc.h"
#include "common/time_util.h"
#include "nlohmann/json.hpp"
#include "worker/model_io/checkpoint_schema.h"
#include "worker/engine/model_arch.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using weft::v1::CheckpointManifest;

using trainctl::Fail;

absl::StatusOr<int64_t> ParseStep(const std::string& text) {
  int64_t step = 0;
  if (!absl::SimpleAtoi(text, &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("STEP \"", text, "\": not a number (a checkpoint's step, see "
                                      "`trainctl checkpoints JOB`)"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("STEP ", step, ": must be >= 0"));
  }
  return step;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30)) return absl::StrFormat("%.2f GiB", bytes / 1073741824.0);
  if (bytes >= (1 << 20)) return absl::StrFormat("%.1f MiB", bytes / 1048576.0);
  if (bytes >= (1 << 10)) return absl::StrFormat("%.1f KiB", bytes / 1024.0);
  return absl::StrCat(bytes, " B");
}

int ListCheckpoints(CheckpointClient& client, bool json, const std::string& job_id,
                    const CheckpointCommands::JobLookup& job_exists) {
  auto manifests = client.List(job_id);
  if (!manifests.ok()) return Fail(manifests.status());
  if (manifests->empty()) {
    // checkpointd keeps no list of jobs: "none" is all it can say of a mistyped id.
    const absl::Status known = job_exists(job_id);
    if (absl::IsNotFound(known)) {
      return Fail(absl::NotFoundError(
          absl::StrCat("job ", job_id, ": no such job (the coordinator does not know it) and "
                       "checkpointd has no checkpoints of it; see `trainctl list`")));
    }
    if (!known.ok()) {
      std::cerr << "trainctl: warning: cannot check that job " << job_id
                << " exists: " << known.message() << "\n";
    }
  }
  if (json) {
    return trainctl::PrintListJson(std::move(*manifests),
                                   &weft::v1::ListCheckpointsResponse::mutable_checkpoints);
  }
  if (manifests->empty()) {
    std::cout << "job " << job_id << " has no committed checkpoints\n";
    return 0;
  }
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "WORLD SIZE", "BYTES", "COMMITTED", "PINNED"}};
  for (const CheckpointManifest& m : *manifests) {
    rows.push_back({absl::StrCat(m.step()), absl::StrCat(m.world_size()),
                    FormatBytes(m.total_bytes()),
                    absl::FormatTime("%Y-%m-%d %H:%M:%S", FromProtoTime(m.commit_time()),
                                     absl::LocalTimeZone()),
                    m.pinned() ? "yes" : "no"});
  }
  trainctl::PrintTable(rows);
  return 0;
}

// Reads all of `tensor` (f32, `numel` elements) in pieces, so that no single stream needs
// longer than the per-call deadline however big the unit is.
absl::StatusOr<std::vector<float>> ReadWhole(CheckpointClient& client, const std::string& job_id,
                                             int64_t step, const std::string& tensor,
                                             int64_t numel) {
  constexpr int64_t kPieceElements = int64_t{16} << 20;  // 64 MiB of f32
  std::vector<float> out(static_cast<size_t>(numel));
  for (int64_t b = 0; b < numel; b += kPieceElements) {
    const int64_t e = std::min(numel, b + kPieceElements);
    if (absl::Status s = client.ReadRange(job_id, step, tensor, b, e, out.data() + b); !s.ok()) {
      return s;
    }
  }
  return out;
}

// The worker stores unit u's flat f32 parameters as tensor "u<u>.params" (with optimizer
// state in "u<u>.m" and "u<u>.v", which a portable model file leaves out).
// `hf` (null for Weft's own file): write a Hugging Face directory with these flags instead.
int Export(CheckpointClient& client, bool json, const std::string& job_id, int64_t step,
           const std::string& out_path, const HfExportFlags* hf) {
  auto manifest = client.GetManifest(job_id, step);
  if (!manifest.ok()) return Fail(manifest.status());
  const int64_t at = manifest->step();
  std::vector<std::string> names;
  for (const auto& t : manifest->tensors()) names.push_back(t.name());
  auto find = [&](const std::string& name) -> const weft::v1::TensorLayout* {
    for (const auto& t : manifest->tensors()) {
      if (t.name() == name) return &t;
    }
    return nullptr;
  };
  const std::string head = model_io::CheckpointTensorName(0, model_io::UnitState::kParams);
  if (find(head) == nullptr) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", job_id, " step ", at,
        " holds no GPT model parameters (no tensor ", head, "; it has: ",
        names.empty() ? std::string("no tensors") : absl::StrJoin(names, ", "),
        "); export understands checkpoints written by weft-worker only")));
  }
  const weft::v1::ModelSpec& model = manifest->spec().model();
  if (model.num_layers() < 1 || model.hidden_size() < 1 || model.vocab_size() < 1) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", job_id, " step ", at,
        " has no model spec in its manifest; cannot name the model's tensors")));
  }
  auto arch = engine::MakeModelArch(model);
  if (!arch.ok()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", job_id, " step ", at, ": ", arch.status().message())));
  }
  const int units = (*arch)->NumUnits();
  std::vector<std::vector<float>> params;
  params.reserve(units);
  for (int u = 0; u < units; ++u) {
    const std::string name = model_io::CheckpointTensorName(u, model_io::UnitState::kParams);
    const weft::v1::TensorLayout* layout = find(name);
    const int64_t want = static_cast<int64_t>((*arch)->UnitSize(u));
    if (layout == nullptr) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", job_id, " step ", at, " lacks tensor ", name, " (the model has ",
                       units, " units)")));
    }
    std::vector<int64_t> shape(layout->shape().begin(), layout->shape().end());
    if (layout->dtype() != weft::v1::DTYPE_F32 || NumElements(shape) != want) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", job_id, " step ", at, ": tensor ", name, " is ",
          weft::v1::DType_Name(layout->dtype()), " of ", NumElements(shape),
          " elements; the model spec needs DTYPE_F32 of ", want)));
    }
    auto data = ReadWhole(client, job_id, at, name, want);
    if (!data.ok()) return Fail(data.status());
    params.push_back(std::move(*data));
  }
  if (hf != nullptr) {
    return ExportHfDirectory(manifest->spec(), params, out_path, *hf, json,
                             absl::StrCat(job_id, " step ", at));
  }
  // The job's tokenizer, as its workers would record it, if its files are readable here; a
  // model without one still samples, in token ids.
  auto tokenizer = model_io::LoadJobTokenizer(manifest->spec());
  if (!tokenizer.ok()) {
    std::cerr << "trainctl: warning: no tokenizer recorded in " << out_path << ": "
              << tokenizer.status().message() << "\n";
  }
  const data::Tokenizer* recorded = tokenizer.ok() ? tokenizer->get() : nullptr;
  // The chat template too, so that `sample --chat` needs no --template for the export either.
  auto chat_template = model_io::LoadJobChatTemplate(manifest->spec());
  if (!chat_template.ok() && tokenizer.ok()) {
    std::cerr << "trainctl: warning: no chat template recorded in " << out_path << ": "
              << chat_template.status().message() << "\n";
  }
  if (absl::Status s = model_io::SaveModel(out_path, manifest->spec(), params, recorded,
                                           chat_template.value_or(""));
      !s.ok()) {
    return Fail(s);
  }
  if (json) {
    trainctl::PrintJsonObject(
        {{"job_id", job_id}, {"step", at}, {"path", out_path}, {"format", "weft"}, {"units", units}});
  } else {
    std::cout << "exported " << job_id << " step " << at << " (" << units << " units) to "
              << out_path << "\n";
  }
  return 0;
}

}  // namespace

CheckpointCommands::CheckpointCommands(CLI::App* app) {
  list_ = app->add_subcommand("checkpoints", "List a job's committed checkpoints, newest first");
  list_->add_option("JOB", job_id_, "Job id")->required();

  group_ = app->add_subcommand("checkpoint", "Pin, unpin, delete or export one checkpoint");
  group_->require_subcommand(1);
  auto add = [&](const char* name, const char* help) {
    CLI::App* sub = group_->add_subcommand(name, help);
    sub->add_option("JOB", job_id_, "Job id")->required();
    sub->add_option("STEP", step_, "Checkpoint step (see `trainctl checkpoints JOB`)")
        ->required();
    return sub;
  };
  pin_ = add("pin", "Exempt a checkpoint from keep-last retention");
  unpin_ = add("unpin", "Make a pinned checkpoint subject to retention again");
  delete_ = add("delete", "Delete a committed checkpoint (unpin it first)");
  export_ = add("export",
                "Write a checkpoint's model as a file or a Hugging Face directory (0 as STEP: "
                "the latest)");
  export_->add_option("--out", out_path_,
                      "Output file (*.safetensors), or directory with --format hf")
      ->required();
  export_->add_option("--format", format_,
                      "weft: Weft's model file; hf: a Hugging Face directory (config.json, "
                      "safetensors) that transformers loads")
      ->check(CLI::IsMember({"weft", "hf"}))
      ->capture_default_str();
  hf_flags_.AddTo(export_);
}

bool CheckpointCommands::Parsed() const { return list_->parsed() || group_->parsed(); }

int CheckpointCommands::Run(const std::string& checkpointd, bool json,
                            absl::Duration rpc_timeout, const JobLookup& job_exists) const {
  if (absl::Status ok = CheckHostPort(checkpointd, "--checkpointd"); !ok.ok()) return Fail(ok);
  CheckpointClient client(checkpointd, rpc_timeout);
  if (list_->parsed()) return ListCheckpoints(client, json, job_id_, job_exists);
  absl::StatusOr<int64_t> step = ParseStep(step_);
  if (!step.ok()) return Fail(step.status());
  if (export_->parsed()) {
    return Export(client, json, job_id_, *step, out_path_, format_ == "hf" ? &hf_flags_ : nullptr);
  }
  if (pin_->parsed() || unpin_->parsed()) {
    const bool pinned = pin_->parsed();
    if (absl::Status s = client.SetPinned(job_id_, *step, pinned); !s.ok()) return Fail(s);
    if (json) {
      trainctl::PrintJsonObject({{"job_id", job_id_}, {"step", *step}, {"pinned", pinned}});
    } else {
      std::cout << (pinned ? "pinned " : "unpinned ") << job_id_ << " step " << *step << "\n";
    }
    return 0;
  }
  if (delete_->parsed()) {
    if (absl::Status s = client.Delete(job_id_, *step); !s.ok()) return Fail(s);
    if (json) {
      trainctl::PrintJsonObject({{"job_id", job_id_}, {"step", *step}, {"deleted", true}});
    } else {
      std::cout << "deleted " << job_id_ << " step " << *step << "\n";
    }
    return 0;
  }
  return Fail(absl::InvalidArgumentError("checkpoint: no subcommand"));
}

}  // namespace weft
