#include "coordinator/worker_registry.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/time_util.h"
#include "spdlog/spdlog.h"

namespace weft::coordinator {
namespace {

using weft::v1::Command;
using weft::v1::HeartbeatResponse;

// Worker ids and session tokens: letters, digits, ._/:-, 1-128 characters.
bool ValidWorkerId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '/' || c == ':' || c == '-';
    if (!ok) return false;
  }
  return true;
}

constexpr char kBadSessionToken[] =
    "session_token: must be 1-128 characters of letters, digits, ._/:-";

std::string DeviceName(const weft::v1::WorkerInfo& info) {
  return absl::StrCat(info.device_kind() == weft::v1::DEVICE_KIND_CUDA ? "cuda" : "cpu",
                      info.device_index());
}

// One device of one machine.
std::string DeviceKey(const weft::v1::WorkerInfo& info) {
  return absl::StrCat(info.host_id(), "\n", DeviceName(info));
}

}  // namespace

WorkerRegistry::WorkerRegistry(DeadlineTimer& timer, absl::Mutex* guard,
                               CoordinatorMetrics* metrics, Clock clock, const Options& options)
    : timer_(timer), guard_(guard), metrics_(metrics), clock_(std::move(clock)),
      options_(options) {}

absl::Status WorkerRegistry::CheckRegistration(weft::v1::WorkerInfo& info,
                                               const std::string& token) {
  std::vector<std::string> problems;
  if (info.host().empty()) problems.push_back("info.host: required");
  if (info.device_kind() != weft::v1::DEVICE_KIND_CPU &&
      info.device_kind() != weft::v1::DEVICE_KIND_CUDA) {
    problems.push_back("info.device_kind: required: DEVICE_KIND_CPU or DEVICE_KIND_CUDA");
  }
  if (info.device_index() < 0) {
    problems.push_back(absl::StrCat("info.device_index: must be >= 0, got ", info.device_index()));
  }
  if (info.worker_id().empty() && problems.empty()) {
    info.set_worker_id(absl::StrCat(info.host(), "/", DeviceName(info)));
  }
  if (info.host_id().empty()) info.set_host_id(info.host());
  // Ids share one alphabet; empty ones were reported above (or take a default).
  for (const auto& [field, id] : {std::pair{"info.host_id", &info.host_id()},
                                  std::pair{"info.worker_id", &info.worker_id()}}) {
    if (!id->empty() && !ValidWorkerId(*id)) {
      problems.push_back(absl::StrCat(field, ": \"", *id,
                                      "\" must be 1-128 characters of letters, digits, ._/:-"));
    }
  }
  if (!token.empty() && !ValidWorkerId(token)) problems.push_back(kBadSessionToken);
  if (!problems.empty()) return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
  return absl::OkStatus();
}

absl::Status WorkerRegistry::CheckSessionToken(const std::string& token) {
  return ValidWorkerId(token) ? absl::OkStatus() : absl::InvalidArgumentError(kBadSessionToken);
}

WorkerRecord* WorkerRegistry::Find(const std::string& worker_id) {
  auto it = workers_.find(worker_id);
  return it == workers_.end() ? nullptr : &it->second;
}

WorkerRecord& WorkerRegistry::FindOrAdd(const std::string& worker_id) {
  auto [it, added] = workers_.try_emplace(worker_id);
  if (added) ++state_counts_[it->second.state()];
  return it->second;
}

void WorkerRegistry::SetState(WorkerRecord& worker, weft::v1::WorkerState state) {
  const weft::v1::DeviceKind kind = worker.status.info().device_kind();
  if (worker.state() == weft::v1::WORKER_IDLE) --idle_by_kind_[kind];
  --state_counts_[worker.state()];
  worker.status.set_state(state);
  ++state_counts_[state];
  if (state == weft::v1::WORKER_IDLE) ++idle_by_kind_[kind];
}

const weft::v1::WorkerInfo* WorkerRegistry::Info(const std::string& worker_id) {
  const WorkerRecord* w = Find(worker_id);
  return w ? &w->status.info() : nullptr;
}

absl::Status WorkerRegistry::CheckDeviceClaim(const weft::v1::WorkerInfo& info) {
  auto owner = device_owner_.find(DeviceKey(info));
  if (owner == device_owner_.end() || owner->second == info.worker_id()) return absl::OkStatus();
  const WorkerRecord* other = Find(owner->second);
  if (other == nullptr || (other->state() != weft::v1::WORKER_IDLE &&
                           other->state() != weft::v1::WORKER_BUSY)) {
    return absl::OkStatus();
  }
  const weft::v1::WorkerInfo& theirs = other->status.info();
  // Same host name: one machine whose worker came back under another id.
  if (theirs.host() == info.host()) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "info.host_id: worker ", theirs.worker_id(), " of host \"", theirs.host(),
      "\" already drives ", DeviceName(info), " of machine \"", info.host_id(),
      "\", which this worker of host \"", info.host(),
      "\" claims too: two machines share a machine id (a cloned disk image?); give each "
      "its own --host-id, e.g. its host name"));
}

void WorkerRegistry::Register(WorkerRecord& worker, weft::v1::WorkerInfo info,
                              const std::string& token, Actions& actions) {
  const std::string id = info.worker_id();
  device_owner_[DeviceKey(info)] = id;
  const int64_t incarnation = worker.status.incarnation() + 1;
  if (worker.held) {
    worker.held->AnswerLater(actions, StopResponse(id, incarnation - 1, incarnation));
    worker.held.reset();
  }
  worker.pending.clear();
  SetState(worker, weft::v1::WORKER_STATE_UNSPECIFIED);  // leaves its old device kind's count
  worker.status = weft::v1::WorkerStatus();
  *worker.status.mutable_info() = std::move(info);
  SetState(worker, weft::v1::WORKER_IDLE);
  worker.status.set_incarnation(incarnation);
  worker.status.set_reason("registered");
  worker.last_heartbeat = clock_();
  worker.connection_lost = absl::InfiniteFuture();
  worker.session_token = token;
  if (!token.empty()) sessions_[token].worker_id = id;
  ToProtoTime(clock_(), worker.status.mutable_register_time());
  ToProtoTime(clock_(), worker.status.mutable_last_heartbeat_time());
  spdlog::debug("worker {} registered (incarnation {})", id, incarnation);
}

int64_t WorkerRegistry::HeartbeatInterval(const WorkerRecord& worker) const {
  return worker.state() == weft::v1::WORKER_BUSY ? worker.busy_heartbeat_interval_ms
                                                 : IdleHeartbeatNow().interval_ms;
}

IdleHeartbeat WorkerRegistry::IdleHeartbeatNow() const {
  auto idle = state_counts_.find(weft::v1::WORKER_IDLE);
  return IdleHeartbeatFor(idle == state_counts_.end() ? 0 : idle->second,
                          {options_.idle_heartbeat_interval_ms, options_.idle_heartbeat_timeout_ms},
                          options_.max_idle_heartbeats_per_s);
}

HeartbeatResponse WorkerRegistry::StopResponse(const std::string& worker_id, int64_t stale,
                                               int64_t current) {
  HeartbeatResponse response;
  response.add_commands()->mutable_stop()->set_reason(
      absl::StrCat("worker id ", worker_id, " was registered again by another process "
                   "(incarnation ", current, "); incarnation ", stale, " must stop"));
  return response;
}

bool WorkerRegistry::Beat(WorkerRecord& worker, const weft::v1::HeartbeatRequest& request) {
  worker.last_heartbeat = clock_();
  ToProtoTime(clock_(), worker.status.mutable_last_heartbeat_time());
  bool revived = false;
  if (worker.state() == weft::v1::WORKER_DEAD) {
    SetState(worker, weft::v1::WORKER_IDLE);
    worker.status.set_reason("heartbeating again after being declared dead");
    // Alive after all (e.g. its connection came back late): judged again from here on.
    worker.connection_lost = absl::InfiniteFuture();
    revived = true;
  }
  // A worker still training in a generation that ended (it missed the abort, or the
  // coordinator restarted) is told to stop.
  if (request.job_id().empty() || (worker.status.job_id() == request.job_id() &&
                                   worker.status.generation() == request.generation())) {
    return revived;
  }
  const bool already_told =
      std::any_of(worker.pending.begin(), worker.pending.end(), [&request](const Command& c) {
        return c.has_abort_generation() && c.abort_generation().job_id() == request.job_id() &&
               c.abort_generation().generation() == request.generation();
      });
  if (!already_told) {
    Command command;
    auto* abort = command.mutable_abort_generation();
    abort->set_job_id(request.job_id());
    abort->set_generation(request.generation());
    abort->set_reason("generation is no longer active");
    worker.pending.push_back(std::move(command));
  }
  return revived;
}

void WorkerRegistry::Hold(WorkerRecord& worker, int64_t wait_for_command_ms, absl::Time deadline,
                          Done<HeartbeatResponse> done, Actions& actions) {
  const int64_t interval_ms = HeartbeatInterval(worker);
  if (worker.held) {
    // A newer heartbeat supersedes a held one (e.g. the client gave up on it).
    HeartbeatResponse empty;
    empty.set_heartbeat_interval_ms(interval_ms);
    worker.held->AnswerLater(actions, empty);
    worker.held.reset();
  }
  const int64_t hold_ms = std::min(wait_for_command_ms, interval_ms);
  if (!worker.pending.empty() || hold_ms <= 0) {
    actions.Add([done, response = TakeCommands(worker, interval_ms)] { done(response); });
    return;
  }
  const absl::Time wake = std::min(deadline, absl::Now() + absl::Milliseconds(hold_ms));
  worker.held = WorkerRecord::HeldHeartbeat::Park(
      timer_, guard_, wake, std::move(done),
      [this, worker_id = worker.id(), interval_ms](const WorkerRecord::HeldHeartbeat& call) {
        WorkerRecord* w = Find(worker_id);
        if (w == nullptr || w->held.get() != &call) {
          HeartbeatResponse empty;
          empty.set_heartbeat_interval_ms(interval_ms);
          return absl::StatusOr<HeartbeatResponse>(empty);
        }
        w->held.reset();
        return absl::StatusOr<HeartbeatResponse>(TakeCommands(*w, interval_ms));
      });
}

HeartbeatResponse WorkerRegistry::TakeCommands(WorkerRecord& worker, int64_t interval_ms) {
  HeartbeatResponse response;
  for (auto& c : worker.pending) *response.add_commands() = std::move(c);
  worker.pending.clear();
  response.set_heartbeat_interval_ms(interval_ms);
  return response;
}

void WorkerRegistry::Flush(WorkerRecord& worker, Actions& actions) {
  if (!worker.held) return;
  std::shared_ptr<WorkerRecord::HeldHeartbeat> held = std::move(worker.held);
  worker.held.reset();
  if (auto done = held->Take()) {
    actions.Add([done = std::move(done),
                 response = TakeCommands(worker, HeartbeatInterval(worker))] { done(response); });
  }
}

void WorkerRegistry::Enqueue(WorkerRecord& worker, Command command, Actions& actions) {
  worker.pending.push_back(std::move(command));
  Flush(worker, actions);
}

bool WorkerRegistry::HasPendingJoin(const WorkerRecord& worker, const std::string& job_id,
                                    int64_t generation) {
  return std::any_of(worker.pending.begin(), worker.pending.end(), [&](const Command& c) {
    return c.has_join_job() && c.join_job().job_id() == job_id &&
           c.join_job().generation() == generation;
  });
}

void WorkerRegistry::Attach(WorkerRecord& worker, const weft::v1::JobSpec& spec,
                            const std::string& job_id, int64_t generation, int32_t rank) {
  SetState(worker, weft::v1::WORKER_BUSY);
  worker.status.set_job_id(job_id);
  worker.status.set_generation(generation);
  worker.status.set_rank(rank);
  worker.status.set_reason(
      absl::StrCat("rank ", rank, " of job ", job_id, " generation ", generation));
  worker.busy_heartbeat_interval_ms = spec.fault().heartbeat_interval_ms();
}

void WorkerRegistry::Assign(WorkerRecord& worker, const weft::v1::JobSpec& spec,
                            const std::string& job_id, int64_t generation, int32_t rank,
                            int32_t world_size, Actions& actions) {
  Attach(worker, spec, job_id, generation, rank);
  Command command;
  auto* join = command.mutable_join_job();
  join->set_job_id(job_id);
  join->set_generation(generation);
  *join->mutable_spec() = spec;
  join->set_rank(rank);
  join->set_world_size(world_size);
  Enqueue(worker, std::move(command), actions);
}

void WorkerRegistry::Release(WorkerRecord& worker, const std::string& job_id, int64_t generation,
                             const std::string& reason, bool completed, Actions& actions) {
  if (worker.status.job_id() != job_id || worker.status.generation() != generation) return;
  worker.status.clear_job_id();
  worker.status.clear_generation();
  worker.status.clear_rank();
  // A member that has not fetched its JoinJob yet must never see it: withdraw it, and then
  // there is nothing for it to abort either.
  const bool never_told = HasPendingJoin(worker, job_id, generation);
  std::erase_if(worker.pending, [&](const Command& c) {
    return c.has_join_job() && c.join_job().job_id() == job_id &&
           c.join_job().generation() == generation;
  });
  if (worker.state() == weft::v1::WORKER_DEAD) return;
  SetState(worker, weft::v1::WORKER_IDLE);
  worker.status.set_reason(absl::StrCat("released from job ", job_id, " generation ", generation));
  if (completed || never_told) return;
  Command command;
  auto* abort = command.mutable_abort_generation();
  abort->set_job_id(job_id);
  abort->set_generation(generation);
  abort->set_reason(reason);
  Enqueue(worker, std::move(command), actions);
}

void WorkerRegistry::MarkDead(WorkerRecord& worker, const std::string& reason) {
  SetState(worker, weft::v1::WORKER_DEAD);
  worker.status.set_reason(reason);
}

std::optional<std::string> WorkerRegistry::Blame(const std::string& worker_id,
                                                 const std::string& cause) {
  WorkerRecord* w = Find(worker_id);
  if (w == nullptr) return std::nullopt;
  const QuarantineDecision d =
      DecideQuarantine(clock_(), worker_id, w->consecutive_failures, cause, options_.quarantine);
  w->consecutive_failures = d.consecutive_failures;
  if (!d.quarantined_until) return std::nullopt;
  w->quarantined_until = *d.quarantined_until;
  w->status.set_reason(d.reason);
  return d.reason;
}

void WorkerRegistry::ClearFailures(const std::vector<std::string>& members) {
  for (const std::string& m : members) {
    if (WorkerRecord* w = Find(m)) w->consecutive_failures = 0;
  }
}

void WorkerRegistry::IdleViews(std::vector<IdleWorkerView>* healthy,
                               std::vector<IdleWorkerView>* quarantined) {
  const absl::Time now = clock_();
  for (const auto& [id, w] : workers_) {
    if (w.state() != weft::v1::WORKER_IDLE) continue;
    (w.quarantined_until > now ? quarantined : healthy)
        ->push_back({std::string_view(id), std::string_view(w.status.info().host_id()),
                     w.status.info().device_index(), w.status.info().device_kind(),
                     std::string_view(w.status.info().gpu_uuid())});
  }
}

std::vector<WorkerLivenessView> WorkerRegistry::LivenessViews(bool refresh_ages) {
  const absl::Time now = clock_();
  std::vector<WorkerLivenessView> views;
  views.reserve(workers_.size());
  for (const auto& [id, w] : workers_) {
    views.push_back({id, w.state(), w.last_heartbeat, w.connection_lost, w.status.job_id(),
                     w.status.generation()});
    if (!refresh_ages) continue;
    metrics_->SetHeartbeatAge(id, w.state() == weft::v1::WORKER_DEAD
                                      ? std::nullopt
                                      : std::optional<absl::Duration>(now - w.last_heartbeat));
  }
  return views;
}

weft::v1::ListWorkersResponse WorkerRegistry::List() const {
  weft::v1::ListWorkersResponse response;
  std::vector<const WorkerRecord*> sorted;
  for (const auto& [id, w] : workers_) sorted.push_back(&w);
  std::sort(sorted.begin(), sorted.end(), [](const WorkerRecord* a, const WorkerRecord* b) {
    const auto& x = a->status.info();
    const auto& y = b->status.info();
    return std::make_tuple(x.host(), x.device_index(), x.worker_id()) <
           std::make_tuple(y.host(), y.device_index(), y.worker_id());
  });
  for (const WorkerRecord* w : sorted) *response.add_workers() = w->status;
  return response;
}

WorkerRecord* WorkerRegistry::SessionWorker(const std::string& token) {
  auto session = sessions_.find(token);
  if (session == sessions_.end() || session->second.worker_id.empty()) return nullptr;
  WorkerRecord* worker = Find(session->second.worker_id);
  if (worker == nullptr || worker->session_token != token) return nullptr;
  return worker;
}

uint64_t WorkerRegistry::OpenSession(const std::string& token, SessionEnd end, Actions& actions) {
  SessionRecord& session = sessions_[token];
  if (session.end) actions.Add([end = std::move(session.end)] { end(absl::OkStatus()); });
  session.id = next_session_id_++;
  session.end = std::move(end);
  // A worker whose connection broke and came back is alive: only a session that stays gone
  // past the grace is fatal.
  if (WorkerRecord* worker = SessionWorker(token)) {
    worker->connection_lost = absl::InfiniteFuture();
  }
  spdlog::debug("session {} opened ({})", session.id,
                session.worker_id.empty() ? "not registered yet" : session.worker_id);
  return session.id;
}

void WorkerRegistry::CloseSession(const std::string& token, uint64_t session_id) {
  auto it = sessions_.find(token);
  // An older stream's cancel can arrive after the live process opened its next one.
  if (it == sessions_.end() || session_id == 0 || it->second.id != session_id) return;
  SessionRecord& session = it->second;
  session.id = 0;
  session.end = nullptr;  // its stream is finishing on its own
  WorkerRecord* worker = SessionWorker(token);
  spdlog::debug("session {} of {} closed by the transport", session_id,
                worker ? session.worker_id : "no worker");
  if (worker == nullptr) {
    sessions_.erase(it);
  } else if (worker->connection_lost == absl::InfiniteFuture()) {
    worker->connection_lost = clock_();
  }
}

void WorkerRegistry::DropStaleSessions() {
  // Closed sessions that no registration refers to any more (the worker re-registered from a
  // new process, or never registered) have nothing left to tell.
  std::vector<std::string> stale;
  for (const auto& [token, session] : sessions_) {
    if (session.id == 0 && SessionWorker(token) == nullptr) stale.push_back(token);
  }
  for (const auto& token : stale) sessions_.erase(token);
}

void WorkerRegistry::Shutdown(const absl::Status& status, Actions& actions) {
  for (auto& [id, worker] : workers_) {
    if (worker.held) worker.held->AnswerLater(actions, status);
    worker.held.reset();
  }
  for (auto& [token, session] : sessions_) {
    if (session.end) actions.Add([end = std::move(session.end), status] { end(status); });
    session.end = nullptr;
  }
}

}  // namespace weft::coordinator
