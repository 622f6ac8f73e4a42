// Asynchronous checkpoints of one generation run.
//
// Training hands a host copy of this rank's state to Submit() and goes on; a background thread
// streams it to checkpointd, then records "shard stored" in the generation's store. Rank 0's
// thread waits there for every rank and commits the manifest: the checkpoint exists only then.
// One upload is in flight at a time; Submit() waits for the previous one, and that wait is part
// of the training stall it reports.
//
// Upload failures do not stop training (the next checkpoint may succeed); they are logged, and
// the first one is kept for error().
#ifndef WEFT_WORKER_CHECKPOINTER_H_
#define WEFT_WORKER_CHECKPOINTER_H_

#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "client/checkpoint_client.h"
#include "common/store.h"
#include "worker/zero_cpu.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

// The manifest of a checkpoint of `spec`'s model at `step` written by `world_size` ranks, each
// holding slices like `state` (only the units and sizes of `state` are used).
weft::v1::CheckpointManifest CheckpointManifestFor(const std::string& job_id, int64_t step,
                                                   int32_t world_size,
                                                   const weft::v1::JobSpec& spec,
                                                   const std::vector<UnitSlice>& state);

// The tensors of `state` as one rank's shard (pointing into `state`).
std::vector<ShardTensor> ShardTensorsOf(const std::vector<UnitSlice>& state);

class Checkpointer {
 public:
  // `client` and `store` (the generation's store) must outlive this object.
  Checkpointer(CheckpointClient* client, Store* store, const weft::v1::JobSpec& spec,
               std::string job_id, int32_t rank, int32_t world_size);
  // Waits for the upload in flight.
  ~Checkpointer();

  // Queues the state after `step` completed steps, first waiting for the previous upload.
  void Submit(int64_t step, std::vector<UnitSlice> state);

  struct Committed {
    int64_t step = 0;
    double save_ms = 0;
  };
  // Rank 0: the newest checkpoint committed since the last call, if any.
  std::optional<Committed> TakeCommitted();

  // Waits until nothing is in flight.
  void Drain();

 private:
  void Loop();
  absl::Status Upload(int64_t step, const std::vector<UnitSlice>& state);

  CheckpointClient* client_;
  Store* store_;
  const weft::v1::JobSpec spec_;
  const std::string job_id_;
  const int32_t rank_;
  const int32_t world_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool busy_ = false;
  std::optional<std::pair<int64_t, std::vector<UnitSlice>>> next_;
  std::optional<Committed> committed_;
  std::thread thread_;
};

}  // namespace weft::worker

#endif  // WEFT_WORKER_CHECKPOINTER_H_
