#include "worker/checkpointer.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace weft::worker {
namespace {

std::string DoneKey(int64_t step, int32_t rank) {
  return absl::StrCat("ckpt/", step, "/rank/", rank);
}

// Set by a rank once its last upload has ended (SaveDeferred).
std::string EndKey(int32_t rank) { return absl::StrCat("ckpt/end/rank/", rank); }

// Set, with the rank and its reason, by a rank whose shard write failed, before its DoneKey:
// rank 0 reads this one key instead of every rank's.
std::string NotStoredKey(int64_t step) { return absl::StrCat("ckpt/", step, "/not_stored"); }

double MsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int64_t SnapshotBytes(const std::vector<model_io::UnitSlice>& state) {
  int64_t elements = 0;
  for (const model_io::UnitSlice& slice : state) elements += slice.end - slice.begin;
  return elements * static_cast<int64_t>(model_io::kUnitStates.size() * sizeof(float));
}

}  // namespace

Checkpointer::Checkpointer(CheckpointClient* client, Store* store, const weft::v1::JobSpec& spec,
                           CheckpointRank who, CheckpointTimeouts timeouts)
    : client_(client), store_(store), spec_(spec), who_(std::move(who)), timeouts_(timeouts) {}

Checkpointer::~Checkpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_ && !next_; });
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::vector<std::string>> Checkpointer::RestoreCandidates() {
  // Rank 0 decides the candidates, so that every rank tries the same checkpoints in order.
  constexpr char kKey[] = "restore/candidates";
  std::string candidates;
  if (who_.rank == 0) {
    std::vector<std::string> list;
    for (const std::string& job : {who_.job_id, spec_.resume_from_job()}) {
      if (job.empty()) continue;
      WEFT_ASSIGN_OR_RETURN(auto manifests, client_->List(job));
      for (const auto& m : manifests) {
        if (job != who_.job_id) {
          // Refused before any rank reads a byte: another shape would fail as a range error
          // deep in a tensor, on every rank.
          if (std::string diff = ModelDifference(
                  spec_.model(), m.spec().model(), "in this job",
                  absl::StrCat("in ", job, "'s checkpoint at step ", m.step()));
              !diff.empty()) {
            return absl::FailedPreconditionError(absl::StrCat(
                "resume_from_job: job ", job, " has a model of another shape: ", diff));
          }
        }
        list.push_back(
            absl::StrCat(m.job_id(), " ", m.step(), " ", m.optimizer_step(), " ", m.world_size()));
      }
      if (!list.empty()) break;  // a job's own checkpoints win over the one it resumes from
    }
    if (list.empty() && !spec_.resume_from_job().empty()) {
      // Training from step 0 instead would look like success and be nothing the user asked.
      return absl::FailedPreconditionError(absl::StrCat(
          "resume_from_job: job ", spec_.resume_from_job(),
          " has no checkpoint in checkpointd (and this job none of its own): nothing to "
          "resume from"));
    }
    candidates = absl::StrJoin(list, ",");
    WEFT_RETURN_IF_ERROR(store_->Set(kKey, candidates));
  } else {
    WEFT_RETURN_IF_ERROR(
        store_->Wait({kKey}, absl::Milliseconds(timeouts_.restore_wait_timeout_ms)));
    WEFT_ASSIGN_OR_RETURN(candidates, store_->Get(kKey));
  }
  std::vector<std::string> split = absl::StrSplit(candidates, ',', absl::SkipEmpty());
  return split;
}

absl::StatusOr<Checkpointer::Restored> Checkpointer::RestoreLatest(zero::TrainingEngine* engine,
                                                                   comm::Communicator* comm) {
  const auto start = std::chrono::steady_clock::now();
  WEFT_ASSIGN_OR_RETURN(const std::vector<std::string> candidates, RestoreCandidates());
  std::string failures;
  for (absl::string_view candidate : candidates) {
    std::vector<std::string> parts = absl::StrSplit(candidate, ' ');
    int64_t step = 0, optimizer_steps = 0;
    int32_t world = 0;
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[1], &step) ||
        !absl::SimpleAtoi(parts[2], &optimizer_steps) || !absl::SimpleAtoi(parts[3], &world)) {
      return absl::InternalError(absl::StrCat("bad restore candidate \"", candidate, "\""));
    }
    const std::string& job = parts[0];
    absl::Status s = engine->Restore(
        [&](const std::string& tensor, int64_t begin, int64_t end, float* out) {
          return client_->ReadRange(job, step, tensor, begin, end, out);
        },
        optimizer_steps);
    // Every rank must restore the same checkpoint: one bad read anywhere rejects it for all.
    float bad = s.ok() ? 0.0f : 1.0f;
    WEFT_RETURN_IF_ERROR(comm->AllReduce(&bad, 1, comm::DataType::kFloat32)->Wait());
    if (bad == 0.0f) {
      // bench/checkpoint_scale_bench.sh reads this line.
      spdlog::info("job {} generation {}: restored checkpoint {} step {} in {:.3f} s",
                   who_.job_id, who_.generation, job, step, MsSince(start) / 1000);
      return Restored{step, job, world};
    }
    spdlog::warn("job {}: checkpoint {} step {} cannot be restored ({}); trying an older one",
                 who_.job_id, job, step,
                 s.ok() ? "another rank failed" : std::string(s.message()));
    absl::StrAppend(&failures, failures.empty() ? "" : "; ", job, " step ", step, ": ",
                    s.ok() ? "failed on another rank" : std::string(s.message()));
  }
  if (!failures.empty()) {
    return absl::DataLossError(absl::StrCat("no checkpoint could be restored: ", failures));
  }
  return Restored{};
}

bool Checkpointer::Due(int64_t completed_steps) const {
  const int64_t interval = spec_.checkpoint().interval_steps();
  return interval > 0 && completed_steps % interval == 0;
}

absl::StatusOr<bool> Checkpointer::ShouldSave(int64_t completed_steps,
                                               comm::Communicator* comm) {
  if (!Due(completed_steps) && deferred_from_ == 0) return false;
  // Ranks still uploading, and those of them whose checkpointd does not answer.
  float uploading[2] = {0.0f, 0.0f};
  {
    std::lock_guard<std::mutex> lock(mu_);
    uploading[0] = busy_ || next_ ? 1.0f : 0.0f;
  }
  if (uploading[0] > 0.0f && client_->Unreachable()) uploading[1] = 1.0f;
  WEFT_RETURN_IF_ERROR(comm->AllReduce(uploading, 2, comm::DataType::kFloat32)->Wait());
  if (uploading[0] > 0.0f) {
    if (deferred_from_ == 0) {
      deferred_from_ = completed_steps;
      spdlog::warn("job {} rank {}: checkpoint due at step {} deferred: {}", who_.job_id,
                   who_.rank, completed_steps,
                   DeferredSaveReason(static_cast<int>(uploading[0]),
                                      static_cast<int>(uploading[1]), client_->address()));
    }
    return false;
  }
  if (deferred_from_ != 0) {
    spdlog::info("job {} rank {}: checkpoint due at step {} taken at step {}", who_.job_id,
                 who_.rank, deferred_from_, completed_steps);
    deferred_from_ = 0;
  }
  return true;
}

absl::StatusOr<bool> Checkpointer::SaveDeferred(int64_t step, const zero::TrainingEngine& engine) {
  Drain();
  const bool deferred = deferred_from_ != 0;
  if (deferred) {
    spdlog::info("job {} rank {}: checkpoint due at step {} taken at the end, step {}",
                 who_.job_id, who_.rank, deferred_from_, step);
    deferred_from_ = 0;
    WEFT_RETURN_IF_ERROR(Save(step, engine).status());
    Drain();
  }
  if (spec_.checkpoint().interval_steps() > 0) {
    // Every rank, writer or not: each takes part in the collectives that follow.
    std::vector<std::string> keys;
    for (int32_t r = 0; r < who_.world_size; ++r) keys.push_back(EndKey(r));
    WEFT_RETURN_IF_ERROR(store_->Set(keys[who_.rank], "drained"));
    WEFT_RETURN_IF_ERROR(store_->Wait(keys, absl::Milliseconds(timeouts_.commit_timeout_ms)));
  }
  return deferred;
}

absl::Status Checkpointer::Prepare(const zero::TrainingEngine& engine,
                                   size_t host_available_bytes) {
  if (spec_.checkpoint().interval_steps() <= 0 || !who_.Writes()) return absl::OkStatus();
  const double need =
      static_cast<double>(CheckpointRankBytes(spec_.model(), who_.Writers()));
  if (need > static_cast<double>(host_available_bytes)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "checkpoint.interval_steps: each save copies this rank's params, m and v (%.2f GB) "
        "to host memory kept for the whole run, but its share of the host's available memory "
        "is %.2f GB (MemAvailable over the job's ranks on the host); run on more ranks or "
        "hosts, or without checkpoints",
        need / 1e9, static_cast<double>(host_available_bytes) / 1e9));
  }
  std::vector<model_io::UnitSlice> buffers = TakeBuffers();
  const absl::Status status = engine.Snapshot(&buffers);
  std::lock_guard<std::mutex> lock(mu_);
  spare_ = std::move(buffers);
  return status;
}

absl::StatusOr<double> Checkpointer::Save(int64_t step, const zero::TrainingEngine& engine) {
  // The stall: waiting for the previous upload, plus copying this rank's state to host memory.
  // The upload itself overlaps the next steps.
  if (!who_.Writes()) return 0.0;
  const auto start = std::chrono::steady_clock::now();
  std::vector<model_io::UnitSlice> snapshot = TakeBuffers();
  const double waited_ms = MsSince(start);
  const bool reused = !snapshot.empty();
  if (absl::Status s = engine.Snapshot(&snapshot); !s.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    spare_ = std::move(snapshot);  // still the right sizes for the next try
    return s;
  }
  const int64_t bytes = SnapshotBytes(snapshot);
  Submit({step, engine.optimizer_steps(), std::move(snapshot)});
  const double stall_ms = MsSince(start);
  // bench/checkpoint_scale_bench.sh reads this line: the two parts of the stall.
  spdlog::info("job {} rank {}: checkpoint at step {}: training stalled {:.1f} ms ({:.1f} ms "
               "waiting for the previous upload, {:.1f} ms copying {} bytes into {} buffers)",
               who_.job_id, who_.rank, step, stall_ms, waited_ms, stall_ms - waited_ms, bytes,
               reused ? "reused" : "new");
  std::lock_guard<std::mutex> lock(mu_);
  stall_ms_by_step_[step] = stall_ms;
  return stall_ms;
}

std::vector<model_io::UnitSlice> Checkpointer::TakeBuffers() {
  // Only Save (the training thread) takes and submits buffers, so once nothing is in flight
  // the thread no longer reads `spare_`'s buffers until the next Submit hands them back: the
  // copy never overwrites data being sent.
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_ && !next_; });
  return std::exchange(spare_, {});
}

void Checkpointer::Submit(Upload upload) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  next_ = std::move(upload);
  busy_ = true;
  cv_.notify_all();
}

std::optional<Checkpointer::Committed> Checkpointer::TakeCommitted() {
  std::lock_guard<std::mutex> lock(mu_);
  auto out = committed_;
  committed_.reset();
  if (out) {
    out->stall_ms = stall_ms_by_step_[out->step];
    // Older saves can no longer be reported: each report names the newest commit only.
    stall_ms_by_step_.erase(stall_ms_by_step_.begin(), stall_ms_by_step_.upper_bound(out->step));
  }
  return out;
}

std::optional<Checkpointer::Failed> Checkpointer::TakeFailed() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(failed_, std::nullopt);
}

void Checkpointer::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_ && !next_; });
}

void Checkpointer::Loop() {
  while (true) {
    Upload work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || next_.has_value(); });
      if (!next_) return;
      work = std::move(*next_);
      next_.reset();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = Send(work);
    const double ms = MsSince(start);
    if (!s.ok()) {
      spdlog::warn("job {} rank {}: checkpoint at step {} not saved: {}", who_.job_id,
                   who_.rank, work.step, std::string(s.message()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok() && who_.rank == 0) committed_ = Committed{work.step, ms};
    if (!s.ok()) failed_ = Failed{work.step, std::string(s.message())};
    spare_ = std::move(work.state);
    busy_ = false;
    cv_.notify_all();
  }
}

std::string DeferredSaveReason(int uploading, int unreachable, const std::string& checkpointd) {
  if (unreachable > 0) {
    return absl::StrCat(uploading, " rank(s) still uploading the previous one, ", unreachable,
                        " of them waiting for checkpointd at ", checkpointd,
                        ", which is unreachable (is it running?)");
  }
  return absl::StrCat(uploading, " rank(s) still uploading the previous one (storage slower "
                      "than checkpoint.interval_steps)");
}

std::vector<ShardTensor> ShardTensorsOf(const std::vector<model_io::UnitSlice>& state) {
  std::vector<ShardTensor> tensors;
  for (const model_io::UnitSlice& slice : state) {
    for (model_io::UnitState what : model_io::kUnitStates) {
      ShardTensor t;
      t.name = model_io::CheckpointTensorName(slice.unit, what);
      t.shape = {slice.size};
      t.begin = slice.begin;
      t.end = slice.end;
      t.data = slice.data(what).data();
      if (t.end > t.begin) tensors.push_back(std::move(t));
    }
  }
  return tensors;
}

weft::v1::CheckpointManifest CheckpointManifestFor(const std::string& job_id, int64_t step,
                                                   int64_t optimizer_steps, int32_t world_size,
                                                   const weft::v1::JobSpec& spec,
                                                   const std::vector<model_io::UnitSlice>& state) {
  weft::v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  manifest.set_world_size(world_size);
  manifest.set_optimizer_step(optimizer_steps);
  *manifest.mutable_spec() = spec;
  for (const model_io::UnitSlice& slice : state) {
    for (model_io::UnitState what : model_io::kUnitStates) {
      auto* layout = manifest.add_tensors();
      layout->set_name(model_io::CheckpointTensorName(slice.unit, what));
      layout->set_dtype(weft::v1::DTYPE_F32);
      layout->add_shape(slice.size);
    }
  }
  for (int32_t r = 0; r < world_size; ++r) {
    auto* rank = manifest.add_ranks();
    rank->set_rank(r);
    // The batch of a step is a function of (seed, step, rank, world): the step is the position.
    rank->set_data_position(step);
  }
  return manifest;
}

absl::Status Checkpointer::Send(const Upload& upload) {
  const int64_t step = upload.step;
  const std::vector<model_io::UnitSlice>& state = upload.state;
  const int32_t rank = who_.rank;
  const int32_t world = who_.Writers();
  const auto start = std::chrono::steady_clock::now();
  const absl::StatusOr<int64_t> written =
      client_->WriteShard(who_.job_id, step, rank, world, ShardTensorsOf(state));
  if (!written.ok()) {
    // Said at once, so that rank 0 gives the checkpoint up now instead of waiting out
    // commit_timeout_ms for this rank: meanwhile its upload would stay in flight, deferring
    // every later save, and the end of training would wait for it while the other ranks sat
    // in their next collective until it timed out. Best effort: unsaid, the timeout remains.
    (void)store_->Set(NotStoredKey(step),
                      absl::StrCat("rank ", rank, " did not store its shard (",
                                   written.status().message(), ")"));
    (void)store_->Set(DoneKey(step, rank), "not stored");
    return written.status();
  }
  const int64_t bytes = *written;
  const double ms = MsSince(start);
  // bench/checkpoint_scale_bench.sh reads this line: this rank's own upload, without the wait
  // for the other ranks and the commit that the coordinator's event includes.
  spdlog::info("job {} rank {}: checkpoint at step {}: uploaded {} bytes in {:.1f} ms "
               "({:.3f} GB/s)",
               who_.job_id, rank, step, bytes, ms, ms > 0 ? bytes / ms / 1e6 : 0.0);
  WEFT_RETURN_IF_ERROR(store_->Set(DoneKey(step, rank), "stored"));
  if (rank != 0) return absl::OkStatus();

  std::vector<std::string> keys;
  for (int32_t r = 0; r < world; ++r) keys.push_back(DoneKey(step, r));
  WEFT_RETURN_IF_ERROR(store_->Wait(keys, absl::Milliseconds(timeouts_.commit_timeout_ms)));
  // A failed rank set the not-stored key before its DoneKey, so the wait has made it visible.
  const absl::StatusOr<std::string> not_stored = store_->Get(NotStoredKey(step));
  if (not_stored.ok()) {
    return absl::AbortedError(absl::StrCat(*not_stored, ": the checkpoint is not committed"));
  }
  if (!absl::IsNotFound(not_stored.status())) return not_stored.status();
  return client_->Commit(
      CheckpointManifestFor(who_.job_id, step, upload.optimizer_steps, world, spec_, state));
}

}  // namespace weft::worker
