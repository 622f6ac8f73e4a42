#include "worker/generation_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "client/remote_store.h"
#include "common/status.h"
#include "common/status_context.h"
#include "spdlog/spdlog.h"
#include "worker/sharding_auto.h"
#include "worker/zero/memory_plan.h"
#include "worker/mfu.h"
#include "worker/model_io/model_file.h"
#include "worker/step_failures.h"

namespace weft::worker {
namespace {

// How long a checkpoint's store call waits for an unreachable coordinator (a restart takes a
// few seconds; a loaded machine more), and how long rank 0 goes on sending its final report.
constexpr absl::Duration kCheckpointStoreWait = absl::Seconds(60);
constexpr absl::Duration kFinalReportPatience = absl::Minutes(2);

}  // namespace

class GenerationRun::AbortHook {
 public:
  AbortHook(GenerationRun* run, comm::Communicator* comm) : run_(run) {
    absl::MutexLock lock(&run_->mu_);
    run_->comm_ = comm;
    if (run_->aborted_.load()) comm->Abort(run_->abort_reason_);
  }
  // The communicator must not be used once the phase that owns it returns.
  ~AbortHook() {
    absl::MutexLock lock(&run_->mu_);
    run_->comm_ = nullptr;
  }

 private:
  GenerationRun* run_;
};

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

weft::v1::ReportProgressRequest GenerationRun::NewReport() const {
  weft::v1::ReportProgressRequest report;
  report.set_job_id(job_id());
  report.set_generation(generation());
  report.set_worker_id(options_.worker_id);
  report.set_rank(rank_);
  return report;
}

void GenerationRun::ReportError(const absl::Status& status, bool permanent) {
  if (aborted_.load()) return;  // the generation was ended for us; our failure is a symptom
  spdlog::error("job {} generation {} rank {}: {}", job_id(), generation(), rank_,
                std::string(status.message()));
  if (step_reports_ != nullptr) step_reports_->Flush();  // the steps it follows go first
  weft::v1::ReportProgressRequest report = NewReport();
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
  metrics_->SetAssignment(job_id(), command_.rank());
  metrics_->SetBusy(true);
  absl::Status status = Train();
  if (options_.test_teardown_delay_ms > 0) {
    spdlog::info("job {} generation {}: test-only teardown delay of {} ms", job_id(),
                 generation(), options_.test_teardown_delay_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(options_.test_teardown_delay_ms));
  }
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
  // The data is opened before the rendezvous, and what is wrong with it goes to Join: a
  // member that cannot read what its peers can is refused there, at no restart's cost.
  absl::StatusOr<Data> opened = OpenData();
  WEFT_ASSIGN_OR_RETURN(zero::ShardingGroups groups,
                        Join(opened.ok() ? "" : std::string(opened.status().message())));
  if (!opened.ok()) {
    // A coordinator that knows of data_error never completes such a rendezvous; an older one
    // does, and then this is the job's error.
    ReportError(opened.status(), /*permanent=*/true);
    return opened.status();
  }
  Data data = *std::move(opened);
  const int world = groups.world;
  WEFT_ASSIGN_OR_RETURN(const std::unique_ptr<hf::HfImporter> hf_init, OpenHfInit());
  // Collectives rendezvous through the coordinator's store for this generation (under the
  // communicator's own key prefix).
  RemoteStore store(client_->server(), job_id(), generation());
  std::string sharding_choice;
  BeforeEngine settle;
  if (spec.sharding().scope() == weft::v1::ShardingSpec::AUTO) {
    WEFT_ASSIGN_OR_RETURN(const AutoScope scope, ChooseScopeForAuto(&store, world));
    groups = scope.groups;
    settle = SettleAutoSpec(spec, scope, options_.peak_flops, &sharding_choice);
  }
  WEFT_ASSIGN_OR_RETURN(DeviceBackend backend, CreateBackend(&store, groups, settle));
  traffic_ = TrafficLinks(groups);
  ReportPlans(backend.engine->MemoryPlanNote(), sharding_choice);
  AbortHook hook(this, backend.comm.get());

  // Checkpoints: resume from the newest restorable one; save every interval_steps. Their
  // store calls run on the upload thread and wait out an outage of the coordinator (which
  // keeps the generation and its store over a restart) rather than give the save up.
  RemoteStore checkpoint_store(client_->server(), job_id(), generation(),
                               /*rpc_timeout=*/kCheckpointStoreWait,
                               /*reconnect_wait=*/kCheckpointStoreWait);
  std::unique_ptr<CheckpointClient> checkpoints;
  std::unique_ptr<Checkpointer> checkpointer;
  if (!options_.checkpointd.empty()) {
    checkpoints = std::make_unique<CheckpointClient>(options_.checkpointd);
    // With hybrid sharding group 0 holds the whole state (only it uploads), unless the
    // replicas share the optimizer out: the engine says.
    checkpointer = std::make_unique<Checkpointer>(
        checkpoints.get(), &checkpoint_store, spec,
        CheckpointRank{job_id(), generation(), rank_, world,
                       backend.engine->checkpoint_writers()},
        options_.checkpoint_timeouts);
  } else if (spec.checkpoint().interval_steps() > 0 && rank_ == 0) {
    spdlog::warn("job {} asks for checkpoints but this worker has no --checkpointd; "
                 "training without them", job_id());
  }
  WEFT_ASSIGN_OR_RETURN(const int64_t start_step,
                        Restore(checkpointer.get(), hf_init.get(), &backend));
  if (checkpointer != nullptr) {
    // The host's ranks each keep buffers: this rank's share of what is available.
    const absl::Status s =
        checkpointer->Prepare(*backend.engine, zero::HostAvailableBytes() / ranks_on_host_);
    if (s.code() == absl::StatusCode::kResourceExhausted) {
      ReportError(s, /*permanent=*/true);  // the same host will not have more next time
      return s;
    }
    // Otherwise not fatal: without prepared buffers the first save allocates them.
    if (!s.ok()) {
      spdlog::warn("job {}: checkpoint buffers not prepared: {}", job_id(), s.ToString());
    }
  }

  const Training training{world, &data, &backend, checkpointer.get()};
  WEFT_RETURN_IF_ERROR(StepLoop(start_step, training));
  return Finish(training);
}

absl::StatusOr<zero::ShardingGroups> GenerationRun::Join(const std::string& data_error) {
  const weft::v1::ShardingSpec& sharding = command_.spec().sharding();
  weft::v1::JoinRequest join;
  join.set_data_error(data_error);
  join.set_job_id(job_id());
  join.set_generation(generation());
  join.set_worker_id(options_.worker_id);
  join.set_incarnation(options_.incarnation);
  // The peers' hosts, for HOST's groups and AUTO's choice: every rank gets all of them, so a
  // WORLD or GROUP job of thousands of ranks does without.
  join.set_include_peers(sharding.scope() == weft::v1::ShardingSpec::HOST ||
                         sharding.scope() == weft::v1::ShardingSpec::AUTO);
  auto joined = client_->Join(join, absl::Milliseconds(options_.rendezvous_timeout_ms));
  if (!joined.ok()) {
    if (joined.status().code() != absl::StatusCode::kAborted) ReportError(joined.status(), false);
    return joined.status();
  }
  rank_ = joined->rank();
  // An older coordinator leaves it 0: then this rank counts alone.
  ranks_on_host_ = std::max(1, joined->local_world_size());
  spdlog::info("job {} generation {}: rank {} of {}", job_id(), generation(), rank_,
               joined->world_size());
  rank_hosts_ = zero::RankHosts(*joined);
  std::vector<std::string> hosts = rank_hosts_;
  if (rank_hosts_.size() != static_cast<size_t>(joined->world_size())) rank_hosts_.clear();
  // AUTO chooses once the generation's store can carry the ranks' verdicts (Train).
  if (sharding.scope() == weft::v1::ShardingSpec::WORLD ||
      sharding.scope() == weft::v1::ShardingSpec::AUTO) {
    return zero::ShardingGroups::Full(joined->world_size());
  }
  // GROUP needs only the count; HOST gets the peers it asked for.
  if (sharding.scope() == weft::v1::ShardingSpec::GROUP) hosts.resize(joined->world_size());
  auto groups = zero::ResolveShardingGroups(sharding, hosts);
  if (!groups.ok()) {
    // Not permanent: the placement is this generation's, and the next one may be placed on
    // other workers; a job that keeps landing on uneven hosts spends its restart budget.
    ReportError(groups.status(), /*permanent=*/false);
    return groups.status();
  }
  spdlog::info("job {} generation {}: hybrid sharding, {} replicas of {} ranks", job_id(),
               generation(), groups->replicas(), groups->group_size);
  return *groups;
}

absl::StatusOr<GenerationRun::Data> GenerationRun::OpenData() {
  // The data is checked before any collective: a bad file fails the job, not a timeout.
  const weft::v1::JobSpec& spec = command_.spec();
  const data::TokenDataset::Options options{spec.model().vocab_size(),
                                             spec.training().sequence_length(),
                                             spec.training().grad_accum_steps()};
  Data data;
  WEFT_ASSIGN_OR_RETURN(data.train,
                        data::TokenDataset::Open(spec.data(), options, data::Split::kTrain));
  if (spec.training().val_interval_steps() > 0) {
    WEFT_ASSIGN_OR_RETURN(data.val,
                          data::TokenDataset::Open(spec.data(), options, data::Split::kVal));
  }
  // Read now, though only rank 0 writes it at the end: a missing or changed tokenizer fails the
  // job before it trains, not after.
  WEFT_ASSIGN_OR_RETURN(data.tokenizer, model_io::LoadJobTokenizer(spec));
  WEFT_ASSIGN_OR_RETURN(data.chat_template, model_io::LoadJobChatTemplate(spec));
  return data;
}

absl::StatusOr<AutoScope> GenerationRun::ChooseScopeForAuto(Store* store, int world) {
  DeviceOptions device = options_.device;
  device.ranks_on_host = ranks_on_host_;
  // Without the peers' hosts (an older coordinator) every rank counts as on one host: WORLD.
  std::vector<std::string> hosts = rank_hosts_;
  if (hosts.empty()) hosts.assign(world, "");
  auto scope = ChooseAutoScope(store, rank_, hosts, command_.spec(), device,
                               absl::Milliseconds(options_.rendezvous_timeout_ms));
  if (!scope.ok()) ReportCollectiveError(scope.status());
  if (scope.ok()) {
    spdlog::info("job {} generation {}: sharding AUTO: {}", job_id(), generation(),
                 scope->reason);
  }
  return scope;
}

void GenerationRun::ReportPlans(const std::string& memory_plan,
                                const std::string& sharding_choice) {
  if (rank_ != 0 || (memory_plan.empty() && sharding_choice.empty())) return;
  if (!memory_plan.empty()) {
    spdlog::info("job {} generation {}: {}", job_id(), generation(), memory_plan);
  }
  if (!sharding_choice.empty()) {
    spdlog::info("job {} generation {}: sharding: {}", job_id(), generation(), sharding_choice);
  }
  weft::v1::ReportProgressRequest report = NewReport();
  report.set_memory_plan(memory_plan);
  report.set_sharding_choice(sharding_choice);
  // Only informative: a lost report must not stop training.
  if (auto sent = client_->ReportProgress(report); !sent.ok()) {
    spdlog::warn("job {}: memory plan not reported: {}", job_id(), sent.status().ToString());
  }
}

GenerationRun::Links GenerationRun::TrafficLinks(const zero::ShardingGroups& groups) const {
  // A communicator spans hosts when its ranks are on more than one. Without the peers' hosts
  // (WORLD and GROUP do not ask for them), hosts are runs of ranks_on_host_ consecutive ranks:
  // the coordinator numbers a host's ranks together, and a job's hosts usually run as many.
  const auto host_of = [&](int r) -> std::string {
    if (!rank_hosts_.empty()) return rank_hosts_[r];
    return std::to_string(r / ranks_on_host_);
  };
  const auto spans = [&](int first, int count, int stride) {
    for (int i = 1; i < count; ++i) {
      const int r = first + i * stride;
      if (r < groups.world && host_of(r) != host_of(first)) return true;
    }
    return false;
  };
  Links links;
  const int group_first = groups.group(rank_) * groups.group_size;
  links.shards_span_hosts = spans(group_first, groups.group_size, 1);
  links.replica_spans_hosts =
      groups.hybrid() && spans(groups.position(rank_), groups.replicas(), groups.group_size);
  return links;
}

absl::StatusOr<DeviceBackend> GenerationRun::CreateBackend(Store* store,
                                                          const zero::ShardingGroups& groups,
                                                          const BeforeEngine& settle) {
  BackendPart failed = BackendPart::kCommunicator;
  DeviceOptions device = options_.device;
  device.ranks_on_host = ranks_on_host_;
  auto backend =
      CreateDeviceBackend(device, store, rank_, groups, command_.spec(), &failed, settle);
  if (!backend.ok()) {
    // A communicator that cannot connect usually means a peer is gone: the coordinator decides.
    // An engine that cannot be built for this spec will not be on a retry either.
    if (failed == BackendPart::kEngine) {
      ReportError(backend.status(), /*permanent=*/true);
    } else {
      ReportCollectiveError(backend.status());
    }
  }
  return backend;
}

absl::StatusOr<std::unique_ptr<hf::HfImporter>> GenerationRun::OpenHfInit() {
  const weft::v1::JobSpec& spec = command_.spec();
  if (spec.init_from_hf_dir().empty()) return std::unique_ptr<hf::HfImporter>();
  auto importer = hf::HfImporter::Open(spec.init_from_hf_dir(), spec.model());
  if (!importer.ok()) {
    const absl::Status s = Annotate(importer.status(), "init_from_hf_dir");
    ReportError(s, /*permanent=*/true);
    return s;
  }
  return std::move(*importer);
}

absl::StatusOr<int64_t> GenerationRun::Restore(Checkpointer* checkpointer,
                                               const hf::HfImporter* hf_init,
                                               DeviceBackend* backend) {
  weft::v1::GenerationStart start;
  if (checkpointer != nullptr) {
    auto restored = checkpointer->RestoreLatest(backend->engine.get(), backend->comm.get());
    if (!restored.ok()) {
      const absl::StatusCode code = restored.status().code();
      ReportError(restored.status(), code == absl::StatusCode::kDataLoss ||
                                         code == absl::StatusCode::kFailedPrecondition);
      return restored.status();
    }
    start.set_restored_step(restored->step);
    start.set_restored_job(restored->job);
    start.set_restored_world_size(restored->world_size);
  } else if (!command_.spec().resume_from_job().empty()) {
    const absl::Status s = absl::FailedPreconditionError(absl::StrCat(
        "resume_from_job: this worker has no checkpointd (--checkpointd or WEFT_CHECKPOINTD) "
        "to read job ", command_.spec().resume_from_job(), "'s checkpoint from"));
    ReportError(s, /*permanent=*/true);
    return s;
  }
  const int64_t step = start.restored_step();
  // A checkpoint of the job's own wins: the Hugging Face weights are only where it starts.
  if (step == 0) {
    std::string why = checkpointer == nullptr ? "no checkpointd"
                                              : absl::StrCat("no checkpoint of job ", job_id());
    start.set_fresh_from(hf_init != nullptr
                             ? absl::StrCat("the Hugging Face weights of ",
                                            command_.spec().init_from_hf_dir(), " (", why, ")")
                             : absl::StrCat("seed ", command_.spec().training().seed(), " (",
                                            why, ")"));
    if (hf_init != nullptr) WEFT_RETURN_IF_ERROR(ImportHf(*hf_init, backend));
  }
  if (rank_ == 0) {
    weft::v1::ReportProgressRequest report = NewReport();
    *report.mutable_start() = start;
    // Only informative: a lost report must not stop training.
    if (auto sent = client_->ReportProgress(report); !sent.ok()) {
      spdlog::warn("job {}: generation start not reported: {}", job_id(),
                   sent.status().ToString());
    }
  }
  return step;
}

absl::Status GenerationRun::ImportHf(const hf::HfImporter& importer, DeviceBackend* backend) {
  // Weights only: the importer's m and v are zeros, and AdamW starts from its first update.
  absl::Status s = backend->engine->Restore(importer.Reader(), /*optimizer_steps=*/0);
  s = Annotate(s, "init_from_hf_dir");
  float bad = s.ok() ? 0.0f : 1.0f;
  const absl::Status reduced =
      backend->comm->AllReduce(&bad, 1, comm::DataType::kFloat32)->Wait();
  if (!reduced.ok()) {
    ReportCollectiveError(reduced);
    return reduced;
  }
  if (!s.ok()) {
    // The same files fail the same way on a retry.
    ReportError(s, /*permanent=*/true);
    return s;
  }
  // The failing rank reports; this one only stops.
  if (bad != 0.0f) return absl::AbortedError("the Hugging Face import failed on another rank");
  spdlog::info("job {} rank {}: imported {} ({} tensor bytes read)", job_id(), rank_,
               importer.checkpoint().dir(), importer.checkpoint().bytes_read());
  return absl::OkStatus();
}

absl::Status GenerationRun::StepLoop(int64_t start_step, const Training& training) {
  const weft::v1::JobSpec& spec = command_.spec();
  const int world = training.world;
  const int batch = spec.training().micro_batch_size();
  const uint64_t seed = spec.training().seed();
  data::TokenDataset* train = training.data->train.get();
  zero::BatchFn train_batch = [&](int64_t step, int micro, const zero::MicroBatch& mb) {
    train->Batch(seed, step, micro, rank_, world, batch, mb.inputs, mb.targets, mb.doc_starts);
  };
  zero::TrainingEngine& engine = *training.backend->engine;
  const int64_t total = spec.training().total_steps();
  const double tokens_per_step = static_cast<double>(world) * batch *
                                 spec.training().sequence_length() *
                                 spec.training().grad_accum_steps();
  const double flops_per_token = TrainingFlopsPerToken(spec.model());
  double val_loss = 0;
  step_ = start_step;
  // Every rank sees the same global norm, so all of them skip, and give up, at the same step.
  SkippedRun skipped;
  const int32_t max_skipped = command_.spec().fault().max_skipped_steps();
  std::optional<StepReports> reports;
  if (rank_ == 0) {
    reports.emplace([this](const weft::v1::ReportProgressRequest& report) {
      return client_->ReportProgress(report);
    });
  }
  step_reports_ = reports ? &*reports : nullptr;
  // Reports still queued go out before the loop's end (the destructor), except once the
  // generation is over: nobody reads them then.
  const absl::Cleanup done = [&] {
    step_reports_ = nullptr;
    if (reports && (aborted_.load() || reports->stopped())) reports->Discard();
  };
  const auto ended = [&] { return reports && reports->stopped(); };
  for (int64_t step = start_step; step < total; ++step) {
    if (aborted_.load()) return absl::AbortedError("aborted");
    if (ended()) return absl::AbortedError("the coordinator ended the generation");
    const Traffic before = TrafficSoFar(*training.backend);
    auto result = engine.TrainStep(step, train_batch);
    if (!result.ok()) return StepFailed(step, result.status());
    const Traffic sent = TrafficSoFar(*training.backend) - before;
    metrics_->CountCollectiveBytes(sent.intra_host, sent.inter_host);
    if (!std::isfinite(result->grad_norm)) {
      spdlog::warn("job {} rank {}: step {} skipped: the gradient is not finite (loss {})",
                   job_id(), rank_, step + 1, result->loss);
    }
    if (absl::Status s = AfterStep(step, result->grad_norm, max_skipped, &skipped); !s.ok()) {
      ReportError(s, /*permanent=*/true);
      return s;
    }
    step_ = step + 1;
    WEFT_ASSIGN_OR_RETURN(val_loss, MaybeValidate(step + 1, training, val_loss));
    WEFT_RETURN_IF_ERROR(MaybeSave(step + 1, training));
    const double tokens_per_s = tokens_per_step / (result->timings.step_ms / 1000.0);
    const double mfu = Mfu(tokens_per_s / world, flops_per_token, options_.peak_flops);
    metrics_->RecordStep(step + 1, *result, tokens_per_s, mfu, engine.StateBytes());
    if (reports) {
      ReportStep(step + 1, *result, tokens_per_s, mfu, val_loss, sent, training, &*reports);
    } else {
      // Rank 0's step reports carry its own failed saves; the other ranks report theirs.
      ReportCheckpointFailure(training.checkpointer);
    }
  }
  if (reports) reports->Flush();
  if (ended()) return absl::AbortedError("the coordinator ended the generation");
  return absl::OkStatus();
}

absl::Status GenerationRun::StepFailed(int64_t step, const absl::Status& error) {
  const absl::Status s = Annotate(error, absl::StrCat("step ", step));
  if (IsDeterministicStepError(s)) {
    ReportError(s, /*permanent=*/true);
  } else {
    ReportCollectiveError(s);
  }
  return s;
}

absl::Status GenerationRun::MaybeSave(int64_t completed, const Training& training) {
  if (training.checkpointer == nullptr) return absl::OkStatus();
  const absl::StatusOr<bool> save =
      training.checkpointer->ShouldSave(completed, training.backend->comm.get());
  if (!save.ok()) {  // its all-reduce failed: a peer is gone, as for a failed step
    ReportCollectiveError(save.status());
    return save.status();
  }
  if (!*save) return absl::OkStatus();
  const absl::StatusOr<double> stall_ms =
      training.checkpointer->Save(completed, *training.backend->engine);
  if (!stall_ms.ok()) {
    ReportError(stall_ms.status(), /*permanent=*/false);
    return stall_ms.status();
  }
  metrics_->RecordCheckpointStall(*stall_ms);
  return absl::OkStatus();
}

absl::StatusOr<double> GenerationRun::MaybeValidate(int64_t completed, const Training& training,
                                                    double val_loss) {
  const weft::v1::TrainingSpec& spec = command_.spec().training();
  const int64_t interval = spec.val_interval_steps();
  data::TokenDataset* val = training.data->val.get();
  if (val == nullptr || interval <= 0 ||
      (completed % interval != 0 && completed != spec.total_steps())) {
    return val_loss;
  }
  const int world = training.world;
  // Validation always reads the same batches, so successive losses compare.
  zero::BatchFn val_batch = [&](int64_t, int micro, const zero::MicroBatch& mb) {
    val->Batch(spec.seed(), 0, micro, rank_, world, spec.micro_batch_size(), mb.inputs, mb.targets,
               mb.doc_starts);
  };
  auto v = training.backend->engine->EvalLoss(spec.val_batches(), val_batch);
  if (!v.ok()) {
    ReportCollectiveError(v.status());
    return v.status();
  }
  metrics_->RecordValidation(*v);
  return *v;
}

GenerationRun::Traffic GenerationRun::TrafficSoFar(const DeviceBackend& backend) const {
  Traffic t;
  const auto add = [&](const comm::Communicator* c, bool spans_hosts) {
    if (c != nullptr) (spans_hosts ? t.inter_host : t.intra_host) += c->sent_bytes();
  };
  add(backend.shards, traffic_.shards_span_hosts);
  add(backend.replica, traffic_.replica_spans_hosts);
  return t;
}

void GenerationRun::ReportStep(int64_t completed, const zero::StepResult& result,
                               double tokens_per_s, double mfu, double val_loss,
                               const Traffic& sent, const Training& training,
                               StepReports* reports) {
  const zero::TrainingEngine& engine = *training.backend->engine;
  weft::v1::ReportProgressRequest report = NewReport();
  auto* m = report.mutable_metrics();
  m->set_step(completed);
  m->set_loss(result.loss);
  m->set_val_loss(val_loss);
  m->set_learning_rate(result.learning_rate);
  m->set_grad_norm(result.grad_norm);
  m->set_tokens_per_s(tokens_per_s);
  m->set_mfu(mfu);
  m->set_step_ms(result.timings.step_ms);
  m->set_forward_ms(result.timings.forward_ms);
  m->set_backward_ms(result.timings.backward_ms);
  m->set_exposed_comm_ms(result.timings.exposed_comm_ms);
  m->set_optimizer_ms(result.timings.optimizer_ms);
  m->set_state_bytes(static_cast<int64_t>(engine.StateBytes()));
  m->set_engine_device_bytes(static_cast<int64_t>(engine.EngineDeviceBytes()));
  m->set_device_used_bytes(static_cast<int64_t>(engine.DeviceUsedBytes()));
  m->set_intra_host_bytes(sent.intra_host);
  m->set_inter_host_bytes(sent.inter_host);
  AddCheckpointOutcome(training.checkpointer, &report);
  reports->Send(std::move(report));
}

bool GenerationRun::AddCheckpointOutcome(Checkpointer* checkpointer,
                                         weft::v1::ReportProgressRequest* report) {
  if (checkpointer == nullptr) return false;
  if (auto committed = checkpointer->TakeCommitted()) {
    report->set_checkpoint_step(committed->step);
    report->set_checkpoint_save_ms(committed->save_ms);
    metrics_->RecordCheckpointUpload(committed->save_ms);
    report->set_checkpoint_stall_ms(committed->stall_ms);
  }
  auto failed = checkpointer->TakeFailed();
  if (!failed) return false;
  metrics_->CountCheckpointFailure();
  report->set_checkpoint_failed_step(failed->step);
  report->set_checkpoint_failure(failed->reason);
  return true;
}

void GenerationRun::ReportCheckpointFailure(Checkpointer* checkpointer) {
  weft::v1::ReportProgressRequest report = NewReport();
  if (!AddCheckpointOutcome(checkpointer, &report)) return;
  // Best effort: a coordinator that cannot be reached now has the worker's log.
  (void)client_->ReportProgress(report);
}

absl::Status GenerationRun::GatherModel(zero::TrainingEngine* engine,
                                        model_io::ModelFileWriter* file, absl::Status* written) {
  for (int u = 0; u < engine->arch().NumUnits(); ++u) {
    WEFT_ASSIGN_OR_RETURN(const std::vector<float> unit, engine->GatherUnit(u));
    // After a failed write the other ranks still wait for this one in every gather.
    if (file != nullptr && written->ok()) *written = file->WriteUnit(u, unit);
  }
  return absl::OkStatus();
}

absl::Status GenerationRun::Finish(const Training& training) {
  // The last checkpoint commits before the job is declared done; a save deferred behind an
  // upload is taken now, so a job continued later resumes from its last step.
  if (training.checkpointer != nullptr) {
    const absl::StatusOr<bool> saved =
        training.checkpointer->SaveDeferred(step_.load(), *training.backend->engine);
    if (!saved.ok()) {
      ReportError(saved.status(), /*permanent=*/false);
      return saved.status();
    }
  }

  // Rank 0 writes the trained model while every rank gathers it, a unit at a time.
  std::string path;
  std::unique_ptr<model_io::ModelFileWriter> file;
  absl::Status written;
  if (rank_ == 0) {
    const std::string dir = absl::StrCat(options_.output_dir, "/", job_id());
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    path = std::filesystem::absolute(dir + "/model.safetensors").string();
    auto metadata = model_io::ModelFileMetadata(training.data->tokenizer.get(),
                                                command_.spec().model().vocab_size(),
                                                training.data->chat_template);
    if (!metadata.ok()) {
      written = metadata.status();
    } else if (auto begun = model_io::ModelFileWriter::Begin(path, command_.spec(), *metadata);
               begun.ok()) {
      file = std::move(*begun);
    } else {
      written = begun.status();
    }
  }
  absl::Status gathered = GatherModel(training.backend->engine.get(), file.get(), &written);
  // A last barrier before any rank drops its communicator: a rank that closed its sockets
  // right after the gather could cut off a message a slower peer is still receiving.
  if (gathered.ok()) gathered = training.backend->comm->Barrier()->Wait();
  if (!gathered.ok()) {
    ReportCollectiveError(gathered);
    return gathered;
  }
  if (rank_ != 0) {
    ReportCheckpointFailure(training.checkpointer);
    return absl::OkStatus();
  }
  if (written.ok()) written = file->Commit();
  if (!written.ok()) {
    ReportError(written, true);
    return written;
  }
  weft::v1::ReportProgressRequest done = NewReport();
  done.set_finished(true);
  done.set_model_path(path);
  AddCheckpointOutcome(training.checkpointer, &done);
  auto answer = client_->ReportProgress(done);
  // UNAVAILABLE: the coordinator is away (a restart keeps this generation) or could not store
  // the job's success yet. Either way the trained model must not go unreported.
  for (const absl::Time give_up = absl::Now() + kFinalReportPatience;
       absl::IsUnavailable(answer.status()) && absl::Now() < give_up && !aborted_.load();) {
    spdlog::warn("job {}: final report not acknowledged ({}); sending it again",
                 job_id(), std::string(answer.status().message()));
    absl::SleepFor(absl::Seconds(1));
    answer = client_->ReportProgress(done);
  }
  if (!answer.ok()) return answer.status();
  spdlog::info("job {} finished; model at {}", job_id(), path);
  return absl::OkStatus();
}

}  // namespace weft::worker
