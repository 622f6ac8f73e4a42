// The coordinator's handling of ranks' reports (Coordinator::ReportProgress): rank 0's step
// metrics, checkpoints, where the generation's state came from and the job's end; any rank's
// error, with what it means for the job (a restart, a setup failure placed anew, a permanent
// failure) and for the worker (blame, quarantine).
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_spec.h"
#include "common/status.h"
#include "common/status_context.h"
#include "common/time_util.h"
#include "coordinator/coordinator.h"

namespace weft::coordinator {

namespace {

// "7.4 ms" below a second, "2.31 s" from there.
std::string FormatMs(double ms) {
  return ms < 1000 ? absl::StrFormat("%.1f ms", ms) : absl::StrFormat("%.2f s", ms / 1000);
}

// What the CHECKPOINT_COMMITTED event says: the stall, and rank 0's upload with its rate.
// The report carries no byte count: rank 0's is CheckpointRankBytes.
std::string CheckpointCommittedMessage(const weft::v1::ReportProgressRequest& request,
                                       const weft::v1::JobSpec& spec, int32_t world) {
  const double bytes = static_cast<double>(CheckpointRankBytes(spec.model(), world));
  const std::string size = bytes < 1e9 ? absl::StrFormat("%.1f MB", bytes / 1e6)
                                       : absl::StrFormat("%.2f GB", bytes / 1e9);
  const double save_ms = request.checkpoint_save_ms();
  // save_ms runs to the commit: past world 1 it includes waiting for the slowest rank.
  std::string rate;
  if (save_ms > 0) rate = absl::StrFormat(" (%.2f GB/s)", bytes / save_ms / 1e6);
  return absl::StrCat("checkpoint at step ", request.checkpoint_step(),
                      " committed: training stalled ", FormatMs(request.checkpoint_stall_ms()),
                      "; rank 0 uploaded ", size, " and committed in ", FormatMs(save_ms), rate);
}

}  // namespace

absl::StatusOr<weft::v1::ReportProgressResponse> Coordinator::ReportProgress(
    const weft::v1::ReportProgressRequest& request) {
  Actions actions;
  absl::MutexLock lock(&mu_);
  weft::v1::ReportProgressResponse response;
  auto found = jobs_.Find(request.job_id());
  if (!found.ok()) return found.status();
  JobRecord& rec = **found;
  Generation* gen = rec.ActiveGeneration(request.generation());
  if (gen == nullptr) {
    response.set_continue_training(false);
    return response;
  }
  if (gen->RankOf(request.worker_id()) != request.rank()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker ", request.worker_id(), " is not rank ", request.rank(),
                     " of generation ", gen->number(), " of job ", request.job_id()));
  }
  const bool rank0 = request.rank() == 0;  // other ranks' metrics are not the job's
  const bool ends = !request.error().empty() || (request.finished() && rank0);
  // Rank 0's final report is acknowledged only once the job's success is stored: refused
  // (UNAVAILABLE) otherwise, with the job as it was, so that rank 0 sends it again rather than
  // leave a job that a restarted coordinator would train again. Other reports need no ack of
  // the write: their changes are written through Commit (and retried while it fails).
  const bool finishes = ends && request.error().empty();
  if (finishes) jobs_.BeginChange(rec);
  if (!request.error().empty()) {
    RankErrorLocked(rec, request, actions);
  } else {
    if (request.has_metrics() && rank0) RecordStepLocked(rec, request);
    if (!request.memory_plan().empty() && rank0) {
      jobs_.AddEvent(rec, weft::v1::MEMORY_PLANNED, request.memory_plan());
    }
    if (!request.sharding_choice().empty() && rank0) {
      jobs_.AddEvent(rec, weft::v1::SHARDING_CHOSEN, request.sharding_choice());
    }
    if (request.has_start() && rank0) RecordStartLocked(rec, request.start(), actions);
    if (request.checkpoint_step() > 0 && rank0 &&
        request.checkpoint_step() > rec.job.status().checkpoint_step()) {
      RecordCheckpointLocked(rec, request, actions);
    }
    if (!request.checkpoint_failure().empty() &&
        gen->FirstReportOfFailedCheckpoint(request.checkpoint_failed_step())) {
      // Whichever rank reports first: a rank's own upload can fail while rank 0's commit only
      // times out, and rank 0's report names the failed rank's reason when it knows it.
      jobs_.AddEvent(rec, weft::v1::CHECKPOINT_FAILED,
                     absl::StrCat("checkpoint at step ", request.checkpoint_failed_step(),
                                  " not saved by rank ", request.rank(), " (worker ",
                                  request.worker_id(), "): ", request.checkpoint_failure()));
    }
    if (ends) {
      WEFT_RETURN_IF_ERROR_CONTEXT(
          FinishJobLocked(rec, request, actions),
          absl::StrCat("job ", rec.id(), ": the final report could not be stored"));
    } else {
      jobs_.CommitIfDue(rec, actions);
    }
  }
  if (ends) ScheduleLocked(actions);
  response.set_continue_training(!ends);
  return response;
}

void Coordinator::RankErrorLocked(JobRecord& rec, const weft::v1::ReportProgressRequest& request,
                                  Actions& actions) {
  metrics_.CountFailure("rank_error");
  const RepeatDecision repeat =
      DecideRepeatedRankError(rec.last_rank_error, rec.last_rank_error_worker, request.error(),
                              request.worker_id());
  rec.last_rank_error = request.error();
  rec.last_rank_error_worker = request.worker_id();
  std::string cause = absl::StrCat("rank ", request.rank(), " (worker ", request.worker_id(),
                                   "): ", request.error());
  if (repeat.repeated) absl::StrAppend(&cause, " (", repeat.reason, ")");
  const bool permanent = request.error_is_permanent() || repeat.repeated;
  const SetupFailureDecision setup = DecideSetupFailure(SetupViewLocked(rec, request, permanent));
  if (setup.setup) absl::StrAppend(&cause, " (", setup.reason, ")");
  if (setup.free) {
    ++rec.free_setup_failures;
    if (std::optional<std::string> why = workers_.QuarantineNow(request.worker_id(), cause)) {
      jobs_.AddEvent(rec, weft::v1::WORKER_QUARANTINED, *why);
    }
  }
  FailGenerationLocked(rec, cause, permanent, weft::v1::RANK_ERROR, actions,
                       /*spends_restart=*/!setup.free);
  // A deterministic failure says nothing about the worker it happened on.
  if (!permanent && !setup.free) BlameWorkerLocked(request.worker_id(), rec, request.error());
}

void Coordinator::RecordStartLocked(JobRecord& rec, const weft::v1::GenerationStart& start,
                                    Actions& actions) {
  const int32_t world = rec.generation ? rec.generation->world_size() : 0;
  if (start.restored_step() > 0) {
    jobs_.AddEvent(rec, weft::v1::CHECKPOINT_RESTORED,
                   absl::StrCat("restored step ", start.restored_step(), " from job ",
                                start.restored_job(), " (world ", start.restored_world_size(),
                                " -> ", world, ")"));
  } else {
    jobs_.AddEvent(rec, weft::v1::STARTED_FRESH,
                   absl::StrCat("started fresh at step 0 from ", start.fresh_from()));
  }
  jobs_.Commit(rec, actions);
}

SetupFailureView Coordinator::SetupViewLocked(const JobRecord& rec,
                                              const weft::v1::ReportProgressRequest& request,
                                              bool permanent) {
  const Generation& gen = *rec.generation;
  const weft::v1::JobSpec& spec = rec.job.spec();
  SetupFailureView view;
  view.worker_id = request.worker_id();
  view.trained = gen.trained();
  view.permanent = permanent;
  view.min_workers = spec.resources().min_workers();
  view.free_so_far = rec.free_setup_failures;
  // Setting the worker aside is what changes the placement: without quarantine, nothing would.
  view.max_free = options_.quarantine_after_failures > 0 ? spec.fault().max_restarts() : 0;
  std::vector<IdleWorkerView> healthy, quarantined;
  workers_.IdleViews(&healthy, &quarantined);
  view.others_available = gen.world_size() - 1;
  for (const IdleWorkerView& w : healthy) {
    if (w.device_kind == spec.resources().device_kind()) ++view.others_available;
  }
  return view;
}

void Coordinator::RecordStepLocked(JobRecord& rec, const weft::v1::ReportProgressRequest& request) {
  rec.generation->MarkTrained();
  auto* status = rec.status();
  if (request.metrics().step() > status->step()) {
    rec.generation->MarkProgress(Now());
    // The generation trains: its members are not failing repeatedly.
    workers_.ClearFailures(rec.generation->members());
  }
  status->set_step(std::max(status->step(), request.metrics().step()));
  *status->mutable_last_metrics() = request.metrics();
  metrics_.SetStepMetrics(request.job_id(), status->step(), request.metrics());
  ToProtoTime(Now(), status->mutable_last_metrics()->mutable_time());
}

void Coordinator::RecordCheckpointLocked(JobRecord& rec,
                                         const weft::v1::ReportProgressRequest& request,
                                         Actions& actions) {
  auto* status = rec.status();
  status->set_checkpoint_step(request.checkpoint_step());
  status->set_checkpoint_stall_ms(request.checkpoint_stall_ms());
  status->set_checkpoint_save_ms(request.checkpoint_save_ms());
  metrics_.SetCheckpointTimes(request.job_id(), request.checkpoint_stall_ms(),
                              request.checkpoint_save_ms(), Now());
  jobs_.AddEvent(rec, weft::v1::CHECKPOINT_COMMITTED,
                 CheckpointCommittedMessage(request, rec.job.spec(),
                                            rec.generation ? rec.generation->world_size() : 1));
  jobs_.Commit(rec, actions);
}

absl::Status Coordinator::FinishJobLocked(JobRecord& rec,
                                          const weft::v1::ReportProgressRequest& request,
                                          Actions& actions) {
  auto* status = rec.status();
  if (!request.model_path().empty()) {
    status->set_model_path(request.model_path());
    if (const weft::v1::WorkerInfo* info = workers_.Info(request.worker_id())) {
      status->set_model_host(info->host());
    }
  }
  // Rank 0 reports the finish only after the last step: the step reports before it may have
  // been lost (the coordinator away), the steps were not.
  status->set_step(status->total_steps());
  RecordGenerationEndLocked(rec, "completed");
  jobs_.SetState(rec, weft::v1::SUCCEEDED,
                 absl::StrCat("completed ", status->step(), " of ", status->total_steps(),
                              " steps"));
  WEFT_RETURN_IF_ERROR(jobs_.CommitChange(rec, actions));
  ReleaseGenerationLocked(rec, "completed", /*completed=*/true, actions);
  return absl::OkStatus();
}

}  // namespace weft::coordinator
