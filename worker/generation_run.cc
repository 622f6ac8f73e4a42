#include "worker/generation_run.h"

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/remote_store.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/comm/communicator.h"
#include "worker/data/token_dataset.h"
#include "worker/model_io.h"
#include "worker/zero.h"

namespace weft::worker {

GenerationRun::GenerationRun(const weft::v1::JoinJobCommand& command, const RunOptions& options,
                             CoordinatorClient* client, WorkerMetrics* metrics)
    : command_(command), options_(options), client_(client), metrics_(metrics) {}

GenerationRun::~GenerationRun() {
  Abort(absl::AbortedError("worker shutting down"));
  if (thread_.joinable()) thread_.join();
}

void GenerationRun::Start() {
  thread_ = std::thread([this] { Run(); });
}

void GenerationRun::Abort(const absl::Status& reason) {
  absl::MutexLock lock(&mu_);
  if (aborted_.exchange(true)) return;
  abort_reason_ = reason;
  if (comm_ != nullptr) comm_->Abort(reason);
}

void GenerationRun::ReportError(const absl::Status& status, bool permanent) {
  if (aborted_.load()) return;  // the generation was ended for us; our failure is a symptom
  spdlog::error("job {} generation {} rank {}: {}", job_id(), generation(), rank_,
                std::string(status.message()));
  weft::v1::ReportProgressRequest report;
  report.set_job_id(job_id());
  report.set_generation(generation());
  report.set_worker_id(options_.worker_id);
  report.set_rank(rank_);
  report.set_error(std::string(status.message()));
  report.set_error_is_permanent(permanent);
  if (auto r = client_->ReportProgress(report); !r.ok()) {
    spdlog::warn("could not report the error: {}", std::string(r.status().message()));
  }
}

void GenerationRun::ReportCollectiveError(const absl::Status& status) {
  const auto& fault = command_.spec().fault();
  const absl::Time until = absl::Now() + absl::Milliseconds(fault.heartbeat_timeout_ms() +
                                                            2 * fault.heartbeat_interval_ms());
  while (!aborted_.load() && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ReportError(status, /*permanent=*/false);
}

void GenerationRun::Run() {
  metrics_->SetBusy(true);
  absl::Status status = Train();
  metrics_->SetBusy(false);
  if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    spdlog::info("job {} generation {}: aborted: {}", job_id(), generation(),
                 std::string(abort_reason_.message()));
    metrics_->CountRunEnd("aborted");
  } else if (status.ok()) {
    metrics_->CountRunEnd("completed");
  } else {
    metrics_->CountRunEnd("failed");
  }
  finished_ = true;
}

absl::Status GenerationRun::Train() {
  const weft::v1::JobSpec& spec = command_.spec();

  // Rendezvous: every member present, ranks confirmed.
  weft::v1::JoinRequest join;
  join.set_job_id(job_id());
  join.set_generation(generation());
  join.set_worker_id(options_.worker_id);
  join.set_incarnation(options_.incarnation);
  auto joined = client_->Join(join, absl::Milliseconds(options_.rendezvous_timeout_ms));
  if (!joined.ok()) {
    if (joined.status().code() != absl::StatusCode::kAborted) ReportError(joined.status(), false);
    return joined.status();
  }
  rank_ = joined->rank();
  const int world = joined->world_size();
  spdlog::info("job {} generation {}: rank {} of {}", job_id(), generation(), rank_, world);

  // The data is checked before any collective: a bad file fails the job, not a timeout.
  const int vocab = spec.model().vocab_size();
  const int seq_len = spec.training().sequence_length();
  auto train = data::TokenDataset::Open(spec.data(), vocab, seq_len, data::Split::kTrain);
  if (!train.ok()) {
    ReportError(train.status(), /*permanent=*/true);
    return train.status();
  }
  std::unique_ptr<data::TokenDataset> val;
  if (spec.training().val_interval_steps() > 0) {
    auto v = data::TokenDataset::Open(spec.data(), vocab, seq_len, data::Split::kVal);
    if (!v.ok()) {
      ReportError(v.status(), /*permanent=*/true);
      return v.status();
    }
    val = std::move(*v);
  }

  // Collectives rendezvous through the coordinator's store for this generation (under the
  // communicator's own key prefix).
  RemoteStore store(client_->channel(), job_id(), generation());
  comm::GlooOptions gloo_options;
  gloo_options.hostname = options_.data_address;
  gloo_options.timeout_ms = options_.collective_timeout_ms;
  auto comm = comm::CreateGlooCommunicator(&store, rank_, world, gloo_options);
  if (!comm.ok()) {
    ReportCollectiveError(comm.status());
    return comm.status();
  }
  {
    absl::MutexLock lock(&mu_);
    comm_ = comm->get();
    if (aborted_.load()) comm_->Abort(abort_reason_);
  }
  // The communicator must not be used once this function returns.
  struct Detach {
    GenerationRun* run;
    ~Detach() {
      absl::MutexLock lock(&run->mu_);
      run->comm_ = nullptr;
    }
  } detach{this};

  auto engine = ZeroEngine::Create(spec, comm->get());
  if (!engine.ok()) {
    ReportError(engine.status(), true);
    return engine.status();
  }
  const int batch = spec.training().micro_batch_size();
  const uint64_t seed = spec.training().seed();
  BatchFn train_batch = [&](int64_t step, int micro, int32_t* inputs, int32_t* targets) {
    (*train)->Batch(seed, step, micro, rank_, world, batch, inputs, targets);
  };
  // Validation always reads the same batches, so successive losses compare.
  BatchFn val_batch = [&](int64_t, int micro, int32_t* inputs, int32_t* targets) {
    val->Batch(seed, 0, micro, rank_, world, batch, inputs, targets);
  };

  const int64_t total = spec.training().total_steps();
  const double tokens_per_step = static_cast<double>(world) * batch * seq_len *
                                 spec.training().grad_accum_steps();
  double val_loss = 0;
  for (int64_t step = 0; step < total; ++step) {
    if (aborted_.load()) return absl::AbortedError("aborted");
    auto result = (*engine)->TrainStep(step, train_batch);
    if (!result.ok()) {
      const absl::Status s(result.status().code(),
                           absl::StrCat("step ", step, ": ", result.status().message()));
      ReportCollectiveError(s);
      return s;
    }
    step_ = step + 1;
    const int64_t interval = spec.training().val_interval_steps();
    if (val && interval > 0 && ((step + 1) % interval == 0 || step + 1 == total)) {
      auto v = (*engine)->EvalLoss(spec.training().val_batches(), val_batch);
      if (!v.ok()) {
        ReportCollectiveError(v.status());
        return v.status();
      }
      val_loss = *v;
      metrics_->RecordValidation(val_loss);
    }
    const double tokens_per_s = tokens_per_step / (result->timings.step_ms / 1000.0);
    metrics_->RecordStep(step + 1, *result, tokens_per_s, (*engine)->StateBytes());
    if (rank_ == 0) {
      weft::v1::ReportProgressRequest report;
      report.set_job_id(job_id());
      report.set_generation(generation());
      report.set_worker_id(options_.worker_id);
      report.set_rank(rank_);
      auto* m = report.mutable_metrics();
      m->set_step(step + 1);
      m->set_loss(result->loss);
      m->set_val_loss(val_loss);
      m->set_learning_rate(result->learning_rate);
      m->set_grad_norm(result->grad_norm);
      m->set_tokens_per_s(tokens_per_s);
      m->set_step_ms(result->timings.step_ms);
      m->set_forward_ms(result->timings.forward_ms);
      m->set_backward_ms(result->timings.backward_ms);
      m->set_exposed_comm_ms(result->timings.exposed_comm_ms);
      m->set_optimizer_ms(result->timings.optimizer_ms);
      m->set_state_bytes(static_cast<int64_t>((*engine)->StateBytes()));
      auto answer = client_->ReportProgress(report);
      if (answer.ok() && !answer->continue_training()) {
        return absl::AbortedError("the coordinator ended the generation");
      }
    }
  }

  // The trained model, whole, written by rank 0 (every rank takes part in the gather).
  auto params = (*engine)->GatherParameters();
  if (!params.ok()) {
    ReportCollectiveError(params.status());
    return params.status();
  }
  if (rank_ != 0) return absl::OkStatus();
  const std::string dir = absl::StrCat(options_.output_dir, "/", job_id());
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = std::filesystem::absolute(dir + "/model.safetensors").string();
  if (absl::Status s = SaveModel(path, spec, *params); !s.ok()) {
    ReportError(s, true);
    return s;
  }
  weft::v1::ReportProgressRequest done;
  done.set_job_id(job_id());
  done.set_generation(generation());
  done.set_worker_id(options_.worker_id);
  done.set_rank(0);
  done.set_finished(true);
  done.set_model_path(path);
  auto answer = client_->ReportProgress(done);
  if (!answer.ok()) return answer.status();
  spdlog::info("job {} finished; model at {}", job_id(), path);
  return absl::OkStatus();
}

}  // namespace weft::worker
