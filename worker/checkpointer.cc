#include "worker/checkpointer.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace weft::worker {
namespace {

std::string DoneKey(int64_t step, int32_t rank) {
  return absl::StrCat("ckpt/", step, "/rank/", rank);
}

}  // namespace

Checkpointer::Checkpointer(CheckpointClient* client, Store* store, const weft::v1::JobSpec& spec,
                           std::string job_id, int32_t rank, int32_t world_size)
    : client_(client), store_(store), spec_(spec), job_id_(std::move(job_id)), rank_(rank),
      world_(world_size), thread_([this] { Loop(); }) {}

Checkpointer::~Checkpointer() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_ && !next_; });
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Checkpointer::Submit(int64_t step, std::vector<UnitSlice> state) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_ && !next_; });
  next_.emplace(step, std::move(state));
  busy_ = true;
  cv_.notify_all();
}

std::optional<Checkpointer::Committed> Checkpointer::TakeCommitted() {
  std::lock_guard<std::mutex> lock(mu_);
  auto out = committed_;
  committed_.reset();
  return out;
}

void Checkpointer::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !busy_ && !next_; });
}

void Checkpointer::Loop() {
  while (true) {
    std::pair<int64_t, std::vector<UnitSlice>> work;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || next_.has_value(); });
      if (!next_) return;
      work = std::move(*next_);
      next_.reset();
    }
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = Upload(work.first, work.second);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count();
    if (!s.ok()) {
      spdlog::warn("job {} rank {}: checkpoint at step {} not saved: {}", job_id_, rank_,
                   work.first, std::string(s.message()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (s.ok() && rank_ == 0) committed_ = Committed{work.first, ms};
    busy_ = false;
    cv_.notify_all();
  }
}

std::vector<ShardTensor> ShardTensorsOf(const std::vector<UnitSlice>& state) {
  std::vector<ShardTensor> tensors;
  for (const UnitSlice& slice : state) {
    for (UnitState what : kUnitStates) {
      ShardTensor t;
      t.name = CheckpointTensorName(slice.unit, what);
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
                                                   int32_t world_size,
                                                   const weft::v1::JobSpec& spec,
                                                   const std::vector<UnitSlice>& state) {
  weft::v1::CheckpointManifest manifest;
  manifest.set_job_id(job_id);
  manifest.set_step(step);
  manifest.set_world_size(world_size);
  manifest.set_optimizer_step(step);
  *manifest.mutable_spec() = spec;
  for (const UnitSlice& slice : state) {
    for (UnitState what : kUnitStates) {
      auto* layout = manifest.add_tensors();
      layout->set_name(CheckpointTensorName(slice.unit, what));
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

absl::Status Checkpointer::Upload(int64_t step, const std::vector<UnitSlice>& state) {
  WEFT_RETURN_IF_ERROR(
      client_->WriteShard(job_id_, step, rank_, world_, ShardTensorsOf(state)).status());
  WEFT_RETURN_IF_ERROR(store_->Set(DoneKey(step, rank_), "stored"));
  if (rank_ != 0) return absl::OkStatus();

  std::vector<std::string> keys;
  for (int32_t r = 0; r < world_; ++r) keys.push_back(DoneKey(step, r));
  WEFT_RETURN_IF_ERROR(store_->Wait(keys, absl::Minutes(10)));
  return client_->Commit(CheckpointManifestFor(job_id_, step, world_, spec_, state));
}

}  // namespace weft::worker
