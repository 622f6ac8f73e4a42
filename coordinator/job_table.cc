#include "coordinator/job_table.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/time_util.h"
#include "spdlog/spdlog.h"

namespace weft::coordinator {
namespace {

// "submitted: 124439808 parameters on 2-4 CPU workers".
std::string SubmittedMessage(const weft::v1::JobSpec& spec) {
  const auto& r = spec.resources();
  const std::string gang = r.min_workers() == r.max_workers()
                               ? absl::StrCat(r.min_workers())
                               : absl::StrCat(r.min_workers(), "-", r.max_workers());
  return absl::StrCat("submitted: ", ModelParameterCount(spec.model()), " parameters on ", gang,
                      " ", r.device_kind() == weft::v1::DEVICE_KIND_CUDA ? "CUDA" : "CPU",
                      " worker", r.max_workers() == 1 ? "" : "s");
}

}  // namespace

std::string JobIdSuffix(uint64_t random) {
  // RFC 4648's base32 alphabet in lower case; the first character is a letter.
  static constexpr char kAlphabet[] = "abcdefghijklmnopqrstuvwxyz234567";
  std::string suffix(kJobIdSuffixChars, ' ');
  suffix[0] = kAlphabet[random % 26];
  random /= 26;
  for (int i = 1; i < kJobIdSuffixChars; ++i) {
    suffix[i] = kAlphabet[random % 32];
    random /= 32;
  }
  return suffix;
}

std::string MakeJobId(const std::string& name, int64_t seq, uint64_t random) {
  return absl::StrCat(name, "-", seq, "-", JobIdSuffix(random));
}

int64_t SeqFromJobId(const std::string& job_id) {
  // "<name>-<seq>-<suffix>", or "<name>-<seq>" as stored before job ids had a suffix.
  std::string_view rest = job_id;
  size_t dash = rest.rfind('-');
  if (dash == std::string_view::npos) return 0;
  std::string_view last = rest.substr(dash + 1);
  if (!last.empty() && !absl::ascii_isdigit(static_cast<unsigned char>(last[0]))) {
    rest = rest.substr(0, dash);
    dash = rest.rfind('-');
    if (dash == std::string_view::npos) return 0;
    last = rest.substr(dash + 1);
  }
  int64_t seq = 0;
  return absl::SimpleAtoi(absl::string_view(last.data(), last.size()), &seq) ? seq : 0;
}

JobTable::JobTable(std::unique_ptr<StateDb> db, CoordinatorMetrics* metrics, Clock clock,
                   const Options& options)
    : db_(std::move(db)), metrics_(metrics), clock_(std::move(clock)), options_(options) {}

absl::StatusOr<std::vector<std::string>> JobTable::Load() {
  auto jobs = db_->LoadJobs();
  if (!jobs.ok()) return jobs.status();
  auto seq = db_->LoadNextJobSeq();
  if (!seq.ok()) return seq.status();
  next_job_seq_ = *seq;
  std::vector<std::string> running;
  for (weft::v1::Job& job : *jobs) {
    const std::string id = job.status().job_id();
    JobRecord& rec = jobs_[id];
    rec.job = std::move(job);
    rec.seq = SeqFromJobId(id);
    rec.last_persist = clock_();
    if (rec.state() == weft::v1::RUNNING) {
      running.push_back(id);
      metrics_->SetCheckpointIntervalSteps(id, rec.job.spec().checkpoint().interval_steps());
      RestoreCheckpointTimes(rec);
    }
  }
  return running;
}

MemoryStore::Journal JobTable::StoreJournal(const std::string& job_id, int64_t generation) {
  return [db = db_.get(), job_id, generation](const std::string& key, const std::string* value) {
    if (absl::Status s = db->PutStoreKey(job_id, generation, key, value); !s.ok()) {
      spdlog::warn("job {} generation {}: store key {} not written through ({}); a restart of "
                   "the coordinator now would lose it",
                   job_id, generation, key, std::string(s.message()));
    }
  };
}

absl::flat_hash_map<std::string, std::string> JobTable::LoadStore(const std::string& job_id,
                                                                  int64_t generation) {
  auto contents = db_->LoadStore(job_id, generation);
  if (!contents.ok()) {
    spdlog::error("job {} generation {}: its store cannot be read back: {}", job_id, generation,
                  std::string(contents.status().message()));
    return {};
  }
  return *std::move(contents);
}

void JobTable::DropStores(const std::string& job_id) {
  if (absl::Status s = db_->DropStores(job_id); !s.ok()) {
    spdlog::warn("job {}: stored generation store not removed: {}", job_id,
                 std::string(s.message()));
  }
}

void JobTable::DropStoresExcept(const absl::flat_hash_set<std::string>& keep) {
  if (absl::Status s = db_->DropStoresExcept(keep); !s.ok()) {
    spdlog::warn("stale generation stores not removed: {}", std::string(s.message()));
  }
}

void JobTable::RestoreCheckpointTimes(const JobRecord& rec) {
  const weft::v1::JobStatus& s = rec.job.status();
  for (auto e = s.events().rbegin(); e != s.events().rend(); ++e) {
    if (e->type() != weft::v1::CHECKPOINT_COMMITTED) continue;
    metrics_->SetCheckpointTimes(s.job_id(), static_cast<double>(s.checkpoint_stall_ms()),
                                 static_cast<double>(s.checkpoint_save_ms()),
                                 FromProtoTime(e->time()));
    return;
  }
  if (s.has_start_time()) {
    metrics_->SetUncheckpointedSince(s.job_id(), FromProtoTime(s.start_time()));
  }
}

absl::StatusOr<JobRecord*> JobTable::Create(const weft::v1::JobSpec& spec) {
  const int64_t seq = next_job_seq_;
  // The kernel's CSPRNG, so that no two coordinators (whatever their seeds, start times or
  // data directories) are likely to draw the same suffix.
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return absl::InternalError(
        absl::StrCat("cannot draw a job id: getrandom: ", std::strerror(errno)));
  }
  JobRecord rec;
  rec.seq = seq;
  *rec.job.mutable_spec() = spec;
  auto* status = rec.status();
  status->set_job_id(MakeJobId(spec.name(), seq, random));
  status->set_name(spec.name());
  // A job's first state: every later one goes through SetState.
  status->set_state(weft::v1::PENDING);
  status->set_total_steps(spec.training().total_steps());
  ToProtoTime(clock_(), status->mutable_create_time());
  BeginChange(rec);  // no metrics or log of a job that is never stored
  AddEvent(rec, weft::v1::SUBMITTED, SubmittedMessage(spec));
  Change change = std::move(*change_);
  change_.reset();
  // Durable before acknowledged: a job the client was told about survives any crash.
  if (absl::Status s = db_->PutJob(rec.job, seq + 1); !s.ok()) return s;
  for (const auto& effect : change.effects) effect();
  next_job_seq_ = seq + 1;
  rec.last_persist = clock_();
  const std::string job_id = status->job_id();
  metrics_->CountJobSubmitted(job_id);
  return &jobs_.emplace(job_id, std::move(rec)).first->second;
}

absl::StatusOr<JobRecord*> JobTable::Find(const std::string& job_id, const char* field) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat(field ? field : "", field ? ": " : "", "job ",
                                            job_id, " not found"));
  }
  return &it->second;
}

std::vector<JobRecord*> JobTable::Waiting() {
  std::vector<JobRecord*> waiting;
  for (auto& [id, rec] : jobs_) {
    const weft::v1::JobState s = rec.state();
    if ((s == weft::v1::PENDING || s == weft::v1::RECOVERING) && !rec.generation) {
      waiting.push_back(&rec);
    }
  }
  std::sort(waiting.begin(), waiting.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq < b->seq; });
  return waiting;
}

void JobTable::ForEachGeneration(const std::function<void(JobRecord&)>& fn) {
  for (auto& [id, rec] : jobs_) {
    if (rec.generation) fn(rec);
  }
}

absl::flat_hash_map<int, int> JobTable::CountByState() const {
  absl::flat_hash_map<int, int> counts;
  for (const auto& [id, rec] : jobs_) ++counts[rec.state()];
  return counts;
}

absl::StatusOr<weft::v1::ListJobsResponse> JobTable::List(
    const weft::v1::ListJobsRequest& request) const {
  if (request.limit() < 0 || request.limit() > 1000) {
    return absl::InvalidArgumentError(
        absl::StrCat("limit: must be in [0, 1000], got ", request.limit()));
  }
  const int limit = request.limit() == 0 ? 100 : request.limit();
  absl::flat_hash_set<int> states(request.states().begin(), request.states().end());
  std::vector<const JobRecord*> selected;
  for (const auto& [id, rec] : jobs_) {
    if (states.empty() || states.contains(rec.state())) selected.push_back(&rec);
  }
  std::sort(selected.begin(), selected.end(),
            [](const JobRecord* a, const JobRecord* b) { return a->seq > b->seq; });
  weft::v1::ListJobsResponse response;
  for (size_t i = 0; i < selected.size() && static_cast<int>(i) < limit; ++i) {
    weft::v1::JobStatus* status = response.add_jobs();
    *status = selected[i]->job.status();
    // A listing is a summary: the full event log is one GetJob away.
    status->clear_events();
  }
  return response;
}

void JobTable::AddEvent(JobRecord& rec, weft::v1::JobEventType type, const std::string& message) {
  auto* status = rec.status();
  auto* event = status->add_events();
  ToProtoTime(clock_(), event->mutable_time());
  event->set_type(type);
  event->set_generation(status->generation());
  event->set_state(status->state());
  event->set_message(message);
  if (status->events_size() > options_.max_events_per_job) {
    status->mutable_events()->DeleteSubrange(
        0, status->events_size() - options_.max_events_per_job);
  }
  Effect(rec, [this, job_id = status->job_id(), type, message] {
    metrics_->CountJobEvent(job_id, type);
    spdlog::info("job {}: {}: {}", job_id, weft::v1::JobEventType_Name(type), message);
  });
}

void JobTable::SetState(JobRecord& rec, weft::v1::JobState state, const std::string& reason) {
  auto* status = rec.status();
  if (status->state() == state) return;
  if (absl::Status s = CheckTransition(status->state(), state); !s.ok()) {
    spdlog::error("job {}: {} (reason given: {})", status->job_id(), std::string(s.message()),
                  reason);
    return;
  }
  status->set_state(state);
  if (JobHasEnded(state)) ToProtoTime(clock_(), status->mutable_end_time());
  if (state != weft::v1::PENDING && state != weft::v1::RECOVERING) status->clear_pending_reason();
  AddEvent(rec, weft::v1::STATE_CHANGED, absl::StrCat(JobState_Name(state), ": ", reason));
  Effect(rec, [this, job_id = status->job_id(), state,
               interval = rec.job.spec().checkpoint().interval_steps()] {
    metrics_->SetCheckpointIntervalSteps(job_id, state == weft::v1::RUNNING ? interval : 0);
    if (JobHasEnded(state)) metrics_->EndJob(job_id, clock_());
  });
}

void JobTable::Effect(const JobRecord& rec, std::function<void()> effect) {
  if (change_ && change_->rec == &rec) {
    change_->effects.push_back(std::move(effect));
  } else {
    effect();
  }
}

absl::Status JobTable::Write(JobRecord& rec) {
  if (absl::Status s = db_->PutJob(rec.job); !s.ok()) return s;
  rec.last_persist = clock_();
  rec.unpersisted = false;
  return absl::OkStatus();
}

void JobTable::Commit(JobRecord& rec, Actions& actions) {
  if (change_ && change_->rec == &rec) return;
  const bool was_unpersisted = rec.unpersisted;
  if (absl::Status s = Write(rec); !s.ok()) {
    // Memory stays ahead (workers may already act on the change); RetryUnpersisted catches up.
    rec.unpersisted = true;
    if (!was_unpersisted) {
      spdlog::error("job {}: {}; kept in memory, written again every tick until it succeeds",
                    rec.id(), std::string(s.message()));
    }
  } else if (was_unpersisted) {
    spdlog::info("job {}: written to the state database again", rec.id());
  }
  NotifyWatchers(rec, actions);
}

void JobTable::CommitIfDue(JobRecord& rec, Actions& actions) {
  if (rec.unpersisted ||
      clock_() - rec.last_persist >= absl::Milliseconds(options_.metrics_persist_interval_ms)) {
    Commit(rec, actions);
  } else {
    NotifyWatchers(rec, actions);
  }
}

void JobTable::RetryUnpersisted() {
  // At most once a second: while the disk stays full, each try resumes or reopens RocksDB.
  const absl::Time now = clock_();
  if (now < next_retry_) return;
  next_retry_ = now + absl::Seconds(1);
  for (auto& [id, rec] : jobs_) {
    if (!rec.unpersisted) continue;
    if (Write(rec).ok()) spdlog::info("job {}: written to the state database again", id);
  }
}

void JobTable::BeginChange(JobRecord& rec) {
  change_.emplace(Change{.rec = &rec, .before = rec.job, .effects = {}});
}

absl::Status JobTable::CommitChange(JobRecord& rec, Actions& actions) {
  Change change = std::move(*change_);
  change_.reset();
  if (absl::Status s = Write(rec); !s.ok()) {
    rec.job = std::move(change.before);
    spdlog::error("job {}: change not made, as it could not be stored: {}", rec.id(),
                  std::string(s.message()));
    return s;
  }
  for (const auto& effect : change.effects) effect();
  NotifyWatchers(rec, actions);
  return absl::OkStatus();
}

void JobTable::NotifyWatchers(const JobRecord& rec, Actions& actions) {
  const std::string& job_id = rec.id();
  const bool final = JobHasEnded(rec.state());
  const uint64_t seq = ++update_seq_;
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (it->second.job_id != job_id) {
      ++it;
      continue;
    }
    actions.Add([fn = it->second.fn, status = rec.job.status(), seq, final] {
      fn(status, seq, final);
    });
    it = final ? watchers_.erase(it) : std::next(it);
  }
}

absl::StatusOr<uint64_t> JobTable::AddWatcher(const std::string& job_id, Watcher watcher,
                                              Actions& actions) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  const bool final = JobHasEnded(it->second.state());
  const uint64_t seq = ++update_seq_;
  actions.Add([watcher, status = it->second.job.status(), seq, final] {
    watcher(status, seq, final);
  });
  if (final) return 0;
  const uint64_t id = next_watcher_id_++;
  watchers_.emplace(id, WatcherRecord{job_id, std::move(watcher)});
  return id;
}

void JobTable::EndWatches(Actions& actions) {
  for (auto& [id, watcher] : watchers_) {
    auto it = jobs_.find(watcher.job_id);
    if (it == jobs_.end()) continue;
    actions.Add([fn = std::move(watcher.fn), status = it->second.job.status()] {
      fn(status, UINT64_MAX, true);
    });
  }
  watchers_.clear();
}

}  // namespace weft::coordinator
