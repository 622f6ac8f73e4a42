// trainctl's model subcommands, which work on local files (and, for a job's model, ask the
// coordinator where it is):
//   trainctl model from-hf DIR        the ModelSpec of a Hugging Face directory, as text format
//   trainctl model export MODEL.safetensors|JOB --out DIR [--dtype bf16|fp32]
//                         [--max-shard-bytes N]   a Weft model file as a Hugging Face directory,
//                         with its tokenizer's files (worker/hf/hf_tokenizer.h)
//   trainctl model logits MODEL.safetensors|JOB --tokens "1 2 3"   the model's logits, as JSON
//   trainctl model diff MODEL|JOB MODEL|JOB [--tolerance R]   the tensors that differ; exit 1
//                         beyond the tolerance (0: bit-identical)
// and the Hugging Face export flags `trainctl checkpoint export --format hf` shares.
#ifndef WEFT_TRAINCTL_TRAINCTL_MODEL_H_
#define WEFT_TRAINCTL_TRAINCTL_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"
#include "worker/data/tokenizer.h"
#include "worker/hf/hf_export.h"

namespace weft {

// --dtype and --max-shard-bytes of a Hugging Face export.
struct HfExportFlags {
  std::string dtype = "fp32";
  uint64_t max_shard_bytes = 5'000'000'000;

  void AddTo(CLI::App* command);
  // INVALID_ARGUMENT naming the flag for a bad value.
  absl::StatusOr<hf::HfExportOptions> Options() const;
};

// Writes `units` (every unit's parameters) of the model of `job_spec` to `out_dir` as a Hugging
// Face directory with the files of `tokenizer` (null: none; a warning says the directory cannot
// make text); prints what it did (JSON with `json`). Returns the exit status.
int ExportHfDirectory(const weft::v1::JobSpec& job_spec,
                      const std::vector<std::vector<float>>& units,
                      std::shared_ptr<const data::Tokenizer> tokenizer, const std::string& out_dir,
                      const HfExportFlags& flags, bool json, const std::string& source);
// The same with the job's tokenizer as its workers read it (worker::LoadJobTokenizer), for a
// checkpoint, whose files do not record it; none, with a warning, if that cannot be read here.
int ExportHfDirectory(const weft::v1::JobSpec& job_spec,
                      const std::vector<std::vector<float>>& units, const std::string& out_dir,
                      const HfExportFlags& flags, bool json, const std::string& source);

class ModelCommands {
 public:
  explicit ModelCommands(CLI::App* app);

  bool Parsed() const;

  // Where the trained model of a job is (a path this machine can read), or why not.
  using JobModelPath = std::function<absl::StatusOr<std::string>(const std::string& job_id)>;
  // Runs the chosen subcommand; `job_model_path` is called only when SOURCE names a job.
  int Run(bool json, const JobModelPath& job_model_path) const;

 private:
  CLI::App* group_ = nullptr;
  CLI::App* from_hf_ = nullptr;
  CLI::App* export_ = nullptr;
  CLI::App* logits_ = nullptr;
  CLI::App* diff_ = nullptr;
  std::string other_;
  double tolerance_ = 0;
  std::string tokens_;
  std::string dir_;
  std::string source_;
  std::string out_dir_;
  std::string format_ = "hf";
  HfExportFlags flags_;
};

}  // namespace weft

#endif  // WEFT_TRAINCTL_TRAINCTL_MODEL_H_
