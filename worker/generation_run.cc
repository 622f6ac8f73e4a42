#include "worker/generation_run.h"

#include <chrono>
#include <filesystem>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/remote_store.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/comm/communicator.h"
#include "worker/data/token_dataset.h"
#include "worker/model_io.h"
#include "worker/checkpointer.h"
#include "worker/zero_cpu.h"
#ifdef WEFT_WORKER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "worker/comm/nccl_communicator.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/zero_cuda.h"
#endif

namespace weft::worker {

GenerationRun::GenerationRun(const weft::v1::JoinJobCommand& command, const RunOptions& options,
                             CoordinatorClient* client, WorkerMetrics* metrics)
    : command_(command), options_(options), client_(client), metrics_(metrics),
      rank_(command.rank()) {}

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

absl::StatusOr<std::unique_ptr<comm::Communicator>> GenerationRun::CreateCommunicator(
    Store* store, int world) {
  if (options_.cuda_device >= 0) {
#ifdef WEFT_WORKER_HAVE_CUDA
    WEFT_RETURN_IF_ERROR(engine::cuda::CudaStatus(cudaSetDevice(options_.cuda_device),
                                                  "cudaSetDevice"));
    comm::NcclOptions nccl_options;
    nccl_options.device = options_.cuda_device;
    nccl_options.timeout_ms = options_.collective_timeout_ms;
    WEFT_ASSIGN_OR_RETURN(auto nccl,
                          comm::CreateNcclCommunicator(store, rank_, world, nccl_options));
    return std::unique_ptr<comm::Communicator>(std::move(nccl));
#else
    return absl::UnimplementedError("this weft-worker was built without CUDA");
#endif
  }
  comm::GlooOptions gloo_options;
  gloo_options.hostname = options_.data_address;
  gloo_options.timeout_ms = options_.collective_timeout_ms;
  return comm::CreateGlooCommunicator(store, rank_, world, gloo_options);
}

absl::StatusOr<std::unique_ptr<TrainingEngine>> GenerationRun::CreateEngine(
    const weft::v1::JobSpec& spec, comm::Communicator* comm) {
  if (options_.cuda_device >= 0) {
#ifdef WEFT_WORKER_HAVE_CUDA
    // CreateCommunicator made a CudaCommunicator for a CUDA run.
    WEFT_ASSIGN_OR_RETURN(auto engine, ZeroCudaEngine::Create(
                                           spec, static_cast<comm::CudaCommunicator*>(comm)));
    return std::unique_ptr<TrainingEngine>(std::move(engine));
#else
    return absl::UnimplementedError("this weft-worker was built without CUDA");
#endif
  }
  WEFT_ASSIGN_OR_RETURN(auto engine, ZeroCpuEngine::Create(spec, comm));
  return std::unique_ptr<TrainingEngine>(std::move(engine));
}

absl::StatusOr<int64_t> GenerationRun::RestoreLatest(TrainingEngine* engine,
                                                      comm::Communicator* comm, Store* store,
                                                      CheckpointClient* client) {
  // Rank 0 decides the candidates, so that every rank tries the same checkpoints in order.
  constexpr char kKey[] = "restore/candidates";
  std::string candidates;
  if (rank_ == 0) {
    std::vector<std::string> list;
    for (const std::string& job : {job_id(), command_.spec().resume_from_job()}) {
      if (job.empty()) continue;
      WEFT_ASSIGN_OR_RETURN(auto manifests, client->List(job));
      for (const auto& m : manifests) list.push_back(absl::StrCat(m.job_id(), " ", m.step()));
      if (!list.empty()) break;  // a job's own checkpoints win over the one it resumes from
    }
    candidates = absl::StrJoin(list, ",");
    WEFT_RETURN_IF_ERROR(store->Set(kKey, candidates));
  } else {
    WEFT_RETURN_IF_ERROR(store->Wait({kKey}, absl::Minutes(5)));
    WEFT_ASSIGN_OR_RETURN(candidates, store->Get(kKey));
  }
  std::string failures;
  for (absl::string_view candidate : absl::StrSplit(candidates, ',', absl::SkipEmpty())) {
    std::vector<std::string> parts = absl::StrSplit(candidate, ' ');
    int64_t step = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &step)) {
      return absl::InternalError(absl::StrCat("bad restore candidate \"", candidate, "\""));
    }
    const std::string& job = parts[0];
    absl::Status s = engine->Restore([&](const std::string& tensor, int64_t begin, int64_t end,
                                         float* out) {
      return client->ReadRange(job, step, tensor, begin, end, out);
    });
    // Every rank must restore the same checkpoint: one bad read anywhere rejects it for all.
    float bad = s.ok() ? 0.0f : 1.0f;
    WEFT_RETURN_IF_ERROR(comm->AllReduce(&bad, 1, comm::DataType::kFloat32)->Wait());
    if (bad == 0.0f) {
      spdlog::info("job {} generation {}: restored checkpoint {} step {}", job_id(),
                   generation(), job, step);
      return step;
    }
    spdlog::warn("job {}: checkpoint {} step {} cannot be restored ({}); trying an older one",
                 job_id(), job, step, s.ok() ? "another rank failed" : std::string(s.message()));
    absl::StrAppend(&failures, failures.empty() ? "" : "; ", job, " step ", step, ": ",
                    s.ok() ? "failed on another rank" : std::string(s.message()));
  }
  if (!failures.empty()) {
    return absl::DataLossError(absl::StrCat("no checkpoint could be restored: ", failures));
  }
  return 0;
}

void GenerationRun::Run() {
  metrics_->SetAssignment(job_id(), command_.rank());
  metrics_->SetBusy(true);
  absl::Status status = Train();
  metrics_->SetBusy(false);
  // A run that completed stays completed: once rank 0 reports the job finished, the
  // coordinator ends the generation and may tell a member still returning to abort it.
  if (status.ok()) {
    metrics_->CountRunEnd("completed");
  } else if (aborted_.load()) {
    absl::MutexLock lock(&mu_);
    spdlog::info("job {} generation {}: aborted: {}", job_id(), generation(),
                 std::string(abort_reason_.message()));
    metrics_->CountRunEnd("aborted");
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
  auto comm = CreateCommunicator(&store, world);
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

  auto engine = CreateEngine(spec, comm->get());
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

  // Checkpoints: resume from the newest restorable one; save every interval_steps.
  std::unique_ptr<CheckpointClient> checkpoints;
  std::unique_ptr<Checkpointer> checkpointer;
  int64_t start_step = 0;
  const int64_t checkpoint_interval = spec.checkpoint().interval_steps();
  if (!options_.checkpointd.empty()) {
    checkpoints = std::make_unique<CheckpointClient>(options_.checkpointd);
    auto restored = RestoreLatest(engine->get(), comm->get(), &store, checkpoints.get());
    if (!restored.ok()) {
      ReportError(restored.status(), restored.status().code() == absl::StatusCode::kDataLoss);
      return restored.status();
    }
    start_step = *restored;
    if (checkpoint_interval > 0) {
      checkpointer = std::make_unique<Checkpointer>(checkpoints.get(), &store, spec, job_id(),
                                                    rank_, world);
    }
  } else if (checkpoint_interval > 0 && rank_ == 0) {
    spdlog::warn("job {} asks for checkpoints but this worker has no --checkpointd; "
                 "training without them", job_id());
  }
  std::map<int64_t, double> stall_ms_by_step;
  // Rank 0 tells the coordinator about each commit with its next report.
  auto add_commit = [&](weft::v1::ReportProgressRequest* report) {
    if (!checkpointer) return;
    if (auto committed = checkpointer->TakeCommitted()) {
      report->set_checkpoint_step(committed->step);
      report->set_checkpoint_save_ms(committed->save_ms);
      metrics_->RecordCheckpointUpload(committed->save_ms);
      report->set_checkpoint_stall_ms(stall_ms_by_step[committed->step]);
    }
  };

  const int64_t total = spec.training().total_steps();
  const double tokens_per_step = static_cast<double>(world) * batch * seq_len *
                                 spec.training().grad_accum_steps();
  // MFU's numerator: FLOPs per token of the forward and backward passes (weights: 6 per
  // parameter; attention scores: 12 x layers x width x context).
  const auto& model = spec.model();
  const double flops_per_token =
      6.0 * static_cast<double>(ModelParameterCount(model)) +
      12.0 * model.num_layers() * model.hidden_size() * static_cast<double>(model.context_length());
  double val_loss = 0;
  step_ = start_step;
  for (int64_t step = start_step; step < total; ++step) {
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
    if (checkpointer && (step + 1) % checkpoint_interval == 0) {
      // The stall: copying this rank's state to host memory, plus waiting for the previous
      // upload. The upload itself overlaps the next steps.
      const auto start = std::chrono::steady_clock::now();
      auto snapshot = (*engine)->Snapshot();
      if (!snapshot.ok()) {
        ReportError(snapshot.status(), /*permanent=*/false);
        return snapshot.status();
      }
      checkpointer->Submit(step + 1, *std::move(snapshot));
      stall_ms_by_step[step + 1] = std::chrono::duration<double, std::milli>(
                                       std::chrono::steady_clock::now() - start)
                                       .count();
      metrics_->RecordCheckpointStall(stall_ms_by_step[step + 1]);
    }
    const double tokens_per_s = tokens_per_step / (result->timings.step_ms / 1000.0);
    const double mfu =
        options_.peak_flops > 0 ? tokens_per_s / world * flops_per_token / options_.peak_flops : 0;
    metrics_->RecordStep(step + 1, *result, tokens_per_s, mfu, (*engine)->StateBytes());
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
      m->set_mfu(mfu);
      m->set_step_ms(result->timings.step_ms);
      m->set_forward_ms(result->timings.forward_ms);
      m->set_backward_ms(result->timings.backward_ms);
      m->set_exposed_comm_ms(result->timings.exposed_comm_ms);
      m->set_optimizer_ms(result->timings.optimizer_ms);
      m->set_state_bytes(static_cast<int64_t>((*engine)->StateBytes()));
      m->set_engine_device_bytes(static_cast<int64_t>((*engine)->EngineDeviceBytes()));
      m->set_device_used_bytes(static_cast<int64_t>((*engine)->DeviceUsedBytes()));
      add_commit(&report);
      auto answer = client_->ReportProgress(report);
      if (answer.ok() && !answer->continue_training()) {
        return absl::AbortedError("the coordinator ended the generation");
      }
    }
  }

  // The last checkpoint commits before the job is declared done.
  if (checkpointer) checkpointer->Drain();

  // The trained model, whole, written by rank 0 (every rank takes part in the gather).
  auto params = (*engine)->GatherParameters();
  // A last barrier before any rank drops its communicator: a rank that closed its sockets
  // right after the gather could cut off a message a slower peer is still receiving.
  if (params.ok()) {
    if (absl::Status s = (*comm)->Barrier()->Wait(); !s.ok()) params = s;
  }
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
  add_commit(&done);
  auto answer = client_->ReportProgress(done);
  if (!answer.ok()) return answer.status();
  spdlog::info("job {} finished; model at {}", job_id(), path);
  return absl::OkStatus();
}

}  // namespace weft::worker
