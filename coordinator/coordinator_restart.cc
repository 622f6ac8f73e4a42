// What a restart of the coordinator process keeps: the generations that were training.
//
// Workers train on without the coordinator (their collectives run peer to peer), so an outage
// need not cost a step. The job table holds each RUNNING job's generation number, its members in
// rank order and whether its rendezvous completed, and its store's keys are written through to
// the state database. A new process rebuilds such a generation (KeepGenerationLocked); its
// members find themselves unknown at their next heartbeat, register again stating the
// generation they train in, and attach to it (ReattachLocked, AttachLocked). A member that does
// not come back within the window, or comes back as a new process, ends the generation; that
// spends no restart, as when the whole cluster restarted: the coordinator cannot tell whether
// the member died with it.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/coordinator.h"
#include "spdlog/spdlog.h"

namespace weft::coordinator {

bool Coordinator::KeepGenerationLocked(JobRecord& rec, Actions& actions) {
  weft::v1::JobStatus* status = rec.status();
  const int64_t number = status->generation();
  if (!status->rendezvous_complete() || status->worker_ids().empty()) {
    // Its members were still gathering; their Joins were parked in the previous process. Not
    // the job's fault, so no restart is used.
    jobs_.SetState(rec, weft::v1::RECOVERING,
                   absl::StrCat("coordinator restarted; generation ", number,
                                " abandoned before its rendezvous completed"));
    status->clear_worker_ids();
    jobs_.Commit(rec, actions);
    return false;
  }
  const int64_t window_ms = ReattachWindowMs(rec.job.spec().fault().heartbeat_timeout_ms());
  const absl::Time now = Now();
  std::vector<std::string> members(status->worker_ids().begin(), status->worker_ids().end());
  auto store = std::make_shared<MemoryStore>(jobs_.LoadStore(rec.id(), number),
                                             jobs_.StoreJournal(rec.id(), number));
  const size_t keys = store->size();
  rec.generation = Generation::Restored(number, std::move(members), std::move(store), now,
                                        now + absl::Milliseconds(window_ms));
  jobs_.AddEvent(rec, weft::v1::GENERATION_KEPT,
                 absl::StrFormat("coordinator restarted; generation %d kept: its %d members "
                                 "attach again within %.1f s (store: %d keys)",
                                 number, rec.generation->world_size(), window_ms / 1000.0, keys));
  jobs_.Commit(rec, actions);
  return true;
}

ReattachDecision Coordinator::ReattachLocked(const std::string& worker_id,
                                             const weft::v1::RunningGeneration* running,
                                             Actions& actions) {
  ReattachDecision decision{false, ""};
  if (running != nullptr) {
    ReattachView view;
    if (auto job = jobs_.Find(running->job_id()); job.ok()) {
      const JobRecord& rec = **job;
      view.job_found = true;
      view.state = rec.state();
      if (rec.generation) {
        view.active_generation = rec.generation->number();
        view.member_rank = rec.generation->RankOf(worker_id);
      }
    }
    decision = DecideReattach(worker_id, running->job_id(), running->generation(),
                              running->rank(), view);
  }
  // A kept generation that awaits this worker and that it does not attach to has lost that
  // member: its process is new (or dropped the generation), so waiting out the window is moot.
  std::vector<JobRecord*> lost;
  jobs_.ForEachGeneration([&](JobRecord& rec) {
    const bool attaching = decision.attach && rec.id() == running->job_id();
    if (!attaching && rec.generation->AwaitingReattach(worker_id)) lost.push_back(&rec);
  });
  for (JobRecord* rec : lost) {
    metrics_.CountFailure("reregistered");
    FailGenerationLocked(*rec,
                         absl::StrCat("worker ", worker_id, " registered again without ",
                                      "generation ", rec->generation->number(),
                                      " after the coordinator's restart (its process, rank ",
                                      rec->generation->RankOf(worker_id), ", is gone)"),
                         /*permanent=*/false, weft::v1::WORKER_LOST, actions,
                         /*spends_restart=*/false);
  }
  return decision;
}

void Coordinator::AttachLocked(WorkerRecord& worker, const weft::v1::RunningGeneration& running,
                               Actions& actions) {
  JobRecord& rec = **jobs_.Find(running.job_id());
  Generation& gen = *rec.generation;
  workers_.Attach(worker, rec.job.spec(), rec.id(), gen.number(), running.rank());
  gen.MarkProgress(Now());
  const bool was_awaited = gen.AwaitingReattach(worker.id());
  spdlog::info("worker {} attached again to job {} generation {} as rank {} (at step {})",
               worker.id(), rec.id(), gen.number(), running.rank(), running.step());
  if (was_awaited && gen.MarkReattached(worker.id())) {
    jobs_.AddEvent(rec, weft::v1::GENERATION_KEPT,
                   absl::StrCat("every member of generation ", gen.number(),
                                " attached again; training went on at step ", running.step()));
    jobs_.Commit(rec, actions);
  }
}

}  // namespace weft::coordinator
