// The checkpoint lifecycle of one generation run, on one rank: restore at the start, save
// asynchronously while training.
//
// Restore (RestoreLatest): rank 0 lists the candidate checkpoints (this job's, else the one it
// resumes from; newest first) into the generation's store, so that every rank tries the same
// ones in the same order; after each attempt the ranks all-reduce a failure flag, and one bad
// read anywhere rejects that checkpoint for all of them and moves everyone to an older one.
//
// Save (Save): training hands over a host copy of this rank's state and goes on; a background
// thread streams it to checkpointd, then records "shard stored" in the generation's store.
// Rank 0's thread waits there for every rank and commits the manifest: the checkpoint exists
// only then. One upload is in flight at a time: ShouldSave defers a due save until every
// rank's upload ended, so the stall Save returns is its copy (Save itself still waits for an
// upload in flight, for callers that save unconditionally). The host copy's buffers go back
// to the Checkpointer once uploaded and the next Save copies into them (Prepare allocates
// them before training): at 1.5B parameters a fresh copy would allocate and page-fault
// ~18 GB per save.
//
// Ranks that do not write (CheckpointRank::writers) save nothing and allocate nothing; they still
// restore and take part in every collective decision.
//
// Upload failures do not stop training (the next checkpoint may succeed); they are logged and
// handed to the caller (TakeFailed), which reports them as CHECKPOINT_FAILED job events.
#ifndef WEFT_WORKER_CHECKPOINTER_H_
#define WEFT_WORKER_CHECKPOINTER_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/checkpoint_client.h"
#include "common/store.h"
#include "worker/comm/communicator.h"
#include "worker/zero/training_engine.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

// The manifest of a checkpoint of `spec`'s model at `step` written by `world_size` ranks, each
// holding slices like `state` (only the units and sizes of `state` are used).
// `optimizer_steps`: the AdamW updates the state has had (TrainingEngine::optimizer_steps).
weft::v1::CheckpointManifest CheckpointManifestFor(const std::string& job_id, int64_t step,
                                                   int64_t optimizer_steps, int32_t world_size,
                                                   const weft::v1::JobSpec& spec,
                                                   const std::vector<model_io::UnitSlice>& state);

// The tensors of `state` as one rank's shard (pointing into `state`).
std::vector<ShardTensor> ShardTensorsOf(const std::vector<model_io::UnitSlice>& state);

// Why a due save is deferred, for the log: `uploading` ranks still upload the previous
// checkpoint, `unreachable` of them to a checkpointd (at `checkpointd`) that does not answer.
// An unreachable checkpointd is said as such: "storage slower than the interval" would send an
// operator after the wrong problem.
std::string DeferredSaveReason(int uploading, int unreachable, const std::string& checkpointd);

struct CheckpointTimeouts {
  // How long a rank other than 0 waits for rank 0's list of checkpoints to restore.
  int64_t restore_wait_timeout_ms = 5 * 60 * 1000;
  // How long rank 0 waits for every rank's shard of a checkpoint before giving that
  // checkpoint up. A rank whose shard write fails says so through the store, which ends the
  // wait at once; the timeout is for ranks that are slow or gone.
  int64_t commit_timeout_ms = 10 * 60 * 1000;
};

// Who this rank is: the checkpoints it reads and writes are `job_id`'s.
struct CheckpointRank {
  std::string job_id;
  int64_t generation = 0;
  int32_t rank = 0;
  int32_t world_size = 1;
  // Ranks [0, writers) upload; 0: all. Hybrid sharding passes its group size: group 0's shards
  // are the whole state (every replica holds the same), so the checkpoint is the sharding of
  // one group and the other ranks only restore and vote.
  int32_t writers = 0;

  int32_t Writers() const { return writers > 0 ? writers : world_size; }
  bool Writes() const { return rank < Writers(); }
};

class Checkpointer {
 public:
  // `client` and `store` (the generation's store) must outlive this object. Saves happen every
  // `spec.checkpoint().interval_steps()` steps (never when 0).
  Checkpointer(CheckpointClient* client, Store* store, const weft::v1::JobSpec& spec,
               CheckpointRank who, CheckpointTimeouts timeouts = {});
  // Waits for the upload in flight.
  ~Checkpointer();

  // Restores into `engine` the newest checkpoint every rank can read (this job's, else
  // resume_from_job's), falling back to older ones; returns which (step 0 when there is
  // none). DATA_LOSS when there were checkpoints but none could be restored;
  // FAILED_PRECONDITION, naming spec field resume_from_job, when that job has no checkpoint
  // or one of another model shape (and this job none of its own). Collective over `comm`:
  // every rank calls it.
  struct Restored {
    int64_t step = 0;
    std::string job;     // whose checkpoint: this job or resume_from_job
    int32_t world_size = 0;  // the world that wrote it
  };
  absl::StatusOr<Restored> RestoreLatest(zero::TrainingEngine* engine, comm::Communicator* comm);

  // Whether a checkpoint is due once `completed_steps` steps are done.
  bool Due(int64_t completed_steps) const;

  // Whether to save now, once `completed_steps` steps are done: a checkpoint is due (or was
  // deferred) and no rank still uploads the previous one. A due save that would wait for an
  // upload in flight is deferred to the first step after every rank's upload ended instead,
  // so a save never stalls training for longer than its copy to host memory; when storage is
  // slower than the interval, checkpoints come as often as it allows. The deferral is logged
  // with its cause (DeferredSaveReason). Collective over `comm` (a two-value all-reduce: ranks
  // uploading, and those of them finding checkpointd unreachable, so every rank decides alike)
  // when a save is due or deferred; local otherwise.
  absl::StatusOr<bool> ShouldSave(int64_t completed_steps, comm::Communicator* comm);

  // At the end of training: waits for this rank's upload in flight, takes the save
  // ShouldSave deferred, if any (as `step`), and waits for its upload; returns whether it
  // saved. Every rank agrees (ShouldSave decides collectively), so every rank calls it alike.
  // When saves are on it returns only once every rank has got this far (a wait in the store,
  // at most commit_timeout_ms): ranks finish their uploads at different times, rank 0 last
  // (it commits), and a rank that went on to the collectives after training would wait there
  // for the others under the collectives' much shorter timeout.
  absl::StatusOr<bool> SaveDeferred(int64_t step, const zero::TrainingEngine& engine);

  // When saves are on: allocates (and faults in) the host buffers saves copy into, from a first
  // snapshot of `engine`, so the first save's stall is a copy too, not an allocation of the
  // rank's whole state. Call once before training. RESOURCE_EXHAUSTED, naming both figures,
  // when the rank's share (12 bytes a parameter over the world) exceeds
  // `host_available_bytes` (this rank's share of MemAvailable): the buffers stay for the
  // whole run, and a host that cannot hold them would kill the worker at the first save
  // instead. Another error leaves saves to allocate.
  absl::Status Prepare(const zero::TrainingEngine& engine, size_t host_available_bytes);

  // Takes the snapshot of `engine` after `step` completed steps and queues its upload, first
  // waiting for the previous one. Returns the stall this cost training, in milliseconds, or
  // the error of the device copy (nothing is queued then).
  absl::StatusOr<double> Save(int64_t step, const zero::TrainingEngine& engine);

  struct Committed {
    int64_t step = 0;
    // Rank 0's background save: its upload, the wait for every rank's, the commit.
    double save_ms = 0;
    // The training stall Save returned for this step.
    double stall_ms = 0;
  };
  // Rank 0: the newest checkpoint committed since the last call, if any.
  std::optional<Committed> TakeCommitted();

  struct Failed {
    int64_t step = 0;
    // Why this rank's save was not stored (its upload, or rank 0's commit).
    std::string reason;
  };
  // Any rank: the newest of its saves that failed since the last call, if any (a failure is
  // also logged when it happens).
  std::optional<Failed> TakeFailed();

  // Waits until nothing is in flight.
  void Drain();

 private:
  // The candidates every rank tries, as "<job> <step> <optimizer steps>" entries, newest
  // first.
  absl::StatusOr<std::vector<std::string>> RestoreCandidates();
  // Waits until no upload is in flight, then hands over the buffers of the last one.
  std::vector<model_io::UnitSlice> TakeBuffers();
  // A snapshot on its way to checkpointd.
  struct Upload {
    int64_t step = 0;
    int64_t optimizer_steps = 0;
    std::vector<model_io::UnitSlice> state;
  };
  void Submit(Upload upload);
  void Loop();
  absl::Status Send(const Upload& upload);

  CheckpointClient* client_;
  Store* store_;
  const weft::v1::JobSpec spec_;
  const CheckpointRank who_;
  const CheckpointTimeouts timeouts_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool busy_ = false;
  std::optional<Upload> next_;
  // The last upload's buffers, back from the thread; empty while one is in flight.
  std::vector<model_io::UnitSlice> spare_;
  std::optional<Committed> committed_;
  std::optional<Failed> failed_;
  // The step a due save was deferred from while an upload was in flight (0: none).
  int64_t deferred_from_ = 0;
  // Stalls of the saves not yet reported as committed, by step.
  std::map<int64_t, double> stall_ms_by_step_;
  // Started by the first save.
  std::thread thread_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_CHECKPOINTER_H_
