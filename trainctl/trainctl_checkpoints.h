// trainctl's checkpoint subcommands, talking to weft-checkpointd through CheckpointClient:
//   trainctl checkpoints JOB                         committed checkpoints, newest first
//   trainctl checkpoint pin|unpin|delete JOB STEP
//   trainctl checkpoint export JOB STEP --out PATH [--format weft|hf]
//       weft (default): one portable safetensors model file; hf: a Hugging Face directory
//       ([--dtype bf16|fp32] [--max-shard-bytes N], see trainctl_model.h)
// Kept apart from trainctl.cc, which talks to the coordinator only.
#ifndef WEFT_TRAINCTL_TRAINCTL_CHECKPOINTS_H_
#define WEFT_TRAINCTL_TRAINCTL_CHECKPOINTS_H_

#include <functional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "trainctl/trainctl_model.h"

namespace weft {

class CheckpointCommands {
 public:
  // Adds the subcommands to `app`; their arguments land in this object, which must outlive
  // app.parse().
  explicit CheckpointCommands(CLI::App* app);

  // True if app.parse() chose one of these subcommands.
  bool Parsed() const;

  // Asks the coordinator whether a job exists: OK, NOT_FOUND, or why it could not tell.
  using JobLookup = std::function<absl::Status(const std::string& job_id)>;

  // Runs the chosen subcommand against the daemon at `checkpointd`; `json` selects -o json.
  // `job_exists` is asked only when `checkpoints JOB` finds no checkpoint: a job the
  // coordinator does not know either is an error (exit 1), most likely a mistyped id, where
  // one that exists simply has none yet (exit 0). When the coordinator cannot tell (down, bad
  // --coordinator), the empty list stands with a warning: checkpoint commands must work with
  // checkpointd alone. Returns the process exit status (errors printed as
  // "trainctl: <message>").
  int Run(const std::string& checkpointd, bool json, absl::Duration rpc_timeout,
          const JobLookup& job_exists) const;

 private:
  CLI::App* list_ = nullptr;
  CLI::App* group_ = nullptr;
  CLI::App* pin_ = nullptr;
  CLI::App* unpin_ = nullptr;
  CLI::App* delete_ = nullptr;
  CLI::App* export_ = nullptr;
  std::string job_id_;
  std::string step_;  // parsed by Run, so a negative step gets our message, not CLI11's
  std::string out_path_;
  std::string format_ = "weft";
  HfExportFlags hf_flags_;
};

}  // namespace weft

#endif  // WEFT_TRAINCTL_TRAINCTL_CHECKPOINTS_H_
