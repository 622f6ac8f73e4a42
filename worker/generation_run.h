// One generation of one job on this worker: rendezvous, data, device backend, checkpoint
// restore, the training loop with its reports, the final model. Runs on its own thread; the
// agent's heartbeat thread keeps the worker alive meanwhile and calls Abort() when the
// coordinator ends the generation.
#ifndef WEFT_WORKER_GENERATION_RUN_H_
#define WEFT_WORKER_GENERATION_RUN_H_

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/checkpoint_client.h"
#include "client/coordinator_client.h"
#include "common/store.h"
#include "worker/checkpointer.h"
#include "worker/comm/communicator.h"
#include "worker/data/token_dataset.h"
#include "worker/data/tokenizer.h"
#include "worker/device_backend.h"
#include "worker/hf/hf_checkpoint.h"
#include "worker/sharding_auto.h"
#include "worker/zero/training_engine.h"
#include "worker/model_io/model_file.h"
#include "worker/zero/sharding_groups.h"
#include "worker/step_reports.h"
#include "worker/worker_metrics.h"
#include "weft/v1/worker.pb.h"

namespace weft::worker {

struct RunOptions {
  std::string worker_id;
  int64_t incarnation = 0;
  // The device and how its collectives connect.
  DeviceOptions device;
  // Where rank 0 writes the final model: <output_dir>/<job_id>/model.safetensors.
  std::string output_dir;
  // checkpointd host:port; empty: no checkpoints are saved or restored.
  std::string checkpointd;
  CheckpointTimeouts checkpoint_timeouts;
  int64_t rendezvous_timeout_ms = 120000;
  // Peak FLOP/s of this worker's device, the denominator of MFU.
  double peak_flops = 989e12;
  // Test-only: how long a run that ended waits before it is done, standing for a slow teardown
  // (an upload finishing). The worker must keep heartbeating meanwhile.
  int64_t test_teardown_delay_ms = 0;
};

class GenerationRun {
 public:
  GenerationRun(const weft::v1::JoinJobCommand& command, const RunOptions& options,
                CoordinatorClient* client, WorkerMetrics* metrics);
  // Aborts and joins the thread.
  ~GenerationRun();

  void Start();
  // Ends the run as soon as possible: in-flight collectives fail at once. Thread-safe.
  void Abort(const absl::Status& reason);
  bool Finished() const { return finished_.load(); }

  const std::string& job_id() const { return command_.job_id(); }
  int64_t generation() const { return command_.generation(); }
  int32_t rank() const { return command_.rank(); }
  int64_t step() const { return step_.load(); }

 private:
  // This rank's training data; `val` is null without validation.
  struct Data {
    std::unique_ptr<data::TokenDataset> train;
    std::unique_ptr<data::TokenDataset> val;
    // What the trained model records (null: none, token ids in and out).
    std::shared_ptr<const data::Tokenizer> tokenizer;
    // The chat template of the job's conversations (empty: text data), recorded beside it.
    std::string chat_template;
  };
  // What the step loop works with.
  struct Training {
    int world = 0;
    Data* data = nullptr;
    DeviceBackend* backend = nullptr;
    // Null without checkpoints.
    Checkpointer* checkpointer = nullptr;
  };
  // Makes the communicator reachable by Abort() while this object lives.
  class AbortHook;

  void Run();
  absl::Status Train();
  // The phases of Train. Each reports its own failure to the coordinator before returning it.
  // Rendezvous: every member present, ranks confirmed. Returns the world and, with hybrid
  // sharding, its groups (scope HOST: from the members' hosts).
  // Joins the rendezvous, telling the coordinator what is wrong with this member's data
  // (empty: nothing).
  absl::StatusOr<zero::ShardingGroups> Join(const std::string& data_error);
  // The job's datasets and tokenizer; reports nothing (Train passes the error to Join).
  absl::StatusOr<Data> OpenData();
  // `settle`: sharding.scope AUTO's spec (SettleAutoSpec), else null.
  absl::StatusOr<DeviceBackend> CreateBackend(Store* store, const zero::ShardingGroups& groups,
                                              const BeforeEngine& settle);
  // sharding.scope AUTO: the groups every rank agrees on (ChooseAutoScope); a failure (of the
  // store: a peer gone, the generation over) is reported as a lost peer.
  absl::StatusOr<AutoScope> ChooseScopeForAuto(Store* store, int world);
  // Rank 0, once per generation: the engine's memory plan and AUTO's sharding choice (either
  // may be empty), as MEMORY_PLANNED and SHARDING_CHOSEN events.
  void ReportPlans(const std::string& memory_plan, const std::string& sharding_choice);
  // Which of this rank's communicators span hosts (from rank_hosts_), for the traffic metrics.
  struct Links {
    bool shards_span_hosts = false;
    bool replica_spans_hosts = false;
  };
  Links TrafficLinks(const zero::ShardingGroups& groups) const;
  // Bytes this rank's collectives have sent, by link (Communicator::sent_bytes).
  struct Traffic {
    int64_t intra_host = 0;
    int64_t inter_host = 0;
    Traffic operator-(const Traffic& o) const {
      return {intra_host - o.intra_host, inter_host - o.inter_host};
    }
  };
  Traffic TrafficSoFar(const DeviceBackend& backend) const;
  // The Hugging Face checkpoint of spec.init_from_hf_dir, headers read and config.json checked
  // against the spec (null when the spec names none): before the engine allocates the model,
  // so that a bad directory fails the job at once. A failure is permanent.
  absl::StatusOr<std::unique_ptr<hf::HfImporter>> OpenHfInit();
  // Restores the newest restorable checkpoint (see Checkpointer::RestoreLatest); without one,
  // imports `hf_init` when given. Returns the step to start at (0 without checkpointd).
  absl::StatusOr<int64_t> Restore(Checkpointer* checkpointer, const hf::HfImporter* hf_init,
                                  DeviceBackend* backend);
  // Every rank loads its shard of `importer`'s weights (AdamW moments 0); one failed read
  // anywhere fails the import on every rank.
  absl::Status ImportHf(const hf::HfImporter& importer, DeviceBackend* backend);
  absl::Status StepLoop(int64_t start_step, const Training& training);
  // A step that failed with `error`: reported (permanent when the same inputs would fail the
  // same way again, IsDeterministicStepError; otherwise as a lost peer) and returned with the
  // step named.
  absl::Status StepFailed(int64_t step, const absl::Status& error);
  // The checkpoint after `completed` steps when it is due (every rank agrees through the
  // checkpointer's all-reduce: a failure there is a lost peer); a failed save is reported as
  // transient.
  absl::Status MaybeSave(int64_t completed, const Training& training);
  // Validation after `completed` steps when it is due; returns the latest validation loss.
  absl::StatusOr<double> MaybeValidate(int64_t completed, const Training& training,
                                       double val_loss);
  // Rank 0: queues the report of a completed step on `reports` (sent from its thread).
  void ReportStep(int64_t completed, const zero::StepResult& result, double tokens_per_s,
                  double mfu, double val_loss, const Traffic& sent, const Training& training,
                  StepReports* reports);
  // Gathers the model (each group gathers its own copy, over the group), and on rank 0 writes
  // it and reports the job finished.
  absl::Status Finish(const Training& training);
  // Gathers every unit in turn (collective) and hands each to `file` (rank 0; null elsewhere),
  // then drops it: no rank holds more than one whole unit. A failed write stops the writing,
  // not the gathers the other ranks wait in; *written keeps the first write error.
  absl::Status GatherModel(zero::TrainingEngine* engine, model_io::ModelFileWriter* file,
                           absl::Status* written);
  // Rank 0 tells the coordinator about each commit with its next report, and every rank about
  // its failed saves (CHECKPOINT_FAILED events); true when `report` now carries a failure.
  bool AddCheckpointOutcome(Checkpointer* checkpointer, weft::v1::ReportProgressRequest* report);
  // Ranks other than 0, which send no step reports: a report of their failed save, if any.
  void ReportCheckpointFailure(Checkpointer* checkpointer);
  weft::v1::ReportProgressRequest NewReport() const;
  // Tells the coordinator this rank failed (unless the run was aborted: then it is expected),
  // behind the step reports still queued.
  void ReportError(const absl::Status& status, bool permanent);
  // A collective failed. When a peer died, the survivors' collectives fail at once (the TCP
  // connection resets) while the coordinator needs up to a heartbeat timeout to see the death;
  // reporting at once would blame this healthy rank. So wait for the coordinator's verdict
  // first, and report only if it does not end the generation.
  void ReportCollectiveError(const absl::Status& status);

  const weft::v1::JoinJobCommand command_;
  const RunOptions options_;
  CoordinatorClient* client_;
  WorkerMetrics* metrics_;
  // As assigned by the JoinJob command; Join confirms it.
  int32_t rank_;
  int32_t ranks_on_host_ = 1;  // the generation's ranks on this host (JoinResponse)
  // Every rank's host, in rank order (Join's peers, which HOST and AUTO ask for; else empty).
  std::vector<std::string> rank_hosts_;
  Links traffic_;
  // Rank 0's step reports while StepLoop runs (its local), else null.
  StepReports* step_reports_ = nullptr;

  absl::Mutex mu_;
  absl::Status abort_reason_ ABSL_GUARDED_BY(mu_);
  comm::Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;

  std::atomic<bool> aborted_{false};
  std::atomic<bool> finished_{false};
  std::atomic<int64_t> step_{0};
  std::thread thread_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_GENERATION_RUN_H_
