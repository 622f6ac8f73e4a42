// Unit tests for the Coordinator state machine, driven by a fake clock and manual Tick()s.
// No gRPC: calls go straight to the class. The Coordinator's own heartbeat bookkeeping uses the
// fake clock; parked calls (held heartbeats, Join) use real deadlines, so the tests keep those
// far away (or a few ms away where the expiry itself is under test).
#include "coordinator/coordinator.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/coordinator_metrics.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "spdlog/spdlog.h"
#include "tests/testing/subprocess.h"

namespace weft::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;
using ::testing::SizeIs;
using weft::v1::Command;
using weft::v1::HeartbeatResponse;
using weft::v1::JobSpec;
using weft::v1::JobStatus;
using weft::v1::JoinResponse;

// Far enough that no parked call expires during a test.
constexpr absl::Duration kFar = absl::Seconds(60);
constexpr absl::Duration kPatience = absl::Seconds(10);

class FakeClock {
 public:
  absl::Time Now() {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

struct Worker {
  std::string id;
  int64_t incarnation = 0;
};

// The outcome of an asynchronous call (Join, held Heartbeat), filled in by its Done callback.
template <typename T>
struct Pending {
  absl::Mutex mu;
  int calls = 0;
  std::optional<absl::StatusOr<T>> result;
  absl::Notification done;

  Coordinator::Done<T> Callback() {
    return [this](absl::StatusOr<T> r) {
      absl::MutexLock lock(&mu);
      if (++calls == 1) {
        result = std::move(r);
        done.Notify();
      }
    };
  }
  bool finished() { return done.HasBeenNotified(); }
  absl::StatusOr<T> Get() {
    absl::MutexLock lock(&mu);
    return result.value_or(absl::InternalError("not finished"));
  }
  int call_count() {
    absl::MutexLock lock(&mu);
    return calls;
  }
};

JobSpec CpuSpec(const std::string& name, int32_t min_workers, int32_t max_workers = 0) {
  JobSpec spec;
  spec.set_name(name);
  auto* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(64);
  m->set_num_heads(4);
  m->set_vocab_size(256);
  m->set_context_length(64);
  spec.mutable_data()->set_train_path("/data/tiny.txt");
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_TEXT_BYTES);
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  spec.mutable_training()->set_total_steps(100);
  spec.mutable_training()->set_micro_batch_size(2);
  spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
  spec.mutable_resources()->set_min_workers(min_workers);
  spec.mutable_resources()->set_max_workers(max_workers);
  return spec;
}

std::vector<Command> JoinCommands(const HeartbeatResponse& r) {
  std::vector<Command> out;
  for (const auto& c : r.commands()) {
    if (c.has_join_job()) out.push_back(c);
  }
  return out;
}
std::vector<Command> AbortCommands(const HeartbeatResponse& r) {
  std::vector<Command> out;
  for (const auto& c : r.commands()) {
    if (c.has_abort_generation()) out.push_back(c);
  }
  return out;
}

// The first event of `type` whose message contains `fragment`, or nullptr.
const weft::v1::JobEvent* FindEvent(const JobStatus& status, weft::v1::JobEventType type,
                                    absl::string_view fragment = "") {
  for (const auto& e : status.events()) {
    if (e.type() == type && absl::StrContains(e.message(), fragment)) return &e;
  }
  return nullptr;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spdlog::set_level(spdlog::level::warn);  // the coordinator logs every event at info
    options_.data_dir = dir_.path();
    Reopen();
  }

  void Reopen() {
    coord_.reset();  // releases the database lock
    registry_ = std::make_shared<prometheus::Registry>();
    auto c = Coordinator::Open(options_, registry_, [this] { return clock_.Now(); },
                               /*start_ticking=*/false);
    ASSERT_TRUE(c.ok()) << c.status();
    coord_ = std::move(*c);
  }

  std::string Submit(const JobSpec& spec) {
    auto r = coord_->SubmitJob(spec);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->job_id() : "";
  }

  JobStatus Status(const std::string& job_id) {
    auto job = coord_->GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->status() : JobStatus();
  }

  weft::v1::WorkerStatus WorkerStatus(const std::string& id) {
    auto list = coord_->ListWorkers();
    EXPECT_TRUE(list.ok());
    for (const auto& w : list->workers()) {
      if (w.info().worker_id() == id) return w;
    }
    ADD_FAILURE() << "no worker " << id;
    return {};
  }

  Worker Register(const std::string& host, int32_t index,
                  weft::v1::DeviceKind kind = weft::v1::DEVICE_KIND_CPU,
                  const std::string& session_token = "", const std::string& checkpointd = "") {
    weft::v1::WorkerInfo info;
    info.set_host(host);
    info.set_device_index(index);
    info.set_device_kind(kind);
    info.set_address(absl::StrCat(host, ":", 7000 + index));
    info.set_version("0.1.0");
    info.set_checkpointd(checkpointd);
    auto r = coord_->RegisterWorker(info, session_token);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    return {r->worker_id(), r->incarnation()};
  }

  // Registers h/cpu<index> again as a process still training as `rank` of `generation` of
  // `job_id` (after a coordinator restart).
  absl::StatusOr<weft::v1::RegisterWorkerResponse> RegisterRunning(
      const std::string& host, int32_t index, const std::string& job_id, int64_t generation,
      int32_t rank, int64_t step) {
    weft::v1::WorkerInfo info;
    info.set_host(host);
    info.set_device_index(index);
    info.set_device_kind(weft::v1::DEVICE_KIND_CPU);
    info.set_address(absl::StrCat(host, ":", 7000 + index));
    info.set_version("0.1.0");
    weft::v1::RunningGeneration running;
    running.set_job_id(job_id);
    running.set_generation(generation);
    running.set_rank(rank);
    running.set_step(step);
    return coord_->RegisterWorker(info, "", &running);
  }

  // A heartbeat that must answer inline (wait_for_command_ms = 0).
  absl::StatusOr<HeartbeatResponse> Beat(const Worker& w, const std::string& job_id = "",
                                         int64_t generation = 0) {
    weft::v1::HeartbeatRequest request;
    request.set_worker_id(w.id);
    request.set_incarnation(w.incarnation);
    request.set_job_id(job_id);
    request.set_generation(generation);
    Pending<HeartbeatResponse> pending;
    coord_->Heartbeat(request, absl::Now() + kFar, pending.Callback());
    EXPECT_TRUE(pending.finished()) << "heartbeat with wait_for_command_ms=0 was held";
    return pending.Get();
  }

  std::unique_ptr<Pending<JoinResponse>> StartJoin(const std::string& job_id, int64_t generation,
                                                   const Worker& w,
                                                   absl::Duration timeout = kFar,
                                                   bool include_peers = true) {
    weft::v1::JoinRequest request;
    request.set_job_id(job_id);
    request.set_generation(generation);
    request.set_worker_id(w.id);
    request.set_incarnation(w.incarnation);
    request.set_include_peers(include_peers);
    auto pending = std::make_unique<Pending<JoinResponse>>();
    coord_->Join(request, absl::Now() + timeout, pending->Callback());
    return pending;
  }

  // A report of `w` as `rank` of `generation`, carrying nothing yet.
  static weft::v1::ReportProgressRequest EmptyReport(const std::string& job_id,
                                                     int64_t generation, const Worker& w,
                                                     int32_t rank) {
    weft::v1::ReportProgressRequest request;
    request.set_job_id(job_id);
    request.set_generation(generation);
    request.set_worker_id(w.id);
    request.set_rank(rank);
    return request;
  }

  absl::StatusOr<weft::v1::ReportProgressResponse> Report(const std::string& job_id,
                                                          int64_t generation, const Worker& w,
                                                          int32_t rank, int64_t step,
                                                          bool finished = false) {
    weft::v1::ReportProgressRequest request = EmptyReport(job_id, generation, w, rank);
    if (step > 0) {
      request.mutable_metrics()->set_step(step);
      request.mutable_metrics()->set_loss(5.0 - 0.01 * step);
      request.mutable_metrics()->set_tokens_per_s(1234.5);
    }
    request.set_finished(finished);
    return coord_->ReportProgress(request);
  }

  absl::StatusOr<weft::v1::ReportProgressResponse> ReportError(const std::string& job_id,
                                                               int64_t generation, const Worker& w,
                                                               int32_t rank,
                                                               const std::string& error,
                                                               bool permanent) {
    weft::v1::ReportProgressRequest request = EmptyReport(job_id, generation, w, rank);
    request.set_error(error);
    request.set_error_is_permanent(permanent);
    return coord_->ReportProgress(request);
  }

  // A running job of `n` CPU workers on host "h" (rank i = h/cpu<i>), rendezvous complete.
  struct Running {
    std::string job_id;
    std::vector<Worker> workers;
  };
  // `session_tokens[i]`: rank i's (none past the end).
  Running StartRunningJob(JobSpec spec, int n, const std::vector<std::string>& session_tokens = {}) {
    Running r;
    r.job_id = Submit(spec);
    for (int i = 0; i < n; ++i) {
      const std::string token = i < static_cast<int>(session_tokens.size()) ? session_tokens[i] : "";
      r.workers.push_back(Register("h", i, weft::v1::DEVICE_KIND_CPU, token));
    }
    EXPECT_EQ(Status(r.job_id).state(), weft::v1::RUNNING);
    std::vector<std::unique_ptr<Pending<JoinResponse>>> joins;
    for (const Worker& w : r.workers) {
      auto hb = Beat(w);
      EXPECT_TRUE(hb.ok());
      EXPECT_THAT(JoinCommands(*hb), SizeIs(1));
      joins.push_back(StartJoin(r.job_id, 1, w));
    }
    for (auto& j : joins) EXPECT_TRUE(j->finished() && j->Get().ok());
    return r;
  }

  // Advances the fake clock in 1 s steps (Tick after each), heartbeating `alive` every step.
  void AdvanceKeepingAlive(absl::Duration total, const std::vector<Worker>& alive,
                           const std::string& job_id = "", int64_t generation = 0) {
    while (total > absl::ZeroDuration()) {
      const absl::Duration step = std::min(total, absl::Seconds(1));
      clock_.Advance(step);
      total -= step;
      for (const Worker& w : alive) ASSERT_TRUE(Beat(w, job_id, generation).ok());
      coord_->Tick();
    }
  }

  // One more millisecond and a tick: generation 1 of `job` ends with a GENERATION_ENDED event
  // saying `why`, a restart is used, and (its members released) generation 2 forms at once.
  void ExpectRestartedAtOnce(const std::string& job, const std::string& why) {
    clock_.Advance(absl::Milliseconds(1));
    coord_->Tick();
    JobStatus s = Status(job);
    EXPECT_EQ(s.restarts(), 1);
    EXPECT_EQ(s.state(), weft::v1::RUNNING);
    EXPECT_EQ(s.generation(), 2);
    EXPECT_NE(FindEvent(s, weft::v1::GENERATION_ENDED, why), nullptr) << s.DebugString();
  }

  // A two-worker job whose rank 1 stays silent for `silence`, with the given idle and job
  // heartbeat timeouts: the job and that member end up in the states given.
  void ExpectSilentMember(int64_t idle_timeout_ms, int64_t job_timeout_ms, absl::Duration silence,
                          weft::v1::JobState job_state, weft::v1::WorkerState member_state) {
    options_.heartbeat_timeout_ms = idle_timeout_ms;
    Reopen();
    JobSpec spec = CpuSpec("silent", 2);
    spec.mutable_fault()->set_heartbeat_timeout_ms(job_timeout_ms);
    auto [job, w] = StartRunningJob(spec, 2);
    AdvanceKeepingAlive(silence, {w[0]}, job, 1);
    EXPECT_EQ(Status(job).state(), job_state);
    EXPECT_EQ(WorkerStatus(w[1].id).state(), member_state);
  }

  weft::testing::TempDir dir_;
  FakeClock clock_;
  CoordinatorOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Coordinator> coord_;

  // The value of gauge family `name` for `job_id` (its only label), if exported.
  std::optional<double> JobGauge(const std::string& name, const std::string& job_id) {
    for (const auto& family : registry_->Collect()) {
      if (family.name != name) continue;
      for (const auto& metric : family.metric) {
        if (metric.label.size() == 1 && metric.label[0].value == job_id) {
          return metric.gauge.value;
        }
      }
    }
    return std::nullopt;
  }
};

// The series with label job_id=`job_id` the coordinator's registry exports now.
int SeriesOfJob(prometheus::Registry& registry, const std::string& job_id) {
  int n = 0;
  for (const auto& family : registry.Collect()) {
    for (const auto& metric : family.metric) {
      for (const auto& label : metric.label) n += label.name == "job_id" && label.value == job_id;
    }
  }
  return n;
}

// ---- submit and schedule ---------------------------------------------------------------------

TEST_F(CoordinatorTest, SubmitWithoutWorkersIsPendingWithReason) {
  auto r = coord_->SubmitJob(CpuSpec("train", 2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->job_id(), MatchesRegex("train-1-[a-z][a-z2-7]{5}"));
  EXPECT_EQ(r->spec().resources().max_workers(), 2);  // defaults filled in
  EXPECT_EQ(r->spec().fault().heartbeat_timeout_ms(), 3000);

  JobStatus s = Status(r->job_id());
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  EXPECT_EQ(s.name(), "train");
  EXPECT_EQ(s.generation(), 0);
  EXPECT_EQ(s.total_steps(), 100);
  EXPECT_EQ(s.pending_reason(), "needs 2 idle CPU workers, 0 idle");
  EXPECT_NE(FindEvent(s, weft::v1::SUBMITTED), nullptr);

  EXPECT_THAT(Submit(CpuSpec("train", 1)), MatchesRegex("train-2-[a-z][a-z2-7]{5}"));  // counting
}

TEST_F(CoordinatorTest, InvalidSpecIsRejectedNamingTheFields) {
  JobSpec spec = CpuSpec("bad name", 0);
  auto r = coord_->SubmitJob(spec);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("name: "));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("resources.min_workers: "));
  auto list = coord_->ListJobs({});
  ASSERT_TRUE(list.ok());
  EXPECT_THAT(list->jobs(), IsEmpty());
}

TEST_F(CoordinatorTest, GangAssignsOnceMinWorkersAreIdle) {
  const std::string job = Submit(CpuSpec("gang", 2));
  Worker w0 = Register("h", 0);
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  EXPECT_EQ(s.pending_reason(), "needs 2 idle CPU workers, 1 idle");
  auto hb = Beat(w0);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(hb->commands(), IsEmpty());
  EXPECT_EQ(hb->heartbeat_interval_ms(), options_.heartbeat_interval_ms);

  Worker w1 = Register("h", 1);
  s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 1);
  EXPECT_EQ(s.pending_reason(), "");
  EXPECT_THAT(s.worker_ids(), ElementsAre("h/cpu0", "h/cpu1"));
  EXPECT_TRUE(s.has_start_time());
  EXPECT_NE(FindEvent(s, weft::v1::GENERATION_STARTED), nullptr);

  for (int rank = 0; rank < 2; ++rank) {
    const Worker& w = rank == 0 ? w0 : w1;
    hb = Beat(w);
    ASSERT_TRUE(hb.ok());
    auto joins = JoinCommands(*hb);
    ASSERT_THAT(joins, SizeIs(1));
    const auto& join = joins[0].join_job();
    EXPECT_EQ(join.job_id(), job);
    EXPECT_EQ(join.generation(), 1);
    EXPECT_EQ(join.rank(), rank);
    EXPECT_EQ(join.world_size(), 2);
    EXPECT_EQ(join.spec().resources().min_workers(), 2);
    EXPECT_EQ(join.spec().optimizer().beta2(), 0.95);  // the normalized spec
    EXPECT_EQ(hb->heartbeat_interval_ms(), 500);      // the job's interval while busy
    // Delivered once to a worker that got it (its heartbeats name the job from then on).
    hb = Beat(w, job, 1);
    ASSERT_TRUE(hb.ok());
    EXPECT_THAT(hb->commands(), IsEmpty());

    weft::v1::WorkerStatus ws = WorkerStatus(w.id);
    EXPECT_EQ(ws.state(), weft::v1::WORKER_BUSY);
    EXPECT_EQ(ws.job_id(), job);
    EXPECT_EQ(ws.generation(), 1);
    EXPECT_EQ(ws.rank(), rank);
  }
}

// A member whose heartbeats name no job never got its JoinJob (the answer was lost): it gets it
// again, until it has joined. GetJob names the members still to join.
TEST_F(CoordinatorTest, ALostJoinJobIsSentAgainUntilTheMemberJoins) {
  const std::string job = Submit(CpuSpec("gang", 2));
  Worker w0 = Register("h", 0);
  Worker w1 = Register("h", 1);
  EXPECT_THAT(Status(job).awaiting_join(), ElementsAre("h/cpu0", "h/cpu1"));
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto hb = Beat(w1);
    ASSERT_TRUE(hb.ok());
    auto joins = JoinCommands(*hb);
    ASSERT_THAT(joins, SizeIs(1)) << "attempt " << attempt;
    EXPECT_EQ(joins[0].join_job().rank(), 1);
    EXPECT_EQ(joins[0].join_job().generation(), 1);
  }
  auto w1_join = StartJoin(job, 1, w1);
  EXPECT_THAT(Status(job).awaiting_join(), ElementsAre("h/cpu0"));
  // Joined: whatever its heartbeats say, it had the command.
  auto hb = Beat(w1);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(JoinCommands(*hb), IsEmpty());
  hb = Beat(w0);  // w0's first, still queued: sent once
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(JoinCommands(*hb), SizeIs(1));
  auto w0_join = StartJoin(job, 1, w0);
  ASSERT_TRUE(w1_join->finished() && w0_join->finished());
  EXPECT_THAT(Status(job).awaiting_join(), IsEmpty());
}

TEST_F(CoordinatorTest, JobsOfAKindAreServedInSubmissionOrder) {
  const std::string first = Submit(CpuSpec("first", 2));
  const std::string second = Submit(CpuSpec("second", 1));
  Worker w0 = Register("h", 0);
  // One idle worker would fit "second", but "first" is ahead of it.
  EXPECT_EQ(Status(first).state(), weft::v1::PENDING);
  EXPECT_EQ(Status(second).state(), weft::v1::PENDING);
  EXPECT_THAT(Status(second).pending_reason(), HasSubstr("queued behind job " + first));
  Worker w1 = Register("h", 1);
  EXPECT_EQ(Status(first).state(), weft::v1::RUNNING);
  EXPECT_EQ(Status(second).state(), weft::v1::PENDING);
  EXPECT_EQ(Status(second).pending_reason(), "needs 1 idle CPU worker, 0 idle");
  Register("h", 2);
  EXPECT_EQ(Status(second).state(), weft::v1::RUNNING);
  EXPECT_THAT(Status(second).worker_ids(), ElementsAre("h/cpu2"));
}

TEST_F(CoordinatorTest, CpuJobIgnoresCudaWorkers) {
  const std::string job = Submit(CpuSpec("cpu-job", 1));
  Register("gpu-host", 0, weft::v1::DEVICE_KIND_CUDA);
  EXPECT_EQ(Status(job).state(), weft::v1::PENDING);
  EXPECT_EQ(Status(job).pending_reason(), "needs 1 idle CPU worker, 0 idle");
  Register("cpu-host", 0, weft::v1::DEVICE_KIND_CPU);
  EXPECT_THAT(Status(job).worker_ids(), ElementsAre("cpu-host/cpu0"));
}

TEST_F(CoordinatorTest, IdleCountsFollowWorkersAcrossDeviceKindsAndJobs) {
  // The scheduler counts idle workers by kind as states change (it does not list them on
  // every registration): a worker that re-registers under its id as another kind moves
  // between counts, and members of a job leave them and come back when it ends.
  weft::v1::WorkerInfo info;
  info.set_worker_id("flex");
  info.set_host("h");
  info.set_device_kind(weft::v1::DEVICE_KIND_CPU);
  ASSERT_TRUE(coord_->RegisterWorker(info).ok());
  JobSpec cuda_spec = CpuSpec("cuda-job", 2);
  cuda_spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  const std::string cuda_job = Submit(cuda_spec);
  EXPECT_EQ(Status(cuda_job).pending_reason(), "needs 2 idle CUDA workers, 0 idle");
  info.set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  ASSERT_TRUE(coord_->RegisterWorker(info).ok());
  EXPECT_EQ(Status(cuda_job).pending_reason(), "needs 2 idle CUDA workers, 1 idle");

  const std::string cpu_job = Submit(CpuSpec("cpu-job", 2));
  Register("h", 0);
  EXPECT_EQ(Status(cpu_job).pending_reason(), "needs 2 idle CPU workers, 1 idle");
  Register("h", 1);
  EXPECT_EQ(Status(cpu_job).state(), weft::v1::RUNNING);
  const std::string next = Submit(CpuSpec("next", 2));
  EXPECT_EQ(Status(next).pending_reason(), "needs 2 idle CPU workers, 0 idle");
  // Released members count as idle again: the waiting job takes them at once.
  ASSERT_TRUE(coord_->CancelJob(cpu_job, "make room").ok());
  EXPECT_EQ(Status(next).state(), weft::v1::RUNNING);
  EXPECT_THAT(Status(next).worker_ids(), ElementsAre("h/cpu0", "h/cpu1"));
}

TEST_F(CoordinatorTest, ManyIdleWorkersHeartbeatLessOftenWithALongerTimeout) {
  // A cap of 2 idle heartbeats a second: 2 idle workers at 500 ms would send 4, so both the
  // interval and the timeout double.
  options_.max_idle_heartbeats_per_s = 2;
  Reopen();
  Worker w0 = Register("h", 0);
  auto hb = Beat(w0);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->heartbeat_interval_ms(), 500);  // one idle worker: under the cap
  Worker w1 = Register("h", 1);
  hb = Beat(w1);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(hb->heartbeat_interval_ms(), 1000);
  // Silent past the configured timeout (3000 ms) but within the stretched one (6000 ms).
  clock_.Advance(absl::Milliseconds(5000));
  coord_->Tick();
  EXPECT_EQ(WorkerStatus(w0.id).state(), weft::v1::WORKER_IDLE);
  clock_.Advance(absl::Milliseconds(1001));
  coord_->Tick();
  EXPECT_EQ(WorkerStatus(w0.id).state(), weft::v1::WORKER_DEAD);
  EXPECT_THAT(WorkerStatus(w0.id).reason(), HasSubstr("(timeout 6000 ms)"));
}

TEST_F(CoordinatorTest, MaxWorkersCapsTheGang) {
  for (int i = 0; i < 5; ++i) Register("h", i);
  const std::string job = Submit(CpuSpec("elastic", 2, 3));
  EXPECT_THAT(Status(job).worker_ids(), ElementsAre("h/cpu0", "h/cpu1", "h/cpu2"));
  EXPECT_EQ(WorkerStatus("h/cpu3").state(), weft::v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, RanksAreContiguousPerHostByDeviceIndex) {
  const std::string job = Submit(CpuSpec("ranks", 5));
  // Registration order deliberately scrambled; device 10 sorts after 2 (numerically).
  std::vector<Worker> workers = {Register("node-b", 1), Register("node-a", 10),
                                 Register("node-b", 0), Register("node-a", 2),
                                 Register("node-a", 0)};
  JobStatus s = Status(job);
  ASSERT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_THAT(s.worker_ids(), ElementsAre("node-a/cpu0", "node-a/cpu2", "node-a/cpu10",
                                          "node-b/cpu0", "node-b/cpu1"));

  // Join confirms the ranks and reports the host-local layout.
  std::vector<std::unique_ptr<Pending<JoinResponse>>> joins;
  for (const Worker& w : workers) joins.push_back(StartJoin(job, 1, w));
  for (size_t i = 0; i < workers.size(); ++i) {
    ASSERT_TRUE(joins[i]->finished()) << workers[i].id;
    auto r = joins[i]->Get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->world_size(), 5);
    ASSERT_THAT(r->peers(), SizeIs(5));
    EXPECT_EQ(r->peers(r->rank()).worker_id(), workers[i].id);
  }
  auto b1 = joins[0]->Get();  // node-b/cpu1
  EXPECT_EQ(b1->rank(), 4);
  EXPECT_EQ(b1->local_rank(), 1);
  EXPECT_EQ(b1->local_world_size(), 2);
  auto a10 = joins[1]->Get();  // node-a/cpu10
  EXPECT_EQ(a10->rank(), 2);
  EXPECT_EQ(a10->local_rank(), 2);
  EXPECT_EQ(a10->local_world_size(), 3);
  const auto& peer = a10->peers(3);
  EXPECT_EQ(peer.rank(), 3);
  EXPECT_EQ(peer.worker_id(), "node-b/cpu0");
  EXPECT_EQ(peer.host(), "node-b");
  EXPECT_EQ(peer.device_index(), 0);
  EXPECT_EQ(peer.address(), "node-b:7000");
}

// An elastic job sharded in groups of 2 takes a whole number of groups: 4 of 5 idle workers.
TEST_F(CoordinatorTest, AGroupShardedJobTakesWholeGroups) {
  JobSpec spec = CpuSpec("groups", 2, 6);
  spec.set_zero_stage(3);
  spec.mutable_sharding()->set_scope(weft::v1::ShardingSpec::GROUP);
  spec.mutable_sharding()->set_group_size(2);
  for (int i = 0; i < 5; ++i) Register("h", i);
  const std::string job = Submit(spec);
  JobStatus s = Status(job);
  ASSERT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_THAT(s.worker_ids(), ElementsAre("h/cpu0", "h/cpu1", "h/cpu2", "h/cpu3"));
}

// Hosts are grouped by host_id, not by name: two processes of one machine that report different
// host names (a renamed host) share a host, and simulated hosts on one machine (distinct
// host_ids) do not.
TEST_F(CoordinatorTest, RanksAreContiguousPerHostId) {
  const std::string job = Submit(CpuSpec("host-ids", 4));
  struct Spec {
    const char* host;
    const char* host_id;
    int32_t index;
  };
  std::vector<Worker> workers;
  for (const Spec& spec : {Spec{"renamed", "machine-1", 1}, Spec{"same-box", "sim-b", 0},
                           Spec{"old-name", "machine-1", 0}, Spec{"same-box", "sim-a", 0}}) {
    weft::v1::WorkerInfo info;
    info.set_worker_id(absl::StrCat(spec.host_id, "/cpu", spec.index));
    info.set_host(spec.host);
    info.set_host_id(spec.host_id);
    info.set_device_index(spec.index);
    info.set_device_kind(weft::v1::DEVICE_KIND_CPU);
    auto r = coord_->RegisterWorker(info, "");
    ASSERT_TRUE(r.ok()) << r.status();
    workers.push_back({r->worker_id(), r->incarnation()});
  }
  JobStatus s = Status(job);
  ASSERT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_THAT(s.worker_ids(),
              ElementsAre("machine-1/cpu0", "machine-1/cpu1", "sim-a/cpu0", "sim-b/cpu0"));
  std::vector<std::unique_ptr<Pending<JoinResponse>>> joins;
  for (const Worker& w : workers) joins.push_back(StartJoin(job, 1, w));
  auto renamed = joins[0]->Get();  // machine-1/cpu1
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(renamed->local_rank(), 1);
  EXPECT_EQ(renamed->local_world_size(), 2);
  EXPECT_EQ(renamed->peers(0).host(), "old-name");
  EXPECT_EQ(renamed->peers(0).host_id(), "machine-1");
  auto sim_b = joins[1]->Get();
  ASSERT_TRUE(sim_b.ok()) << sim_b.status();
  EXPECT_EQ(sim_b->rank(), 3);
  EXPECT_EQ(sim_b->local_rank(), 0);
  EXPECT_EQ(sim_b->local_world_size(), 1);
}

// Two machines cloned from one disk image state the same machine id: their workers would be
// ranked as one host. The second claim of a device is refused, naming both hosts; the same
// host re-registering a device under another id is a restart and goes through.
TEST_F(CoordinatorTest, ADeviceClaimedByTwoHostsOfOneMachineIdIsRefused) {
  auto info = [](const std::string& host, const std::string& id) {
    weft::v1::WorkerInfo info;
    info.set_worker_id(id);
    info.set_host(host);
    info.set_host_id("0123456789abcdef0123456789abcdef");
    info.set_device_kind(weft::v1::DEVICE_KIND_CUDA);
    info.set_device_index(0);
    return info;
  };
  ASSERT_TRUE(coord_->RegisterWorker(info("node-a", "node-a/cuda0"), "").ok());
  auto clone = coord_->RegisterWorker(info("node-b", "node-b/cuda0"), "");
  ASSERT_EQ(clone.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(clone.status().message(),
              HasSubstr("worker node-a/cuda0 of host \"node-a\" already drives cuda0"));
  EXPECT_THAT(clone.status().message(), HasSubstr("host \"node-b\" claims too"));
  EXPECT_THAT(clone.status().message(), HasSubstr("--host-id"));
  EXPECT_TRUE(coord_->RegisterWorker(info("node-a", "renamed-worker"), "").ok());
  // Another device of the shared id, or the same device under another machine id, is fine.
  auto other_device = info("node-b", "node-b/cuda1");
  other_device.set_device_index(1);
  EXPECT_TRUE(coord_->RegisterWorker(other_device, "").ok());
  auto told_apart = info("node-b", "node-b/cuda0");
  told_apart.set_host_id("node-b");
  EXPECT_TRUE(coord_->RegisterWorker(told_apart, "").ok());
}

TEST_F(CoordinatorTest, HostIdDefaultsToHostAndIsChecked) {
  Worker w = Register("plain-host", 0);
  EXPECT_EQ(WorkerStatus(w.id).info().host_id(), "plain-host");
  weft::v1::WorkerInfo info;
  info.set_host("h");
  info.set_host_id("bad host id");
  info.set_device_kind(weft::v1::DEVICE_KIND_CPU);
  auto r = coord_->RegisterWorker(info, "");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("info.host_id: \"bad host id\""));
}

// ---- rendezvous ------------------------------------------------------------------------------

TEST_F(CoordinatorTest, PeersAreSentOnlyToCallersThatAskForThem) {
  const std::string job = Submit(CpuSpec("peers", 2));
  Worker a = Register("h", 0);
  Worker b = Register("h", 1);
  auto without = StartJoin(job, 1, a, kFar, /*include_peers=*/false);
  auto with = StartJoin(job, 1, b, kFar, /*include_peers=*/true);
  ASSERT_TRUE(without->finished() && with->finished());
  auto r0 = without->Get();
  auto r1 = with->Get();
  ASSERT_TRUE(r0.ok() && r1.ok());
  EXPECT_THAT(r0->peers(), IsEmpty());
  EXPECT_EQ(r0->rank(), 0);
  EXPECT_EQ(r0->local_world_size(), 2);
  ASSERT_THAT(r1->peers(), SizeIs(2));
  EXPECT_EQ(r1->peers(0).worker_id(), "h/cpu0");
  // After the rendezvous completed, a late Join is answered at once, peers as asked.
  auto again = StartJoin(job, 1, a, kFar, /*include_peers=*/true);
  ASSERT_TRUE(again->finished());
  EXPECT_THAT(again->Get()->peers(), SizeIs(2));
}

TEST_F(CoordinatorTest, JoinCompletesForEveryoneWhenTheLastMemberJoins) {
  const std::string job = Submit(CpuSpec("join", 3));
  std::vector<Worker> w = {Register("h", 0), Register("h", 1), Register("h", 2)};
  auto j0 = StartJoin(job, 1, w[0]);
  auto j2 = StartJoin(job, 1, w[2]);
  EXPECT_FALSE(j0->finished());
  EXPECT_FALSE(j2->finished());
  auto j1 = StartJoin(job, 1, w[1]);
  ASSERT_TRUE(j0->finished() && j1->finished() && j2->finished());
  EXPECT_EQ(j0->Get()->rank(), 0);
  EXPECT_EQ(j1->Get()->rank(), 1);
  EXPECT_EQ(j2->Get()->rank(), 2);
  EXPECT_EQ(j0->call_count(), 1);

  // A repeated Join after completion answers at once with the same group.
  auto again = StartJoin(job, 1, w[2]);
  ASSERT_TRUE(again->finished());
  EXPECT_EQ(again->Get()->rank(), 2);
  EXPECT_EQ(again->Get()->world_size(), 3);
}

TEST_F(CoordinatorTest, JoinRejectsWrongCallers) {
  const std::string job = Submit(CpuSpec("join", 1));
  Worker member = Register("h", 0);
  Worker outsider = Register("h", 1);

  auto r = StartJoin(job, 1, outsider);
  ASSERT_TRUE(r->finished());
  EXPECT_EQ(r->Get().status().code(), absl::StatusCode::kFailedPrecondition);

  r = StartJoin(job, 2, member);  // a generation that does not exist yet
  ASSERT_TRUE(r->finished());
  EXPECT_EQ(r->Get().status().code(), absl::StatusCode::kNotFound);

  r = StartJoin("nope-9", 1, member);
  ASSERT_TRUE(r->finished());
  EXPECT_EQ(r->Get().status().code(), absl::StatusCode::kNotFound);

  Worker stale = member;
  stale.incarnation += 7;
  r = StartJoin(job, 1, stale);
  ASSERT_TRUE(r->finished());
  EXPECT_EQ(r->Get().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, JoinPastItsDeadlineNamesWhoIsMissing) {
  const std::string job = Submit(CpuSpec("slow", 2));
  Worker w0 = Register("h", 0);
  Register("h", 1);
  auto j0 = StartJoin(job, 1, w0, absl::Milliseconds(5));  // real time: the timer fires it
  ASSERT_TRUE(j0->done.WaitForNotificationWithTimeout(kPatience));
  auto r = j0->Get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("1 of 2 joined"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("h/cpu1"));
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);  // the generation itself goes on
}

TEST_F(CoordinatorTest, RendezvousTimeoutEndsTheGeneration) {
  options_.rendezvous_timeout_ms = 2000;
  Reopen();
  const std::string job = Submit(CpuSpec("rdv", 2));
  Worker w0 = Register("h", 0);
  Worker w1 = Register("h", 1);
  auto j0 = StartJoin(job, 1, w0);
  AdvanceKeepingAlive(absl::Seconds(2), {w0, w1});
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);  // exactly at the timeout
  ExpectRestartedAtOnce(job, "not joined: h/cpu1");
  // The member that did join is released.
  ASSERT_TRUE(j0->finished());
  EXPECT_EQ(j0->Get().status().code(), absl::StatusCode::kAborted);
}

// ---- failures --------------------------------------------------------------------------------

TEST_F(CoordinatorTest, SilentMemberIsDeadAndJobRecovers) {
  auto [job, w] = StartRunningJob(CpuSpec("hb", 3), 3);
  auto store = coord_->GenerationStore([&] {
    weft::v1::StoreScope scope;
    scope.set_job_id(job);
    scope.set_generation(1);
    return scope;
  }());
  ASSERT_TRUE(store.ok()) << store.status();
  absl::Status store_wait;
  absl::Notification store_woken;
  (*store)->WhenAll({"never"}, [&](absl::Status s) {
    store_wait = s;
    store_woken.Notify();
  });

  // w[1] falls silent; w[0] and w[2] keep heartbeating. Exactly at the job's 3000 ms: alive.
  AdvanceKeepingAlive(absl::Milliseconds(3000), {w[0], w[2]}, job, 1);
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
  EXPECT_EQ(WorkerStatus(w[1].id).state(), weft::v1::WORKER_BUSY);

  clock_.Advance(absl::Milliseconds(1));
  coord_->Tick();
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_EQ(s.generation(), 1);
  EXPECT_THAT(s.worker_ids(), IsEmpty());
  const weft::v1::JobEvent* lost = FindEvent(s, weft::v1::WORKER_LOST);
  ASSERT_NE(lost, nullptr);
  EXPECT_THAT(lost->message(), HasSubstr("h/cpu1"));
  EXPECT_THAT(lost->message(), HasSubstr("3001 ms"));
  EXPECT_EQ(lost->generation(), 1);
  EXPECT_EQ(s.pending_reason(), "needs 3 idle CPU workers, 2 idle");
  // It went RECOVERING, and waits PENDING (not FAILED) for a third worker.
  std::vector<std::string> transitions;
  for (const auto& e : s.events()) {
    if (e.type() == weft::v1::STATE_CHANGED) transitions.push_back(e.message());
  }
  ASSERT_GE(transitions.size(), 2u);
  EXPECT_THAT(transitions[transitions.size() - 2], HasSubstr("RECOVERING"));
  EXPECT_EQ(transitions.back(), "PENDING: waiting for workers: needs 3 idle CPU workers, 2 idle");

  weft::v1::WorkerStatus dead = WorkerStatus(w[1].id);
  EXPECT_EQ(dead.state(), weft::v1::WORKER_DEAD);
  EXPECT_THAT(dead.reason(), HasSubstr("missed heartbeats"));
  EXPECT_EQ(dead.job_id(), "");

  for (int survivor : {0, 2}) {
    EXPECT_EQ(WorkerStatus(w[survivor].id).state(), weft::v1::WORKER_IDLE);
    auto hb = Beat(w[survivor], job, 1);
    ASSERT_TRUE(hb.ok());
    auto aborts = AbortCommands(*hb);
    ASSERT_THAT(aborts, SizeIs(1)) << hb->DebugString();
    EXPECT_EQ(aborts[0].abort_generation().job_id(), job);
    EXPECT_EQ(aborts[0].abort_generation().generation(), 1);
    EXPECT_THAT(aborts[0].abort_generation().reason(), HasSubstr("h/cpu1"));
  }

  // The generation's store is closed and refused from now on.
  ASSERT_TRUE(store_woken.WaitForNotificationWithTimeout(kPatience));
  EXPECT_EQ(store_wait.code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*store)->Set("k", "v").code(), absl::StatusCode::kAborted);
  weft::v1::StoreScope scope;
  scope.set_job_id(job);
  scope.set_generation(1);
  EXPECT_EQ(coord_->GenerationStore(scope).status().code(), absl::StatusCode::kAborted);
  // ReportProgress from the old generation is told to stop.
  auto progress = Report(job, 1, w[0], 0, 5);
  ASSERT_TRUE(progress.ok());
  EXPECT_FALSE(progress->continue_training());

  // The dead worker comes back: IDLE, told to abort its old generation, and generation 2
  // forms from all three.
  auto hb = Beat(w[1], job, 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(AbortCommands(*hb), Contains(::testing::Property(
                                      &Command::abort_generation,
                                      ::testing::Property(&weft::v1::AbortGenerationCommand::generation, 1))));
  s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_THAT(s.worker_ids(), ElementsAre("h/cpu0", "h/cpu1", "h/cpu2"));
  scope.set_generation(2);
  EXPECT_TRUE(coord_->GenerationStore(scope).ok());
}

// A member that dies before fetching its JoinJob must not be handed that command for the ended
// generation when it comes back.
TEST_F(CoordinatorTest, ReturningDeadMemberGetsNoStaleJoinCommand) {
  JobSpec spec = CpuSpec("stale", 2);
  spec.mutable_fault()->set_max_restarts(0);  // no generation 2 to confuse things
  const std::string job = Submit(spec);
  Worker w0 = Register("h", 0);
  Worker w1 = Register("h", 1);  // never heartbeats: its JoinJob stays queued
  ASSERT_EQ(Status(job).state(), weft::v1::RUNNING);
  AdvanceKeepingAlive(absl::Milliseconds(3001), {w0});
  ASSERT_EQ(Status(job).state(), weft::v1::FAILED);
  ASSERT_EQ(WorkerStatus(w1.id).state(), weft::v1::WORKER_DEAD);
  auto hb = Beat(w1);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(JoinCommands(*hb), IsEmpty()) << hb->DebugString();
}

TEST_F(CoordinatorTest, MemberTimeoutIsTheJobsNotTheIdleOne) {
  // Idle workers: generous; the job's 2000 ms rules its silent member.
  ExpectSilentMember(/*idle_timeout_ms=*/60000, /*job_timeout_ms=*/2000, absl::Milliseconds(2001),
                     weft::v1::PENDING, weft::v1::WORKER_DEAD);
}

TEST_F(CoordinatorTest, LongJobTimeoutKeepsSilentMemberAlive) {
  // Idle workers: strict; the job's 20 s keeps its silent member.
  ExpectSilentMember(/*idle_timeout_ms=*/1000, /*job_timeout_ms=*/20000, absl::Seconds(5),
                     weft::v1::RUNNING, weft::v1::WORKER_BUSY);
}

TEST_F(CoordinatorTest, ZeroMaxRestartsFailsOnFirstLoss) {
  JobSpec spec = CpuSpec("fragile", 2);
  spec.mutable_fault()->set_max_restarts(0);
  auto [job, w] = StartRunningJob(spec, 2);
  AdvanceKeepingAlive(absl::Milliseconds(3001), {w[1]}, job, 1);
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::FAILED);
  EXPECT_EQ(s.restarts(), 0);
  EXPECT_THAT(s.error(), HasSubstr("h/cpu0"));
  EXPECT_THAT(s.error(), HasSubstr("restart budget exhausted"));
  EXPECT_TRUE(s.has_end_time());
  EXPECT_EQ(WorkerStatus(w[1].id).state(), weft::v1::WORKER_IDLE);
  auto hb = Beat(w[1], job, 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(AbortCommands(*hb), SizeIs(1));
  // The failed job never takes workers again.
  hb = Beat(w[0]);
  ASSERT_TRUE(hb.ok());
  EXPECT_EQ(Status(job).state(), weft::v1::FAILED);
  EXPECT_THAT(JoinCommands(*hb), IsEmpty());
}

TEST_F(CoordinatorTest, RestartBudgetIsEnforcedAcrossGenerations) {
  JobSpec spec = CpuSpec("budget", 1);
  spec.mutable_fault()->set_max_restarts(1);
  auto [job, w] = StartRunningJob(spec, 1);
  auto r = ReportError(job, 1, w[0], 0, "NCCL error: unhandled system error", false);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->continue_training());
  JobStatus s = Status(job);
  // The worker is idle again, so generation 2 forms at once.
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_NE(FindEvent(s, weft::v1::RANK_ERROR), nullptr);

  r = ReportError(job, 2, w[0], 0, "NCCL error again", false);
  ASSERT_TRUE(r.ok());
  s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::FAILED);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_THAT(s.error(), HasSubstr("NCCL error again"));
  EXPECT_THAT(s.error(), HasSubstr("restart budget exhausted (1 of 1 used)"));
}

// A worker that fails two generations in a row is set aside for the cooldown: the job's next
// generation forms with the spare, and the worker is schedulable again afterwards.
TEST_F(CoordinatorTest, RepeatedlyFailingWorkerIsQuarantinedAndTheJobUsesTheSpare) {
  JobSpec spec = CpuSpec("flaky", 2);
  spec.mutable_fault()->set_max_restarts(5);
  auto [job, w] = StartRunningJob(spec, 2);
  const Worker spare = Register("h", 2);
  // Failures after the generations trained (a failure at setup is another matter:
  // SetupFailureWithASpareChangesThePlacementWithoutARestart).
  ASSERT_TRUE(Report(job, 1, w[0], 0, 1).ok());
  ASSERT_TRUE(ReportError(job, 1, w[0], 0, "Gloo connect failed", false).ok());
  // One failure: w0 is still given the job (it is first in rank order).
  JobStatus s = Status(job);
  ASSERT_EQ(s.generation(), 2);
  EXPECT_THAT(s.worker_ids(), ElementsAre(w[0].id, w[1].id));
  EXPECT_EQ(FindEvent(s, weft::v1::WORKER_QUARANTINED), nullptr);

  ASSERT_TRUE(Report(job, 2, w[0], 0, 1).ok());  // step 1 again: no progress past the last
  ASSERT_TRUE(ReportError(job, 2, w[0], 0, "Gloo connect failed again", false).ok());
  s = Status(job);
  const weft::v1::JobEvent* quarantined = FindEvent(s, weft::v1::WORKER_QUARANTINED);
  ASSERT_NE(quarantined, nullptr);
  EXPECT_THAT(quarantined->message(), HasSubstr(w[0].id));
  EXPECT_THAT(quarantined->message(), HasSubstr("2 failed generations in a row"));
  EXPECT_THAT(quarantined->message(), HasSubstr("Gloo connect failed again"));
  EXPECT_EQ(s.generation(), 3);
  EXPECT_THAT(s.worker_ids(), ElementsAre(w[1].id, spare.id));
  EXPECT_THAT(WorkerStatus(w[0].id).reason(), HasSubstr("quarantined until"));

  // While quarantined it is passed over for a healthy idle worker, although it comes first in
  // rank order...
  const Worker fresh = Register("h", 3);
  const std::string other = Submit(CpuSpec("other", 1));
  EXPECT_THAT(Status(other).worker_ids(), ElementsAre(fresh.id));
  // ...but a job that cannot start without it gets it rather than wait (no starvation).
  const std::string needy = Submit(CpuSpec("needy", 1));
  EXPECT_THAT(Status(needy).worker_ids(), ElementsAre(w[0].id));
}

// A generation that fails before it trained a step, on one member's error, failed at setup,
// which a placement without that member may not (two workers of one GPU, a device in a bad
// state): with a spare, the member is set aside at once and the job placed without it, and no
// restart is spent.
TEST_F(CoordinatorTest, SetupFailureWithASpareChangesThePlacementWithoutARestart) {
  auto [job, w] = StartRunningJob(CpuSpec("setup", 2), 2);
  const Worker spare = Register("h", 2);
  ASSERT_TRUE(ReportError(job, 1, w[1], 1, "ncclCommInitRank: Duplicate GPU detected", false)
                  .ok());
  JobStatus s = Status(job);
  EXPECT_EQ(s.restarts(), 0);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
  EXPECT_THAT(s.worker_ids(), ElementsAre(w[0].id, spare.id));
  EXPECT_NE(FindEvent(s, weft::v1::RANK_ERROR, "failed at setup: worker h/cpu1 is set aside"),
            nullptr)
      << s.DebugString();
  EXPECT_NE(FindEvent(s, weft::v1::WORKER_QUARANTINED, "h/cpu1"), nullptr) << s.DebugString();

  // Once a generation trained, a failure is an ordinary one: a restart.
  ASSERT_TRUE(Report(job, 2, w[0], 0, 3).ok());
  ASSERT_TRUE(ReportError(job, 2, spare, 1, "Gloo connect failed", false).ok());
  s = Status(job);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_EQ(s.generation(), 3);
}

// Without a placement that leaves the member out, the same placement comes again: that costs
// a restart, as does a job's setup failure past its allowance (max_restarts of them).
TEST_F(CoordinatorTest, SetupFailureWithoutAnotherPlacementSpendsARestart) {
  JobSpec spec = CpuSpec("setup-alone", 2);
  spec.mutable_fault()->set_max_restarts(1);
  auto [job, w] = StartRunningJob(spec, 2);
  ASSERT_TRUE(ReportError(job, 1, w[1], 1, "device busy", false).ok());
  JobStatus s = Status(job);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_EQ(s.generation(), 2);
  EXPECT_NE(FindEvent(s, weft::v1::RANK_ERROR, "no placement without worker h/cpu1"), nullptr)
      << s.DebugString();

  const std::string other = Submit([] {
    JobSpec o = CpuSpec("setup-spares", 1);
    o.mutable_fault()->set_max_restarts(1);
    return o;
  }());
  ASSERT_TRUE(coord_->CancelJob(job, "make room").ok());
  const Worker extra = Register("h", 3);
  // `other` runs on one of the three idle workers; each setup failure with spares left is free
  // once (max_restarts = 1), the next one spends the restart.
  s = Status(other);
  ASSERT_EQ(s.state(), weft::v1::RUNNING) << s.DebugString();
  Worker first{s.worker_ids(0), 0};
  ASSERT_TRUE(ReportError(other, 1, first, 0, "device busy", false).ok());
  s = Status(other);
  EXPECT_EQ(s.restarts(), 0) << s.DebugString();
  ASSERT_EQ(s.generation(), 2);
  Worker second{s.worker_ids(0), 0};
  EXPECT_NE(second.id, first.id);
  ASSERT_TRUE(ReportError(other, 2, second, 0, "device lost", false).ok());
  s = Status(other);
  EXPECT_EQ(s.restarts(), 1) << s.DebugString();
  EXPECT_NE(FindEvent(s, weft::v1::RANK_ERROR, "as many as it may"), nullptr) << s.DebugString();
  (void)extra;
}

TEST(DecideSetupFailureTest, FreeOnlyBeforeTrainingWithAnotherPlacementAndAllowanceLeft) {
  SetupFailureView view{.worker_id = "w", .trained = false, .permanent = false,
                        .others_available = 2, .min_workers = 2, .free_so_far = 0,
                        .max_free = 3};
  SetupFailureDecision d = DecideSetupFailure(view);
  EXPECT_TRUE(d.setup && d.free);
  EXPECT_THAT(d.reason, HasSubstr("worker w is set aside"));
  EXPECT_THAT(d.reason, HasSubstr("(1 of 3)"));
  view.others_available = 1;
  d = DecideSetupFailure(view);
  EXPECT_TRUE(d.setup);
  EXPECT_FALSE(d.free);
  view.others_available = 2;
  view.free_so_far = 3;
  EXPECT_FALSE(DecideSetupFailure(view).free);
  view.free_so_far = 0;
  view.trained = true;
  EXPECT_FALSE(DecideSetupFailure(view).setup);
  view.trained = false;
  view.permanent = true;
  EXPECT_FALSE(DecideSetupFailure(view).setup);
}

TEST_F(CoordinatorTest, QuarantineEndsAfterTheCooldown) {
  JobSpec spec = CpuSpec("flaky2", 1);
  spec.mutable_fault()->set_max_restarts(5);
  auto [job, w] = StartRunningJob(spec, 1);
  const Worker spare = Register("h", 1);
  ASSERT_TRUE(Report(job, 1, w[0], 0, 1).ok());
  ASSERT_TRUE(ReportError(job, 1, w[0], 0, "boom", false).ok());   // gen 2: w0 again
  ASSERT_TRUE(Report(job, 2, w[0], 0, 1).ok());
  ASSERT_TRUE(ReportError(job, 2, w[0], 0, "boom", false).ok());   // quarantined; gen 3: spare
  ASSERT_THAT(Status(job).worker_ids(), ElementsAre(spare.id));
  ASSERT_TRUE(coord_->CancelJob(job, "done").ok());
  // Both idle now; the quarantined one is passed over until the cooldown (60 s) ends.
  AdvanceKeepingAlive(absl::Seconds(30), {w[0], spare});
  const std::string a = Submit(CpuSpec("a", 1));
  EXPECT_THAT(Status(a).worker_ids(), ElementsAre(spare.id));
  ASSERT_TRUE(coord_->CancelJob(a, "done").ok());
  AdvanceKeepingAlive(absl::Seconds(31), {w[0], spare});
  // Cooldown over: w0 is an ordinary idle worker again, first in rank order.
  const std::string b = Submit(CpuSpec("b", 1));
  EXPECT_EQ(Status(b).state(), weft::v1::RUNNING);
  EXPECT_THAT(Status(b).worker_ids(), ElementsAre(w[0].id));
}

// Progress in between resets the count: two failures far apart are not "repeated".
TEST_F(CoordinatorTest, ProgressBetweenFailuresAvoidsQuarantine) {
  JobSpec spec = CpuSpec("ok-flaky", 2);
  spec.mutable_fault()->set_max_restarts(5);
  auto [job, w] = StartRunningJob(spec, 2);
  ASSERT_TRUE(ReportError(job, 1, w[0], 0, "transient", false).ok());
  ASSERT_EQ(Status(job).generation(), 2);
  std::vector<std::unique_ptr<Pending<JoinResponse>>> joins;
  for (const Worker& x : w) {
    ASSERT_TRUE(Beat(x).ok());
    joins.push_back(StartJoin(job, 2, x));
  }
  ASSERT_TRUE(Report(job, 2, w[0], 0, 5).ok());  // generation 2 trains
  ASSERT_TRUE(ReportError(job, 2, w[0], 0, "transient again", false).ok());
  const JobStatus s = Status(job);
  EXPECT_EQ(FindEvent(s, weft::v1::WORKER_QUARANTINED), nullptr);
  EXPECT_EQ(s.generation(), 3);
  EXPECT_THAT(s.worker_ids(), ElementsAre(w[0].id, w[1].id));
}

TEST_F(CoordinatorTest, PermanentRankErrorFailsWithoutRestart) {
  auto [job, w] = StartRunningJob(CpuSpec("perm", 2), 2);
  auto r = ReportError(job, 1, w[1], 1, "cannot open /data/tiny.txt: No such file", true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->continue_training());
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::FAILED);
  EXPECT_EQ(s.restarts(), 0);
  EXPECT_THAT(s.error(), HasSubstr("rank 1 (worker h/cpu1): cannot open /data/tiny.txt"));
  EXPECT_THAT(s.error(), HasSubstr("permanent"));
  const weft::v1::JobEvent* e = FindEvent(s, weft::v1::RANK_ERROR);
  ASSERT_NE(e, nullptr);
  EXPECT_THAT(e->message(), HasSubstr("No such file"));
  // Both members are released; the other one is told to abort.
  EXPECT_EQ(WorkerStatus(w[0].id).state(), weft::v1::WORKER_IDLE);
  EXPECT_EQ(WorkerStatus(w[1].id).state(), weft::v1::WORKER_IDLE);
  auto hb = Beat(w[0], job, 1);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(AbortCommands(*hb), SizeIs(1));
}

// A rank error that ends two generations in a row word for word, from two workers, is the
// job's: the second fails it although restarts are left, and blames no worker. (From one worker
// twice it is that worker's, possibly: QuarantineEndsAfterTheCooldown.)
TEST_F(CoordinatorTest, TheSameRankErrorTwiceInARowFailsTheJob) {
  JobSpec spec = CpuSpec("det", 2);
  spec.mutable_fault()->set_max_restarts(5);
  auto [job, w] = StartRunningJob(spec, 2);
  const std::string error = "step 12: CUDA kernel rmsnorm_backward: an illegal memory access";
  ASSERT_TRUE(ReportError(job, 1, w[1], 1, error, false).ok());
  ASSERT_EQ(Status(job).generation(), 2);  // restarted on the same two workers
  ASSERT_EQ(Status(job).restarts(), 1);
  std::vector<std::unique_ptr<Pending<JoinResponse>>> joins;
  for (const Worker& x : w) {
    ASSERT_TRUE(Beat(x).ok());
    joins.push_back(StartJoin(job, 2, x));
  }
  ASSERT_TRUE(ReportError(job, 2, w[0], 0, error, false).ok());
  const JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::FAILED);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_THAT(s.error(), HasSubstr("illegal memory access"));
  EXPECT_THAT(s.error(), HasSubstr("same error on worker h/cpu1"));
  EXPECT_THAT(s.error(), HasSubstr("permanent error: not retried"));
  EXPECT_EQ(FindEvent(s, weft::v1::WORKER_QUARANTINED), nullptr);
}

TEST_F(CoordinatorTest, StallEndsTheGeneration) {
  JobSpec spec = CpuSpec("stall", 1);
  spec.mutable_fault()->set_stall_timeout_ms(5000);
  auto [job, w] = StartRunningJob(spec, 1);
  AdvanceKeepingAlive(absl::Seconds(4), w, job, 1);
  ASSERT_TRUE(Report(job, 1, w[0], 0, 1).ok());  // progress resets the stall clock
  AdvanceKeepingAlive(absl::Seconds(5), w, job, 1);
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
  ASSERT_TRUE(Report(job, 1, w[0], 0, 1).ok());  // the same step again is not progress
  ExpectRestartedAtOnce(job, "made no progress for 5001 ms");
}

TEST_F(CoordinatorTest, ElasticJobRestartsOnSurvivorsWithinMinMax) {
  // Workers first: a job of min 2 would otherwise start as soon as two were idle.
  std::vector<Worker> w = {Register("h", 0), Register("h", 1), Register("h", 2)};
  const std::string job = Submit(CpuSpec("elastic", 2, 3));
  ASSERT_THAT(Status(job).worker_ids(), SizeIs(3));
  for (const Worker& worker : w) ASSERT_THAT(JoinCommands(*Beat(worker)), SizeIs(1));
  AdvanceKeepingAlive(absl::Milliseconds(3001), {w[0], w[1]}, job, 1);
  JobStatus s = Status(job);
  // Two survivors >= min_workers: generation 2 forms in the same tick, without the dead one.
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
  EXPECT_EQ(s.restarts(), 1);
  EXPECT_THAT(s.worker_ids(), ElementsAre("h/cpu0", "h/cpu1"));
  auto hb = Beat(w[0], job, 1);
  ASSERT_TRUE(hb.ok());
  auto joins = JoinCommands(*hb);
  ASSERT_THAT(joins, SizeIs(1));
  EXPECT_EQ(joins[0].join_job().world_size(), 2);
  EXPECT_EQ(joins[0].join_job().generation(), 2);
}

TEST_F(CoordinatorTest, EventsAreCappedKeepingTheNewest) {
  options_.max_events_per_job = 4;
  Reopen();
  JobSpec spec = CpuSpec("chatty", 1);
  spec.mutable_fault()->set_max_restarts(10);
  auto [job, w] = StartRunningJob(spec, 1);
  for (int gen = 1; gen <= 3; ++gen) {
    ASSERT_TRUE(ReportError(job, gen, w[0], 0, absl::StrCat("boom ", gen), false).ok());
  }
  JobStatus s = Status(job);
  EXPECT_EQ(s.generation(), 4);
  ASSERT_THAT(s.events(), SizeIs(4));
  EXPECT_EQ(s.events(3).type(), weft::v1::STATE_CHANGED);
  EXPECT_EQ(s.events(3).state(), weft::v1::RUNNING);
  EXPECT_EQ(s.events(3).generation(), 4);
  EXPECT_EQ(FindEvent(s, weft::v1::SUBMITTED), nullptr);  // the oldest were dropped
}

TEST_F(CoordinatorTest, IdleWorkerSilentPastTimeoutIsDeadUntilItHeartbeats) {
  Worker w = Register("h", 0);
  clock_.Advance(absl::Milliseconds(options_.heartbeat_timeout_ms));
  coord_->Tick();
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);  // exactly at the timeout
  clock_.Advance(absl::Milliseconds(1));
  coord_->Tick();
  weft::v1::WorkerStatus s = WorkerStatus(w.id);
  EXPECT_EQ(s.state(), weft::v1::WORKER_DEAD);
  EXPECT_THAT(s.reason(), HasSubstr("missed heartbeats for 3001 ms"));

  // A dead worker is not scheduled.
  const std::string job = Submit(CpuSpec("wait", 1));
  EXPECT_EQ(Status(job).state(), weft::v1::PENDING);
  EXPECT_EQ(Status(job).pending_reason(), "needs 1 idle CPU worker, 0 idle");

  // Its next heartbeat brings it back, and the waiting job takes it at once.
  auto hb = Beat(w);
  ASSERT_TRUE(hb.ok());
  EXPECT_THAT(JoinCommands(*hb), SizeIs(1));
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_BUSY);
}

TEST_F(CoordinatorTest, DeadIdleWorkerComesBackIdle) {
  Worker w = Register("h", 0);
  clock_.Advance(absl::Milliseconds(options_.heartbeat_timeout_ms + 1));
  coord_->Tick();
  ASSERT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_DEAD);
  ASSERT_TRUE(Beat(w).ok());
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);
  // And is judged from its new heartbeat on.
  clock_.Advance(absl::Milliseconds(options_.heartbeat_timeout_ms));
  coord_->Tick();
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, ReregistrationOfABusyWorkerEndsItsGeneration) {
  auto [job, w] = StartRunningJob(CpuSpec("rereg", 2), 2);
  Worker again = Register("h", 1);  // the process restarted
  EXPECT_EQ(again.incarnation, w[1].incarnation + 1);
  JobStatus s = Status(job);
  const weft::v1::JobEvent* lost = FindEvent(s, weft::v1::WORKER_LOST);
  ASSERT_NE(lost, nullptr);
  EXPECT_THAT(lost->message(), HasSubstr("h/cpu1 re-registered"));
  EXPECT_EQ(s.restarts(), 1);
  // Both are idle again, so generation 2 forms at once.
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
  // The old incarnation is told to stop.
  auto old_hb = Beat(w[1]);
  ASSERT_TRUE(old_hb.ok());
  ASSERT_THAT(old_hb->commands(), SizeIs(1));
  EXPECT_TRUE(old_hb->commands(0).has_stop());
  auto hb = Beat(again);
  ASSERT_TRUE(hb.ok());
  ASSERT_THAT(JoinCommands(*hb), SizeIs(1));
  EXPECT_EQ(JoinCommands(*hb)[0].join_job().generation(), 2);
  // The survivor hears about both generations: abort 1, join 2.
  hb = Beat(w[0], job, 1);
  ASSERT_TRUE(hb.ok());
  ASSERT_THAT(hb->commands(), SizeIs(2));
  EXPECT_EQ(hb->commands(0).abort_generation().generation(), 1);
  EXPECT_EQ(hb->commands(1).join_job().generation(), 2);
}

// ---- progress, completion, cancel ------------------------------------------------------------

TEST_F(CoordinatorTest, ProgressUpdatesStepAndMetrics) {
  auto [job, w] = StartRunningJob(CpuSpec("progress", 2), 2);
  auto r = Report(job, 1, w[0], 0, 5);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->continue_training());
  JobStatus s = Status(job);
  EXPECT_EQ(s.step(), 5);
  EXPECT_EQ(s.last_metrics().step(), 5);
  EXPECT_DOUBLE_EQ(s.last_metrics().loss(), 4.95);
  EXPECT_DOUBLE_EQ(s.last_metrics().tokens_per_s(), 1234.5);
  EXPECT_TRUE(s.last_metrics().has_time());

  // A late, older report does not move the step back.
  ASSERT_TRUE(Report(job, 1, w[0], 0, 3).ok());
  EXPECT_EQ(Status(job).step(), 5);

  // Wrong rank for the worker.
  EXPECT_EQ(Report(job, 1, w[1], 0, 6).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Report("nope-1", 1, w[0], 0, 6).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, CheckpointCommittedEventSaysTheStallAndRankZerosUploadRate) {
  JobSpec spec = CpuSpec("ckpt", 2);
  // GPT-2 1.5B: 1,557,686,400 parameters; rank 0 of 2 writes 12 bytes for each of half.
  spec.mutable_model()->set_num_layers(48);
  spec.mutable_model()->set_hidden_size(1600);
  spec.mutable_model()->set_num_heads(25);
  spec.mutable_model()->set_vocab_size(50304);
  spec.mutable_model()->set_context_length(1024);
  auto [job, w] = StartRunningJob(spec, 2);
  weft::v1::ReportProgressRequest request = EmptyReport(job, 1, w[0], 0);
  request.set_checkpoint_step(100);
  request.set_checkpoint_stall_ms(410);
  request.set_checkpoint_save_ms(12300);
  ASSERT_TRUE(coord_->ReportProgress(request).ok());

  const JobStatus s = Status(job);
  EXPECT_EQ(s.checkpoint_step(), 100);
  const weft::v1::JobEvent* event = FindEvent(s, weft::v1::CHECKPOINT_COMMITTED);
  ASSERT_NE(event, nullptr) << s.DebugString();
  EXPECT_EQ(event->message(),
            "checkpoint at step 100 committed: training stalled 410.0 ms; rank 0 uploaded "
            "9.35 GB and committed in 12.30 s (0.76 GB/s)");
}

// A save that failed on any rank becomes a CHECKPOINT_FAILED event naming the step, the rank
// and the reason; the job keeps running and its newest committed checkpoint is unchanged.
TEST_F(CoordinatorTest, FailedSaveOfAnyRankIsAJobEvent) {
  auto [job, w] = StartRunningJob(CpuSpec("ckpt-fail", 2), 2);
  weft::v1::ReportProgressRequest request = EmptyReport(job, 1, w[1], 1);
  request.set_checkpoint_failed_step(150);
  request.set_checkpoint_failure("checkpointd at 127.0.0.1:9 unreachable: connection refused");
  auto r = coord_->ReportProgress(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->continue_training());

  const JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.checkpoint_step(), 0);
  const weft::v1::JobEvent* event = FindEvent(s, weft::v1::CHECKPOINT_FAILED);
  ASSERT_NE(event, nullptr) << s.DebugString();
  EXPECT_EQ(event->message(),
            absl::StrCat("checkpoint at step 150 not saved by rank 1 (worker ", w[1].id,
                         "): checkpointd at 127.0.0.1:9 unreachable: connection refused"));
  // A report without a failure adds none.
  request.clear_checkpoint_failure();
  request.clear_checkpoint_failed_step();
  ASSERT_TRUE(coord_->ReportProgress(request).ok());
  int failed = 0;
  const JobStatus later = Status(job);
  for (const auto& e : later.events()) failed += e.type() == weft::v1::CHECKPOINT_FAILED;
  EXPECT_EQ(failed, 1);
}

// Every rank whose part of a save failed reports it (rank 0 too, when its commit is given up):
// the job gets one CHECKPOINT_FAILED event per checkpoint, the first report's; a later
// checkpoint's failure is an event of its own.
TEST_F(CoordinatorTest, FailedSaveReportedByEveryRankIsOneEvent) {
  auto [job, w] = StartRunningJob(CpuSpec("ckpt-fail-once", 3), 3);
  auto report_failure = [&, &job = job, &w = w](int rank, int64_t step, const std::string& why) {
    weft::v1::ReportProgressRequest request = EmptyReport(job, 1, w[rank], rank);
    request.set_checkpoint_failed_step(step);
    request.set_checkpoint_failure(why);
    auto r = coord_->ReportProgress(request);
    ASSERT_TRUE(r.ok()) << r.status();
  };
  report_failure(1, 150, "no room on the checkpoint store's disk");
  report_failure(2, 150, "no room on the checkpoint store's disk");
  report_failure(0, 150, "rank 1 did not store its shard: the checkpoint is not committed");
  report_failure(2, 300, "checkpointd at 127.0.0.1:9 unreachable");
  report_failure(0, 300, "rank 2 did not store its shard: the checkpoint is not committed");
  const JobStatus s = Status(job);
  std::vector<std::string> failed;
  for (const auto& e : s.events()) {
    if (e.type() == weft::v1::CHECKPOINT_FAILED) failed.push_back(e.message());
  }
  ASSERT_EQ(failed.size(), 2u) << absl::StrJoin(failed, "\n");
  EXPECT_THAT(failed[0], HasSubstr("checkpoint at step 150 not saved by rank 1"));
  EXPECT_THAT(failed[1], HasSubstr("checkpoint at step 300 not saved by rank 2"));
}

TEST_F(CoordinatorTest, FinishedFromRankZeroSucceedsAndReleasesWorkers) {
  auto [job, w] = StartRunningJob(CpuSpec("done", 2), 2);
  ASSERT_TRUE(Report(job, 1, w[0], 0, 99).ok());
  // Only rank 0 may finish the job.
  auto r = Report(job, 1, w[1], 1, 0, /*finished=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->continue_training());
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);

  r = Report(job, 1, w[0], 0, 100, /*finished=*/true);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->continue_training());
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::SUCCEEDED);
  EXPECT_EQ(s.step(), 100);
  EXPECT_EQ(s.error(), "");
  EXPECT_TRUE(s.has_end_time());
  EXPECT_THAT(s.worker_ids(), IsEmpty());
  for (const Worker& worker : w) {
    EXPECT_EQ(WorkerStatus(worker.id).state(), weft::v1::WORKER_IDLE);
    auto hb = Beat(worker);
    ASSERT_TRUE(hb.ok());
    EXPECT_THAT(AbortCommands(*hb), IsEmpty());  // a completed generation is not aborted
  }
  weft::v1::StoreScope scope;
  scope.set_job_id(job);
  scope.set_generation(1);
  EXPECT_EQ(coord_->GenerationStore(scope).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(coord_->CancelJob(job, "").status().code(), absl::StatusCode::kFailedPrecondition);

  // The released workers serve the next job.
  const std::string next = Submit(CpuSpec("next", 2));
  EXPECT_EQ(Status(next).state(), weft::v1::RUNNING);
}

TEST_F(CoordinatorTest, CancelRunningJobAbortsMembers) {
  auto [job, w] = StartRunningJob(CpuSpec("cancel", 2), 2);
  auto r = coord_->CancelJob(job, "wrong learning rate");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), weft::v1::CANCELLED);
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::CANCELLED);
  EXPECT_TRUE(s.has_end_time());
  EXPECT_NE(FindEvent(s, weft::v1::CANCEL_REQUESTED), nullptr);
  for (const Worker& worker : w) {
    EXPECT_EQ(WorkerStatus(worker.id).state(), weft::v1::WORKER_IDLE);
    auto hb = Beat(worker, job, 1);
    ASSERT_TRUE(hb.ok());
    auto aborts = AbortCommands(*hb);
    ASSERT_THAT(aborts, SizeIs(1));
    EXPECT_EQ(aborts[0].abort_generation().generation(), 1);
    EXPECT_THAT(aborts[0].abort_generation().reason(), HasSubstr("wrong learning rate"));
  }
  weft::v1::StoreScope scope;
  scope.set_job_id(job);
  scope.set_generation(1);
  EXPECT_EQ(coord_->GenerationStore(scope).status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(coord_->CancelJob(job, "").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coord_->CancelJob("nope-3", "").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, CancelPendingJobAndParkedJoin) {
  const std::string pending = Submit(CpuSpec("pending", 4));
  ASSERT_EQ(Status(pending).pending_reason(), "needs 4 idle CPU workers, 0 idle");
  auto r = coord_->CancelJob(pending, "");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->state(), weft::v1::CANCELLED);
  EXPECT_EQ(r->pending_reason(), "");
  EXPECT_EQ(r->error(), "");

  const std::string job = Submit(CpuSpec("joining", 2));
  Worker w0 = Register("h", 0);
  Register("h", 1);
  auto j0 = StartJoin(job, 1, w0);
  ASSERT_FALSE(j0->finished());
  ASSERT_TRUE(coord_->CancelJob(job, "").ok());
  ASSERT_TRUE(j0->finished());
  EXPECT_EQ(j0->Get().status().code(), absl::StatusCode::kAborted);
  auto late = StartJoin(job, 1, w0);
  ASSERT_TRUE(late->finished());
  EXPECT_EQ(late->Get().status().code(), absl::StatusCode::kAborted);
}

// ---- heartbeats ------------------------------------------------------------------------------

TEST_F(CoordinatorTest, UnknownWorkerMustRegisterAndStaleIncarnationMustStop) {
  Worker ghost{"nobody/cpu0", 1};
  auto unknown = Beat(ghost);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("register again"));
  Worker w = Register("h", 0);
  Worker ahead{w.id, w.incarnation + 1};  // an incarnation this coordinator never issued
  EXPECT_EQ(Beat(ahead).status().code(), absl::StatusCode::kFailedPrecondition);

  // A held heartbeat of the first process is answered Stop when a second one registers.
  weft::v1::HeartbeatRequest request;
  request.set_worker_id(w.id);
  request.set_incarnation(w.incarnation);
  request.set_wait_for_command_ms(60000);
  Pending<HeartbeatResponse> held;
  coord_->Heartbeat(request, absl::Now() + kFar, held.Callback());
  ASSERT_FALSE(held.finished());
  Worker w2 = Register("h", 0);  // same id again
  EXPECT_EQ(w.id, w2.id);
  EXPECT_EQ(w2.incarnation, w.incarnation + 1);
  ASSERT_TRUE(held.finished());
  ASSERT_TRUE(held.Get().ok());
  ASSERT_THAT(held.Get()->commands(), SizeIs(1));
  EXPECT_THAT(held.Get()->commands(0).stop().reason(), HasSubstr("registered again"));

  auto stale = Beat(w);
  ASSERT_TRUE(stale.ok()) << stale.status();
  ASSERT_THAT(stale->commands(), SizeIs(1));
  EXPECT_TRUE(stale->commands(0).has_stop());
  auto current = Beat(w2);
  ASSERT_TRUE(current.ok());
  EXPECT_THAT(current->commands(), IsEmpty());
}

TEST_F(CoordinatorTest, RegisterValidatesWorkerInfo) {
  weft::v1::WorkerInfo info;
  info.set_device_index(-1);
  auto r = coord_->RegisterWorker(info);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("info.host: required"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("info.device_kind"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("info.device_index"));

  info.set_host("h");
  info.set_device_index(3);
  info.set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  info.set_worker_id("bad id!");
  EXPECT_EQ(coord_->RegisterWorker(info).status().code(), absl::StatusCode::kInvalidArgument);
  info.clear_worker_id();
  r = coord_->RegisterWorker(info);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->worker_id(), "h/cuda3");
}

TEST_F(CoordinatorTest, HeldHeartbeatIsAnsweredWhenACommandArrives) {
  Worker w = Register("h", 0);
  weft::v1::HeartbeatRequest request;
  request.set_worker_id(w.id);
  request.set_incarnation(w.incarnation);
  request.set_wait_for_command_ms(60000);  // clamped to the 500 ms interval, real time
  Pending<HeartbeatResponse> held;
  coord_->Heartbeat(request, absl::Now() + kFar, held.Callback());
  EXPECT_FALSE(held.finished());
  const std::string job = Submit(CpuSpec("wake", 1));
  ASSERT_TRUE(held.finished());  // answered inline by the assignment
  auto r = held.Get();
  ASSERT_TRUE(r.ok());
  ASSERT_THAT(JoinCommands(*r), SizeIs(1));
  EXPECT_EQ(JoinCommands(*r)[0].join_job().job_id(), job);
  EXPECT_EQ(held.call_count(), 1);
}

TEST_F(CoordinatorTest, HeldHeartbeatTimesOutEmptyAndNewerOneSupersedes) {
  Worker w = Register("h", 0);
  weft::v1::HeartbeatRequest request;
  request.set_worker_id(w.id);
  request.set_incarnation(w.incarnation);
  request.set_wait_for_command_ms(5);
  Pending<HeartbeatResponse> held;
  coord_->Heartbeat(request, absl::Now() + kFar, held.Callback());
  ASSERT_TRUE(held.done.WaitForNotificationWithTimeout(kPatience));
  ASSERT_TRUE(held.Get().ok());
  EXPECT_THAT(held.Get()->commands(), IsEmpty());

  request.set_wait_for_command_ms(60000);
  Pending<HeartbeatResponse> first;
  coord_->Heartbeat(request, absl::Now() + kFar, first.Callback());
  EXPECT_FALSE(first.finished());
  ASSERT_TRUE(Beat(w).ok());
  ASSERT_TRUE(first.finished());  // superseded: answered, empty
  ASSERT_TRUE(first.Get().ok());
  EXPECT_THAT(first.Get()->commands(), IsEmpty());
}

TEST_F(CoordinatorTest, ShutdownAnswersParkedCallsUnavailable) {
  const std::string job = Submit(CpuSpec("sd", 2));
  Worker w0 = Register("h", 0);
  Worker w1 = Register("h2", 0, weft::v1::DEVICE_KIND_CUDA);
  Register("h", 1);
  auto join = StartJoin(job, 1, w0);
  weft::v1::HeartbeatRequest request;
  request.set_worker_id(w1.id);
  request.set_incarnation(w1.incarnation);
  request.set_wait_for_command_ms(60000);
  Pending<HeartbeatResponse> held;
  coord_->Heartbeat(request, absl::Now() + kFar, held.Callback());
  ASSERT_FALSE(held.finished());
  ASSERT_FALSE(join->finished());
  coord_->Shutdown();
  ASSERT_TRUE(held.finished());
  EXPECT_EQ(held.Get().status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(join->finished());
  EXPECT_EQ(join->Get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(coord_->SubmitJob(CpuSpec("late", 1)).status().code(),
            absl::StatusCode::kUnavailable);
}

// ---- sessions --------------------------------------------------------------------------------

// What SessionEnd callbacks were called with.
// The ends of the sessions it gave callbacks to. The coordinator outlives a test's locals (it
// is the fixture's) and ends every open session when destroyed: a callback must not point
// into a SessionEnds already gone, so they share the list.
struct SessionEnds {
  std::shared_ptr<std::vector<absl::Status>> ends = std::make_shared<std::vector<absl::Status>>();
  std::vector<absl::Status>& statuses = *ends;
  Coordinator::SessionEnd Callback() {
    return [ends = ends](absl::Status s) { ends->push_back(s); };
  }
};

// A dropped session (the process exited) ends the generation after the 1 s grace, although
// the job's heartbeat timeout is 30 s and the survivors heartbeat on.
TEST_F(CoordinatorTest, ClosedSessionIsDeadAfterTheGraceNotTheHeartbeatTimeout) {
  JobSpec spec = CpuSpec("sess", 2);
  spec.mutable_fault()->set_heartbeat_timeout_ms(30000);
  SessionEnds ends;
  auto session = coord_->OpenSession("token-1", ends.Callback());
  ASSERT_TRUE(session.ok()) << session.status();
  auto [job, w] = StartRunningJob(spec, 2, {"", "token-1"});  // h/cpu1 holds the session
  coord_->SessionClosed("token-1", *session);
  AdvanceKeepingAlive(absl::Milliseconds(1000), {w[0]}, job, 1);
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);  // exactly at the grace: not yet
  clock_.Advance(absl::Milliseconds(1));
  coord_->Tick();
  const JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  // A dropped session is its own failure kind (issue 12), not a missed heartbeat.
  EXPECT_EQ(FindEvent(s, weft::v1::WORKER_LOST), nullptr);
  const weft::v1::JobEvent* lost = FindEvent(s, weft::v1::CONNECTION_LOST);
  ASSERT_NE(lost, nullptr);
  EXPECT_THAT(lost->message(), HasSubstr("h/cpu1"));
  EXPECT_THAT(lost->message(), HasSubstr("lost its connection 1001 ms ago"));
  EXPECT_THAT(ends.statuses, IsEmpty());  // the transport ended it, not the coordinator
}

// A live worker whose connection broke reopens its session within the grace: not dead. Without
// the reopen, heartbeats alone do not keep it: the connection is what the session proves.
TEST_F(CoordinatorTest, SessionReopenedWithinTheGraceKeepsTheWorker) {
  SessionEnds ends;
  auto first = coord_->OpenSession("tok", ends.Callback());
  ASSERT_TRUE(first.ok());
  Worker w = Register("h", 0, weft::v1::DEVICE_KIND_CPU, "tok");
  coord_->SessionClosed("tok", *first);
  AdvanceKeepingAlive(absl::Milliseconds(900), {w});
  auto second = coord_->OpenSession("tok", ends.Callback());
  ASSERT_TRUE(second.ok());
  EXPECT_GT(*second, *first);
  AdvanceKeepingAlive(absl::Seconds(5), {w});
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);

  coord_->SessionClosed("tok", *second);
  AdvanceKeepingAlive(absl::Milliseconds(1001), {w});
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_DEAD);
  EXPECT_THAT(WorkerStatus(w.id).reason(), HasSubstr("lost its connection"));
  // Heartbeating on, it is back (and judged afresh).
  ASSERT_TRUE(Beat(w).ok());
  coord_->Tick();
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);
  EXPECT_THAT(ends.statuses, IsEmpty());
}

// The cancel of a replaced stream (it can arrive after the next one opened) changes nothing;
// the replaced stream is ended OK.
TEST_F(CoordinatorTest, OnlyTheCurrentSessionsCloseCounts) {
  SessionEnds old_ends;
  SessionEnds new_ends;
  auto first = coord_->OpenSession("tok", old_ends.Callback());
  ASSERT_TRUE(first.ok());
  Worker w = Register("h", 0, weft::v1::DEVICE_KIND_CPU, "tok");
  auto second = coord_->OpenSession("tok", new_ends.Callback());
  ASSERT_TRUE(second.ok());
  ASSERT_THAT(old_ends.statuses, SizeIs(1));
  EXPECT_TRUE(old_ends.statuses[0].ok());
  coord_->SessionClosed("tok", *first);
  AdvanceKeepingAlive(absl::Seconds(3), {w});
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);
  EXPECT_THAT(new_ends.statuses, IsEmpty());
}

// A process that registers again (same id, new token) is judged by its new session only.
TEST_F(CoordinatorTest, ReregistrationFollowsTheNewProcessesSession) {
  SessionEnds ends;
  auto old_session = coord_->OpenSession("old-process", ends.Callback());
  ASSERT_TRUE(old_session.ok());
  Register("h", 0, weft::v1::DEVICE_KIND_CPU, "old-process");
  ASSERT_TRUE(coord_->OpenSession("new-process", ends.Callback()).ok());
  Worker w = Register("h", 0, weft::v1::DEVICE_KIND_CPU, "new-process");
  coord_->SessionClosed("old-process", *old_session);
  AdvanceKeepingAlive(absl::Seconds(3), {w});
  EXPECT_EQ(WorkerStatus(w.id).state(), weft::v1::WORKER_IDLE);
}

TEST_F(CoordinatorTest, BadSessionTokensAreRefused) {
  SessionEnds ends;
  for (const std::string& token : {std::string(), std::string(129, 'a'), std::string("a b")}) {
    auto r = coord_->OpenSession(token, ends.Callback());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << token;
    EXPECT_THAT(r.status().message(), HasSubstr("session_token"));
  }
  weft::v1::WorkerInfo info;
  info.set_host("h");
  info.set_device_kind(weft::v1::DEVICE_KIND_CPU);
  auto r = coord_->RegisterWorker(info, "bad token");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("session_token"));
  EXPECT_THAT(coord_->ListWorkers()->workers(), IsEmpty());  // nothing half-registered
  EXPECT_THAT(ends.statuses, IsEmpty());
}

// Shutdown ends open sessions UNAVAILABLE, so the server is not kept waiting for them.
TEST_F(CoordinatorTest, ShutdownEndsSessions) {
  SessionEnds ends;
  ASSERT_TRUE(coord_->OpenSession("a", ends.Callback()).ok());
  ASSERT_TRUE(coord_->OpenSession("b", ends.Callback()).ok());
  coord_->Shutdown();
  ASSERT_THAT(ends.statuses, SizeIs(2));
  EXPECT_EQ(ends.statuses[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ends.statuses[1].code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(coord_->OpenSession("c", ends.Callback()).status().code(),
            absl::StatusCode::kUnavailable);
}

// ---- store scope -----------------------------------------------------------------------------

TEST_F(CoordinatorTest, GenerationStoreScoping) {
  weft::v1::StoreScope scope;
  scope.set_job_id("nope-1");
  scope.set_generation(1);
  EXPECT_EQ(coord_->GenerationStore(scope).status().code(), absl::StatusCode::kNotFound);

  auto [job, w] = StartRunningJob(CpuSpec("store", 1), 1);
  scope.set_job_id(job);
  auto store = coord_->GenerationStore(scope);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("nccl_id", "abc").ok());
  auto same = coord_->GenerationStore(scope);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(*(*same)->Get("nccl_id"), "abc");  // one store per generation

  scope.set_generation(2);
  EXPECT_EQ(coord_->GenerationStore(scope).status().code(), absl::StatusCode::kNotFound);
  scope.set_generation(0);
  EXPECT_EQ(coord_->GenerationStore(scope).status().code(), absl::StatusCode::kNotFound);
}

// ---- watchers --------------------------------------------------------------------------------

TEST_F(CoordinatorTest, WatcherSeesChangesInOrderAndEndsWithFinal) {
  const std::string job = Submit(CpuSpec("watch", 1));
  absl::Mutex mu;
  std::vector<std::pair<weft::v1::JobState, bool>> seen;
  uint64_t last_seq = 0;
  bool ordered = true;
  auto id = coord_->AddWatcher(job, [&](const JobStatus& s, uint64_t seq, bool final) {
    absl::MutexLock lock(&mu);
    if (seq <= last_seq) ordered = false;
    last_seq = seq;
    seen.emplace_back(s.state(), final);
  });
  ASSERT_TRUE(id.ok());
  Register("h", 0);  // -> RUNNING
  ASSERT_TRUE(coord_->CancelJob(job, "").ok());
  Register("h", 1);  // after the end: no more calls
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(ordered);
  ASSERT_GE(seen.size(), 3u);
  EXPECT_EQ(seen.front(), std::make_pair(weft::v1::PENDING, false));
  EXPECT_THAT(seen, Contains(std::make_pair(weft::v1::RUNNING, false)));
  EXPECT_EQ(seen.back(), std::make_pair(weft::v1::CANCELLED, true));

  // Watching an ended job: one final call, no id kept.
  int calls = 0;
  auto ended = coord_->AddWatcher(job, [&](const JobStatus& s, uint64_t, bool final) {
    ++calls;
    EXPECT_TRUE(final);
    EXPECT_EQ(s.state(), weft::v1::CANCELLED);
  });
  ASSERT_TRUE(ended.ok());
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(coord_->AddWatcher("nope-1", [](const JobStatus&, uint64_t, bool) {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, ListJobsNewestFirstAndFiltered) {
  const std::string a = Submit(CpuSpec("a", 1));
  const std::string b = Submit(CpuSpec("b", 3));
  Register("h", 0);  // a runs, b waits
  weft::v1::ListJobsRequest request;
  auto all = coord_->ListJobs(request);
  ASSERT_TRUE(all.ok());
  ASSERT_THAT(all->jobs(), SizeIs(2));
  EXPECT_EQ(all->jobs(0).job_id(), b);
  EXPECT_EQ(all->jobs(1).job_id(), a);
  EXPECT_THAT(all->jobs(0).events(), IsEmpty());  // summaries only
  request.add_states(weft::v1::RUNNING);
  auto running = coord_->ListJobs(request);
  ASSERT_TRUE(running.ok());
  ASSERT_THAT(running->jobs(), SizeIs(1));
  EXPECT_EQ(running->jobs(0).job_id(), a);
  request.set_limit(1001);
  EXPECT_EQ(coord_->ListJobs(request).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- persistence -----------------------------------------------------------------------------

TEST_F(CoordinatorTest, ReopenKeepsEveryJobAndTheRunningGeneration) {
  JobSpec gpu_spec = CpuSpec("pending", 5);
  gpu_spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  const std::string pending = Submit(gpu_spec);  // does not hold up the CPU queue
  auto [running, w] = StartRunningJob(CpuSpec("running", 2), 2);
  // Past metrics_persist_interval_ms, so this report is written through.
  clock_.Advance(absl::Milliseconds(options_.metrics_persist_interval_ms));
  ASSERT_TRUE(Report(running, 1, w[0], 0, 42).ok());
  const std::string cancelled = Submit(CpuSpec("cancelled", 9));
  ASSERT_TRUE(coord_->CancelJob(cancelled, "").ok());
  // The generation's store, as ranks left it mid-checkpoint.
  weft::v1::StoreScope scope;
  scope.set_job_id(running);
  scope.set_generation(1);
  {
    auto store = coord_->GenerationStore(scope);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Set("ckpt/40/done/1", "stored").ok());
    ASSERT_TRUE((*store)->Add("counter", 5).ok());
    ASSERT_TRUE((*store)->Set("gone", "x").ok());
    ASSERT_TRUE((*store)->Delete("gone").ok());
  }
  const JobStatus running_before = Status(running);
  EXPECT_TRUE(running_before.rendezvous_complete());

  Reopen();

  JobStatus s = Status(pending);
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  EXPECT_EQ(s.name(), "pending");
  s = Status(cancelled);
  EXPECT_EQ(s.state(), weft::v1::CANCELLED);
  s = Status(running);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.restarts(), 0);
  EXPECT_EQ(s.generation(), 1);
  EXPECT_EQ(s.step(), 42);
  EXPECT_THAT(s.worker_ids(), ElementsAre(w[0].id, w[1].id));
  EXPECT_THAT(s.awaiting_reattach(), ElementsAre(w[0].id, w[1].id));
  EXPECT_EQ(s.create_time().seconds(), running_before.create_time().seconds());
  EXPECT_NE(FindEvent(s, weft::v1::GENERATION_KEPT, "generation 1 kept: its 2 members"), nullptr)
      << s.DebugString();
  auto job = coord_->GetJob(running);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->spec().resources().min_workers(), 2);

  // The store is the previous process's, and goes on.
  {
    auto store = coord_->GenerationStore(scope);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->Get("ckpt/40/done/1").value_or(""), "stored");
    EXPECT_EQ((*store)->Add("counter", 1).value_or(0), 6);
    EXPECT_EQ((*store)->Get("gone").status().code(), absl::StatusCode::kNotFound);
  }

  // Job ids continue after the stored ones.
  EXPECT_THAT(Submit(CpuSpec("later", 50)), MatchesRegex("later-4-[a-z][a-z2-7]{5}"));

  // The members, still training, register again stating their generation and attach to it.
  auto again0 = RegisterRunning("h", 0, running, 1, 0, 57);
  ASSERT_TRUE(again0.ok()) << again0.status();
  EXPECT_TRUE(again0->reattached()) << again0->reattach_refusal();
  EXPECT_EQ(WorkerStatus(w[0].id).state(), weft::v1::WORKER_BUSY);
  EXPECT_THAT(Status(running).awaiting_reattach(), ElementsAre(w[1].id));
  auto again1 = RegisterRunning("h", 1, running, 1, 1, 57);
  ASSERT_TRUE(again1.ok()) << again1.status();
  EXPECT_TRUE(again1->reattached()) << again1->reattach_refusal();
  // A repeated registration of an attached member (its answer was lost) changes nothing.
  again1 = RegisterRunning("h", 1, running, 1, 1, 58);
  ASSERT_TRUE(again1.ok() && again1->reattached());
  s = Status(running);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 1);
  EXPECT_THAT(s.awaiting_reattach(), IsEmpty());
  EXPECT_NE(FindEvent(s, weft::v1::GENERATION_KEPT, "every member of generation 1 attached"),
            nullptr)
      << s.DebugString();
  EXPECT_EQ(FindEvent(s, weft::v1::GENERATION_ENDED), nullptr) << s.DebugString();
  // Reports, heartbeats and the finish work as before the restart.
  const Worker r0{again0->worker_id(), again0->incarnation()};
  const Worker r1{again1->worker_id(), again1->incarnation()};
  auto hb = Beat(r1, running, 1);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_THAT(AbortCommands(*hb), IsEmpty());
  ASSERT_TRUE(Report(running, 1, r0, 0, 100, /*finished=*/true).ok());
  EXPECT_EQ(Status(running).state(), weft::v1::SUCCEEDED);

  // Ended jobs stay ended through a second restart too, and the ended generation's store is
  // gone with it.
  Reopen();
  EXPECT_EQ(Status(cancelled).state(), weft::v1::CANCELLED);
  EXPECT_EQ(Status(running).state(), weft::v1::SUCCEEDED);
  EXPECT_FALSE(coord_->GenerationStore(scope).ok());
}

// A generation whose members were still gathering cannot be kept (their Joins were parked in
// the previous process): the job forms a new one, without spending a restart.
TEST_F(CoordinatorTest, ReopenMidRendezvousFormsANewGeneration) {
  const std::string job = Submit(CpuSpec("gathering", 2));
  const Worker w0 = Register("h", 0);
  const Worker w1 = Register("h", 1);
  ASSERT_EQ(Status(job).state(), weft::v1::RUNNING);
  ASSERT_FALSE(Status(job).rendezvous_complete());

  Reopen();

  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RECOVERING);
  EXPECT_EQ(s.restarts(), 0);
  EXPECT_THAT(s.worker_ids(), IsEmpty());
  EXPECT_THAT(s.events(s.events_size() - 1).message(),
              HasSubstr("abandoned before its rendezvous completed"));
  Register("h", 0);
  Register("h", 1);
  s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
  EXPECT_EQ(s.restarts(), 0);
}

// A member that does not attach again within the window (its process died while the
// coordinator was away) ends the kept generation, without spending a restart.
TEST_F(CoordinatorTest, KeptGenerationEndsWhenAMemberDoesNotAttachAgain) {
  auto [job, w] = StartRunningJob(CpuSpec("kept", 2), 2);
  Reopen();
  auto again0 = RegisterRunning("h", 0, job, 1, 0, 10);
  ASSERT_TRUE(again0.ok() && again0->reattached());
  const Worker r0{again0->worker_id(), again0->incarnation()};
  const int64_t window_ms =
      ReattachWindowMs(coord_->GetJob(job)->spec().fault().heartbeat_timeout_ms());
  AdvanceKeepingAlive(absl::Milliseconds(window_ms - 1000), {r0}, job, 1);
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
  AdvanceKeepingAlive(absl::Seconds(2), {r0}, job, 1);
  JobStatus s = Status(job);
  // Waiting for a second worker (RECOVERING, then PENDING once the scheduler found none).
  EXPECT_THAT(s.state(), ::testing::AnyOf(weft::v1::RECOVERING, weft::v1::PENDING))
      << s.DebugString();
  EXPECT_THAT(s.worker_ids(), IsEmpty());
  EXPECT_EQ(s.restarts(), 0);  // it may have died with the coordinator: not the job's failure
  EXPECT_NE(FindEvent(s, weft::v1::WORKER_LOST, "missing: h/cpu1"), nullptr) << s.DebugString();

}

// One that comes back as a new process (registering without the generation) ends it at once.
TEST_F(CoordinatorTest, KeptGenerationEndsAtOnceWhenAMemberComesBackAsANewProcess) {
  auto [job2, w2] = StartRunningJob(CpuSpec("kept-again", 2), 2);
  Reopen();
  Register("h", 1);  // no `running`: a new process
  JobStatus s = Status(job2);
  EXPECT_THAT(s.state(), ::testing::AnyOf(weft::v1::RECOVERING, weft::v1::PENDING))
      << s.DebugString();
  EXPECT_EQ(s.restarts(), 0);  // as after a restart of the whole cluster
  EXPECT_NE(FindEvent(s, weft::v1::WORKER_LOST, "registered again without generation 1"),
            nullptr)
      << s.DebugString();
  // Its old peer, still training, is told to drop the generation when it registers.
  auto late = RegisterRunning("h", 0, job2, 1, 0, 10);
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->reattached());
  EXPECT_THAT(late->reattach_refusal(), HasSubstr("generation 1 of job " + job2 + ": the job is"));
  // Both idle now, the job forms its next generation on them.
  s = Status(job2);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.generation(), 2);
}

// Registrations that cannot attach say why, and register the worker idle.
TEST_F(CoordinatorTest, ReattachRefusalsNameTheReason) {
  auto [job, w] = StartRunningJob(CpuSpec("refusals", 2), 2);
  Reopen();
  auto r = RegisterRunning("h", 0, "no-such-job", 1, 0, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->reattached());
  EXPECT_THAT(r->reattach_refusal(), HasSubstr("no such job"));
  EXPECT_EQ(WorkerStatus(r->worker_id()).state(), weft::v1::WORKER_IDLE);
  // (h/cpu0 registered without the kept generation: that generation has ended.)
  EXPECT_THAT(Status(job).worker_ids(), IsEmpty());
  r = RegisterRunning("h", 1, job, 1, 1, 10);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->reattached());
  EXPECT_THAT(r->reattach_refusal(), HasSubstr("generation 1 of job " + job));
}

// The decision on its own.
TEST(DecideReattachTest, OnlyTheRunningGenerationAtTheSameRank) {
  ReattachView view{.job_found = true, .state = weft::v1::RUNNING, .active_generation = 3,
                    .member_rank = 1};
  EXPECT_TRUE(DecideReattach("w", "j", 3, 1, view).attach);
  ReattachDecision d = DecideReattach("w", "j", 3, 0, view);
  EXPECT_FALSE(d.attach);
  EXPECT_THAT(d.reason, HasSubstr("not rank 0 of generation 3 of job j (it is rank 1)"));
  d = DecideReattach("w", "j", 2, 1, view);
  EXPECT_THAT(d.reason, HasSubstr("generation 2 of job j has ended (the job runs generation 3)"));
  view.member_rank = -1;
  EXPECT_THAT(DecideReattach("w", "j", 3, 1, view).reason, HasSubstr("it is not a member"));
  view.state = weft::v1::CANCELLED;
  EXPECT_THAT(DecideReattach("w", "j", 3, 1, view).reason, HasSubstr("the job is CANCELLED"));
  view.job_found = false;
  EXPECT_THAT(DecideReattach("w", "j", 3, 1, view).reason, HasSubstr("no such job"));
  EXPECT_EQ(ReattachWindowMs(3000), 10000);
  EXPECT_EQ(ReattachWindowMs(30000), 30000);
}

TEST_F(CoordinatorTest, SecondCoordinatorOnTheSameDirectoryIsRefused) {
  auto other = Coordinator::Open(options_, std::make_shared<prometheus::Registry>(),
                                 [this] { return clock_.Now(); }, false);
  EXPECT_FALSE(other.ok());
  CoordinatorOptions no_dir;
  EXPECT_EQ(Coordinator::Open(no_dir, std::make_shared<prometheus::Registry>(), nullptr, false)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Two coordinators that each start on an empty data directory count from 1 alike: their job
// ids must still differ, or the second one's job would take over the first one's checkpoints
// and model files (both are stored under the job id).
TEST_F(CoordinatorTest, CoordinatorsOfEmptyDataDirectoriesGiveTheSameSpecDifferentJobIds) {
  weft::testing::TempDir other_dir;
  CoordinatorOptions other_options = options_;
  other_options.data_dir = other_dir.path();
  auto other = Coordinator::Open(other_options, std::make_shared<prometheus::Registry>(),
                                 [this] { return clock_.Now(); }, false);
  ASSERT_TRUE(other.ok()) << other.status();
  auto theirs = (*other)->SubmitJob(CpuSpec("tiny", 2));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  const std::string ours = Submit(CpuSpec("tiny", 2));
  EXPECT_THAT(ours, MatchesRegex("tiny-1-[a-z][a-z2-7]{5}"));
  EXPECT_THAT(theirs->job_id(), MatchesRegex("tiny-1-[a-z][a-z2-7]{5}"));
  EXPECT_NE(ours, theirs->job_id());
}

TEST(JobIdTest, KeepsNameAndSequenceReadableAndParsesBack) {
  for (uint64_t random : {uint64_t{0}, uint64_t{25}, uint64_t{12345678901}, ~uint64_t{0}}) {
    const std::string id = MakeJobId("run-2", 17, random);
    EXPECT_THAT(id, MatchesRegex("run-2-17-[a-z][a-z2-7]{5}")) << random;
    EXPECT_EQ(SeqFromJobId(id), 17) << id;
  }
  EXPECT_EQ(JobIdSuffix(0), "aaaaaa");
  EXPECT_NE(JobIdSuffix(1), JobIdSuffix(2));
  // Ids stored before the suffix existed still sort by their sequence after an upgrade.
  EXPECT_EQ(SeqFromJobId("run-2-17"), 17);
  EXPECT_EQ(SeqFromJobId("tiny-1"), 1);
  EXPECT_EQ(SeqFromJobId("nodash"), 0);
}

// A data directory on a filesystem of its own (a 4 MiB tmpfs), filled up for real. Needs root
// (mount); the test skips otherwise.
class FullDiskCoordinatorTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    spdlog::set_level(spdlog::level::off);  // the refused writes are logged as errors
    mount_ = dir_.File("fs");
    std::filesystem::create_directories(mount_);
    if (system(absl::StrCat("mount -t tmpfs -o size=4m weft-test-full ", mount_,
                            " 2>/dev/null").c_str()) != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
    }
    mounted_ = true;
    options_.data_dir = mount_ + "/db";
    Reopen();
  }
  void TearDown() override {
    coord_.reset();  // closes the database, so that the tmpfs can go
    if (mounted_) (void)system(absl::StrCat("umount ", mount_, " 2>/dev/null").c_str());
  }

  // Writes a file until the filesystem refuses more with ENOSPC.
  void FillDisk() {
    std::FILE* f = std::fopen(Filler().c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string block(4096, 'x');
    while (std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
    }
    std::fclose(f);
  }
  void FreeDisk() { std::remove(Filler().c_str()); }
  std::string Filler() const { return mount_ + "/filler"; }

  // A job whose record spans pages: writing it needs new blocks of the filesystem, whatever
  // room the last block of the database's log has left.
  static JobSpec BigSpec(const std::string& name, int32_t workers) {
    JobSpec spec = CpuSpec(name, workers);
    spec.mutable_data()->set_train_path("/data/" + std::string(3 * 4096, 'x') + ".txt");
    return spec;
  }

  std::string mount_;
  bool mounted_ = false;
};

// A cancel the state database cannot store is refused, and nothing changes: the job runs on,
// its worker is not told to abort, and after a restart the job is what it really was. Once
// the disk has room again, the same coordinator stores the cancel.
TEST_F(FullDiskCoordinatorTest, ACancelThatCannotBeStoredIsRefusedAndChangesNothing) {
  auto [job, w] = StartRunningJob(BigSpec("full", 1), 1);
  const JobStatus before = Status(job);
  ASSERT_NO_FATAL_FAILURE(FillDisk());

  auto cancelled = coord_->CancelJob(job, "");
  ASSERT_FALSE(cancelled.ok()) << "a cancel was acknowledged on a full disk";
  EXPECT_EQ(cancelled.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(cancelled.status().message(),
              AllOf(HasSubstr(job), HasSubstr("not cancelled"), HasSubstr("No space left")));
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_EQ(s.events_size(), before.events_size());
  EXPECT_THAT(s.worker_ids(), ElementsAre(w[0].id));
  auto hb = Beat(w[0], job, 1);
  ASSERT_TRUE(hb.ok()) << hb.status();
  EXPECT_THAT(AbortCommands(*hb), IsEmpty());
  EXPECT_EQ(WorkerStatus(w[0].id).state(), weft::v1::WORKER_BUSY);

  // Room again: the same coordinator stores the cancel, without a restart.
  FreeDisk();
  cancelled = coord_->CancelJob(job, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), weft::v1::CANCELLED);
  Reopen();
  EXPECT_EQ(Status(job).state(), weft::v1::CANCELLED);
}

TEST_F(FullDiskCoordinatorTest, RefusedCancelAndSubmitLeaveNoTraceAfterARestart) {
  const std::string job = Submit(BigSpec("pending", 2));
  ASSERT_NO_FATAL_FAILURE(FillDisk());
  EXPECT_FALSE(coord_->CancelJob(job, "").ok());
  auto submitted = coord_->SubmitJob(BigSpec("refused", 2));
  ASSERT_FALSE(submitted.ok()) << "a job was acknowledged on a full disk";
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(submitted.status().message(), HasSubstr("job not submitted"));
  FreeDisk();
  Reopen();
  JobStatus s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  EXPECT_EQ(FindEvent(s, weft::v1::CANCEL_REQUESTED), nullptr);
  auto all = coord_->ListJobs(weft::v1::ListJobsRequest());
  ASSERT_TRUE(all.ok());
  EXPECT_THAT(all->jobs(), SizeIs(1));
}

// Rank 0's final report is acknowledged only once the success is stored: refused while the
// disk is full (the job still RUNNING on its worker), accepted when rank 0 sends it again.
TEST_F(FullDiskCoordinatorTest, AFinalReportThatCannotBeStoredIsRefused) {
  auto [job, w] = StartRunningJob(BigSpec("finish", 1), 1);
  ASSERT_NO_FATAL_FAILURE(FillDisk());
  auto done = Report(job, 1, w[0], 0, 100, /*finished=*/true);
  ASSERT_FALSE(done.ok()) << "a final report was acknowledged on a full disk";
  EXPECT_EQ(done.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
  EXPECT_EQ(WorkerStatus(w[0].id).state(), weft::v1::WORKER_BUSY);
  FreeDisk();
  done = Report(job, 1, w[0], 0, 100, /*finished=*/true);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_FALSE(done->continue_training());
  Reopen();
  EXPECT_EQ(Status(job).state(), weft::v1::SUCCEEDED);
}

// What the scheduler changes while the disk is full stays in memory (its workers already act
// on it) and is written once there is room, at the next tick.
TEST_F(FullDiskCoordinatorTest, SchedulerChangesAreWrittenOnceThereIsRoom) {
  const std::string job = Submit(BigSpec("later", 1));
  ASSERT_NO_FATAL_FAILURE(FillDisk());
  Register("h", 0);  // the job starts: its write fails
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
  FreeDisk();
  coord_->Tick();
  Reopen();
  // RUNNING was stored: a restarted coordinator abandons that generation.
  EXPECT_EQ(Status(job).state(), weft::v1::RECOVERING);
  EXPECT_EQ(Status(job).generation(), 1);
}

// ---- metrics ---------------------------------------------------------------------------------

// A restarted coordinator exports the newest commit's time of a running job again at once: the
// stale-checkpoint alert must not go quiet until a commit that may never come.
TEST_F(CoordinatorTest, CheckpointAgeSurvivesACoordinatorRestart) {
  JobSpec spec = CpuSpec("age", 1);
  spec.mutable_checkpoint()->set_interval_steps(50);
  auto [job, w] = StartRunningJob(spec, 1);
  weft::v1::ReportProgressRequest request = EmptyReport(job, 1, w[0], 0);
  request.set_checkpoint_step(50);
  const double committed = absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch());
  ASSERT_TRUE(coord_->ReportProgress(request).ok());
  const char kTimestamp[] = "weft_coordinator_job_checkpoint_timestamp_seconds";
  ASSERT_EQ(JobGauge(kTimestamp, job), committed);

  clock_.Advance(absl::Minutes(10));
  Reopen();
  EXPECT_EQ(JobGauge(kTimestamp, job), committed);
}

// Before its first commit a job's checkpoint timestamp is when it started: a job whose first
// checkpoint never commits ages (and alerts) like one whose later saves fail. A commit then
// takes over.
TEST_F(CoordinatorTest, CheckpointAgeCountsFromTheStartBeforeTheFirstCommit) {
  JobSpec spec = CpuSpec("first", 1);
  spec.mutable_checkpoint()->set_interval_steps(50);
  const double started = absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch());
  auto [job, w] = StartRunningJob(spec, 1);
  const char kTimestamp[] = "weft_coordinator_job_checkpoint_timestamp_seconds";
  EXPECT_EQ(JobGauge(kTimestamp, job), started);

  clock_.Advance(absl::Minutes(30));
  weft::v1::ReportProgressRequest request = EmptyReport(job, 1, w[0], 0);
  request.set_checkpoint_step(50);
  const double committed = absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch());
  ASSERT_TRUE(coord_->ReportProgress(request).ok());
  EXPECT_EQ(JobGauge(kTimestamp, job), committed);
}

// ... and a restarted coordinator exports the start again, as it does a commit's time.
TEST_F(CoordinatorTest, CheckpointAgeFromTheStartSurvivesACoordinatorRestart) {
  JobSpec spec = CpuSpec("first", 1);
  spec.mutable_checkpoint()->set_interval_steps(50);
  const double started = absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch());
  const std::string job = StartRunningJob(spec, 1).job_id;
  clock_.Advance(absl::Minutes(30));
  Reopen();
  EXPECT_EQ(JobGauge("weft_coordinator_job_checkpoint_timestamp_seconds", job), started);
}

// Every family labelled job_id drops an ended job's series once its final values have had
// time to be scraped, so the series count follows the live jobs, not the job history. The
// checkpoint interval, which arms the stale-checkpoint alert, goes as soon as the job stops
// running.
TEST_F(CoordinatorTest, AnEndedJobsMetricSeriesAreRemovedAfterTheRetention) {
  JobSpec spec = CpuSpec("ended", 1);
  spec.mutable_checkpoint()->set_interval_steps(50);
  auto [ended, w] = StartRunningJob(spec, 1);
  // Needs two workers: it stays pending when the ended job frees the one there is.
  const std::string live = Submit(CpuSpec("live", 2));
  auto interval = [&] { return JobGauge("weft_coordinator_job_checkpoint_interval_steps", ended); };
  EXPECT_EQ(interval(), 50.0);
  const int live_series = SeriesOfJob(*registry_, live);
  EXPECT_EQ(live_series, 2);  // recoveries, event SUBMITTED

  ASSERT_TRUE(coord_->CancelJob(ended, "done").ok());
  coord_->Tick();
  EXPECT_EQ(interval(), std::nullopt) << "a job that no longer runs keeps its checkpoint interval";
  const int ended_series = SeriesOfJob(*registry_, ended);
  EXPECT_GE(ended_series, 3);  // recoveries, events SUBMITTED and STATE_CHANGED at least

  clock_.Advance(CoordinatorMetrics::kEndedJobRetention - absl::Seconds(1));
  coord_->Tick();
  EXPECT_EQ(SeriesOfJob(*registry_, ended), ended_series) << "removed before the retention passed";
  clock_.Advance(absl::Seconds(1));
  coord_->Tick();
  EXPECT_EQ(SeriesOfJob(*registry_, ended), 0);
  EXPECT_EQ(SeriesOfJob(*registry_, live), live_series);
}


// ---- issue 37: members that cannot train together, and where a generation starts -----------

class MemberCheckTest : public CoordinatorTest {
 protected:
  // Beats every worker (taking its JoinJob, if any) and joins those that got one.
  std::vector<std::unique_ptr<Pending<JoinResponse>>> BeatAndJoin(const std::string& job,
                                                                  int64_t generation,
                                                                  const std::vector<Worker>& ws) {
    std::vector<std::unique_ptr<Pending<JoinResponse>>> joins;
    for (const Worker& w : ws) {
      auto hb = Beat(w);
      EXPECT_TRUE(hb.ok());
      if (!JoinCommands(*hb).empty()) joins.push_back(StartJoin(job, generation, w));
    }
    return joins;
  }
};

// One worker with a checkpointd, one without: every generation used to stall at its first save
// for the 60 s collective timeout and restart, until max_restarts. Now the rendezvous refuses
// the one without at once, no restart is spent, and the job runs on a worker that fits.
TEST_F(MemberCheckTest, AMemberWithoutCheckpointdIsRefusedAtOnceAndTheJobMovesOn) {
  JobSpec spec = CpuSpec("ckpt", 2, 2);
  spec.mutable_checkpoint()->set_interval_steps(10);
  const std::string job = Submit(spec);
  const Worker w0 = Register("h", 0, weft::v1::DEVICE_KIND_CPU, "", "ckpt:7071");
  const Worker w1 = Register("h", 1, weft::v1::DEVICE_KIND_CPU, "", "");
  auto joins = BeatAndJoin(job, 1, {w0, w1});
  ASSERT_THAT(joins, SizeIs(2));
  for (auto& j : joins) {
    ASSERT_TRUE(j->finished());
    EXPECT_EQ(j->Get().status().code(), absl::StatusCode::kAborted) << j->Get().status();
  }
  JobStatus s = Status(job);
  const weft::v1::JobEvent* refused = FindEvent(s, weft::v1::MEMBER_REFUSED, "h/cpu1");
  ASSERT_NE(refused, nullptr) << s.DebugString();
  EXPECT_THAT(refused->message(), HasSubstr("has no checkpointd"));
  EXPECT_EQ(s.restarts(), 0);
  // Too few workers without it: the job waits and says why.
  EXPECT_EQ(s.state(), weft::v1::PENDING);
  EXPECT_THAT(s.pending_reason(), HasSubstr("1 of them refused by this job (h/cpu1: has no "
                                            "checkpointd"));

  // A fitting worker comes: generation 2 forms on it and h/cpu0, and trains.
  const Worker w2 = Register("h", 2, weft::v1::DEVICE_KIND_CPU, "", "ckpt:7071");
  joins = BeatAndJoin(job, 2, {w0, w1, w2});
  ASSERT_THAT(joins, SizeIs(2));
  for (auto& j : joins) EXPECT_TRUE(j->finished() && j->Get().ok());
  s = Status(job);
  EXPECT_EQ(s.state(), weft::v1::RUNNING);
  EXPECT_THAT(s.worker_ids(), ElementsAre("h/cpu0", "h/cpu2"));
  EXPECT_EQ(s.restarts(), 0);
}

TEST_F(MemberCheckTest, ARefusedWorkerThatReRegistersIsPlacedAgain) {
  JobSpec spec = CpuSpec("ckpt", 2, 2);
  spec.mutable_checkpoint()->set_interval_steps(10);
  const std::string job = Submit(spec);
  const Worker w0 = Register("h", 0, weft::v1::DEVICE_KIND_CPU, "", "ckpt:7071");
  const Worker w1 = Register("h", 1, weft::v1::DEVICE_KIND_CPU, "", "");
  BeatAndJoin(job, 1, {w0, w1});
  ASSERT_EQ(Status(job).state(), weft::v1::PENDING);
  // Restarted with its flag fixed: a new incarnation.
  const Worker fixed = Register("h", 1, weft::v1::DEVICE_KIND_CPU, "", "ckpt:7071");
  auto joins = BeatAndJoin(job, 2, {w0, fixed});
  ASSERT_THAT(joins, SizeIs(2));
  for (auto& j : joins) EXPECT_TRUE(j->finished() && j->Get().ok());
  EXPECT_EQ(Status(job).state(), weft::v1::RUNNING);
}

// Rank 0 says where each generation's state came from; resuming from nothing used to train
// from step 0 in silence.
TEST_F(MemberCheckTest, EveryGenerationRecordsWhereItsStateCameFrom) {
  auto [job, w] = StartRunningJob(CpuSpec("start", 2, 2), 2);
  weft::v1::ReportProgressRequest request = EmptyReport(job, 1, w[0], 0);
  request.mutable_start()->set_fresh_from("seed 1337 (no checkpoint of job x)");
  ASSERT_TRUE(coord_->ReportProgress(request).ok());
  request.mutable_start()->Clear();
  request.mutable_start()->set_restored_step(60);
  request.mutable_start()->set_restored_job("old-1");
  request.mutable_start()->set_restored_world_size(3);
  ASSERT_TRUE(coord_->ReportProgress(request).ok());
  JobStatus s = Status(job);
  EXPECT_NE(FindEvent(s, weft::v1::STARTED_FRESH, "started fresh at step 0 from seed 1337"),
            nullptr)
      << s.DebugString();
  EXPECT_NE(FindEvent(s, weft::v1::CHECKPOINT_RESTORED, "restored step 60 from job old-1 (world 3 -> 2)"),
            nullptr)
      << s.DebugString();
}

// A worker's log lines come with its heartbeats and are read back by job, with the job's state;
// a heartbeat the coordinator refuses (an incarnation it never issued) leaves none.
TEST_F(CoordinatorTest, HeartbeatLogLinesAreReadBackByJob) {
  const std::string job = Submit(CpuSpec("logged", 2));
  Worker w = Register("h", 0);
  weft::v1::HeartbeatRequest request;
  request.set_worker_id(w.id);
  request.set_incarnation(w.incarnation);
  for (const std::string& text : {"joining", "step 1"}) {
    weft::v1::WorkerLogLine* line = request.add_log_lines();
    line->set_job_id(job);
    line->set_generation(1);
    line->set_rank(1);
    line->set_level("info");
    line->set_text(text);
  }
  request.add_log_lines()->set_job_id("no-such-job-1-aaaaaa");
  weft::v1::HeartbeatRequest refused = request;
  refused.set_incarnation(w.incarnation + 1);
  Pending<HeartbeatResponse> stale;
  coord_->Heartbeat(refused, absl::Now() + kFar, stale.Callback());
  ASSERT_EQ(stale.Get().status().code(), absl::StatusCode::kFailedPrecondition);
  Pending<HeartbeatResponse> pending;
  coord_->Heartbeat(request, absl::Now() + kFar, pending.Callback());
  ASSERT_TRUE(pending.Get().ok()) << pending.Get().status();

  weft::v1::GetJobLogsRequest read;
  read.set_job_id(job);
  auto logs = coord_->GetJobLogs(read);
  ASSERT_TRUE(logs.ok()) << logs.status();
  ASSERT_THAT(logs->lines(), SizeIs(2));
  EXPECT_EQ(logs->lines(0).text(), "joining");
  EXPECT_EQ(logs->lines(1).text(), "step 1");
  EXPECT_EQ(logs->lines(1).worker_id(), w.id);
  EXPECT_EQ(logs->lines(1).rank(), 1);
  EXPECT_LT(logs->lines(0).seq(), logs->lines(1).seq());
  EXPECT_EQ(logs->state(), weft::v1::PENDING);

  read.set_rank(0);
  EXPECT_THAT(coord_->GetJobLogs(read)->lines(), IsEmpty());
  read.set_rank(-1);
  EXPECT_EQ(coord_->GetJobLogs(read).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(coord_->GetJobLogs(read).status().message()), HasSubstr("rank"));
  read.clear_rank();
  read.set_job_id("no-such-job-1-aaaaaa");
  EXPECT_EQ(coord_->GetJobLogs(read).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(MemberCheckTest, SubmitRefusesAResumeThatCannotHappenNamingTheField) {
  JobSpec next = CpuSpec("next", 2, 2);
  next.set_resume_from_job("nope-1-aaaaaa");
  auto r = coord_->SubmitJob(next);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("resume_from_job: no job \"nope-1-aaaaaa\""));

  // Whether it has a checkpoint is checkpointd's to say (the restore refuses none); a job
  // queued to continue a live one is accepted.
  auto [old_job, w] = StartRunningJob(CpuSpec("old", 2, 2), 2);
  next.set_resume_from_job(old_job);
  EXPECT_TRUE(coord_->SubmitJob(next).ok());
  // Another shape is refused naming the first field that differs.
  next.mutable_model()->set_hidden_size(128);
  r = coord_->SubmitJob(next);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("resume_from_job: job " + old_job +
                        "'s checkpoints are of another model: model.hidden_size: 128 here, 64 "
                        "in job " + old_job));
  next.mutable_model()->set_hidden_size(64);
  EXPECT_TRUE(coord_->SubmitJob(next).ok());
}

}  // namespace
}  // namespace weft::coordinator
