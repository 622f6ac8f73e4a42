// Unit tests for the coordinator's pure decision functions.
#include "coordinator/decisions.h"

#include <deque>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;
using weft::v1::DEVICE_KIND_CPU;
using weft::v1::DEVICE_KIND_CUDA;

// IdleWorkerView points into the caller's strings; the tests keep theirs here.
std::string_view Intern(std::string s) {
  static std::deque<std::string> storage;
  return storage.emplace_back(std::move(s));
}
IdleWorkerView Cpu(std::string host, int32_t index) {
  return {Intern(absl::StrCat(host, "/cpu", index)), Intern(host), index, DEVICE_KIND_CPU};
}
IdleWorkerView Gpu(std::string host, int32_t index) {
  return {Intern(absl::StrCat(host, "/cuda", index)), Intern(host), index, DEVICE_KIND_CUDA};
}
WaitingJobView Job(std::string id, weft::v1::DeviceKind kind, int32_t min, int32_t max) {
  return {std::move(id), kind, min, max};
}

// ---- SortInRankOrder -------------------------------------------------------------------------

TEST(SortInRankOrderTest, HostThenNumericDeviceIndexThenId) {
  std::vector<IdleWorkerView> workers = {
      {"b-x", "hostB", 0, DEVICE_KIND_CPU},  {"a-10", "hostA", 10, DEVICE_KIND_CPU},
      {"a-2", "hostA", 2, DEVICE_KIND_CPU},  {"a-2-dup-z", "hostA", 2, DEVICE_KIND_CPU},
      {"a-2-dup-a", "hostA", 2, DEVICE_KIND_CPU}, {"c-0", "hostC", 0, DEVICE_KIND_CPU},
      {"b-y", "hostB", 1, DEVICE_KIND_CPU},
  };
  SortInRankOrder(&workers);
  std::vector<std::string> ids;
  for (const auto& w : workers) ids.emplace_back(w.worker_id);
  // Device index compares as a number (2 before 10), ties broken by id.
  EXPECT_THAT(ids, ElementsAre("a-2", "a-2-dup-a", "a-2-dup-z", "a-10", "b-x", "b-y", "c-0"));
}

TEST(SortInRankOrderTest, SameSetAlwaysSameOrder) {
  std::vector<IdleWorkerView> a = {Cpu("h2", 1), Cpu("h1", 0), Cpu("h2", 0), Cpu("h1", 1)};
  std::vector<IdleWorkerView> b = {a[3], a[2], a[0], a[1]};
  SortInRankOrder(&a);
  SortInRankOrder(&b);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].worker_id, b[i].worker_id);
  EXPECT_EQ(a.front().worker_id, "h1/cpu0");
  EXPECT_EQ(a.back().worker_id, "h2/cpu1");
}

// ---- Schedule --------------------------------------------------------------------------------

TEST(ScheduleTest, NothingWaitingNothingPlaced) {
  ScheduleDecision d = Schedule({}, {Cpu("h", 0)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_THAT(d.waiting, IsEmpty());
}

TEST(ScheduleTest, PlacesWhenMinWorkersIdleInRankOrder) {
  ScheduleDecision d = Schedule({Job("j1", DEVICE_KIND_CPU, 3, 3)},
                                {Cpu("hostB", 0), Cpu("hostA", 1), Cpu("hostB", 1), Cpu("hostA", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_EQ(d.placements[0].job_id, "j1");
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("hostA/cpu0", "hostA/cpu1", "hostB/cpu0"));
  EXPECT_EQ(d.placements[0].reason, "3 idle CPU workers on 2 hosts (min 3, max 3)");
  EXPECT_THAT(d.waiting, IsEmpty());
}

TEST(SortInPlacementOrderTest, HostsWithMostIdleWorkersFirstEachInRankOrder) {
  std::vector<IdleWorkerView> workers = {Cpu("a", 0), Cpu("c", 1), Cpu("b", 2), Cpu("c", 0),
                                         Cpu("b", 0), Cpu("b", 1), Cpu("a", 1)};
  SortInPlacementOrder(&workers);
  std::vector<std::string_view> ids;
  for (const auto& w : workers) ids.push_back(w.worker_id);
  // b has 3 idle, then a and c with 2 each, in host order.
  EXPECT_THAT(ids, ElementsAre("b/cpu0", "b/cpu1", "b/cpu2", "a/cpu0", "a/cpu1", "c/cpu0",
                               "c/cpu1"));
}

TEST(ScheduleTest, AJobTakesOneWholeHostRatherThanSpanningTwo) {
  // A busy node "a" has 3 idle GPUs left, node "b" all 8: the job of 8 takes b alone.
  std::vector<IdleWorkerView> idle;
  for (int i : {1, 4, 6}) idle.push_back(Gpu("a", i));
  for (int i = 0; i < 8; ++i) idle.push_back(Gpu("b", i));
  ScheduleDecision d = Schedule({Job("j1", DEVICE_KIND_CUDA, 8, 8)}, idle);
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids,
              ElementsAre("b/cuda0", "b/cuda1", "b/cuda2", "b/cuda3", "b/cuda4", "b/cuda5",
                          "b/cuda6", "b/cuda7"));
  EXPECT_EQ(d.placements[0].reason, "8 idle CUDA workers on 1 host (min 8, max 8)");
}

TEST(ScheduleTest, RanksOfAPlacementSpanningHostsAreContiguousPerHost) {
  // Taken in placement order (c first: most idle), ranked in rank order (by host).
  ScheduleDecision d = Schedule({Job("j1", DEVICE_KIND_CPU, 5, 5)},
                                {Cpu("c", 2), Cpu("a", 1), Cpu("c", 0), Cpu("c", 1), Cpu("a", 0),
                                 Cpu("b", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids,
              ElementsAre("a/cpu0", "a/cpu1", "c/cpu0", "c/cpu1", "c/cpu2"));
}

TEST(ScheduleTest, WaitsWithReasonWhenTooFewIdle) {
  ScheduleDecision d = Schedule({Job("j1", DEVICE_KIND_CPU, 4, 4)}, {Cpu("h", 0), Cpu("h", 1)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_THAT(d.waiting, ElementsAre(Pair("j1", "needs 4 idle CPU workers, 2 idle")));
}

TEST(ScheduleTest, WaitingReasonSingularAndOtherKindNotCounted) {
  ScheduleDecision d = Schedule({Job("j1", DEVICE_KIND_CUDA, 1, 1)}, {Cpu("h", 0)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_THAT(d.waiting, ElementsAre(Pair("j1", "needs 1 idle CUDA worker, 0 idle")));
}

TEST(ScheduleTest, TakesUpToMaxWorkers) {
  std::vector<IdleWorkerView> idle;
  for (int i = 0; i < 6; ++i) idle.push_back(Cpu("h", i));
  ScheduleDecision d = Schedule({Job("j1", DEVICE_KIND_CPU, 2, 4)}, idle);
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cpu0", "h/cpu1", "h/cpu2", "h/cpu3"));
  EXPECT_EQ(d.placements[0].reason, "4 idle CPU workers on 1 host (min 2, max 4)");
}

TEST(ScheduleTest, TakesAllIdleBetweenMinAndMax) {
  ScheduleDecision d =
      Schedule({Job("j1", DEVICE_KIND_CPU, 2, 8)}, {Cpu("h", 0), Cpu("h", 1), Cpu("h", 2)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, SizeIs(3));
}

TEST(ScheduleTest, HybridShardingTakesWholeGroupsAndLeavesTheRest) {
  std::vector<IdleWorkerView> idle;
  for (int i = 0; i < 7; ++i) idle.push_back(Cpu("h", i));
  WaitingJobView hybrid = Job("hybrid", DEVICE_KIND_CPU, 2, 8);
  hybrid.world_multiple = 2;
  ScheduleDecision d = Schedule({hybrid, Job("small", DEVICE_KIND_CPU, 1, 1)}, idle);
  ASSERT_THAT(d.placements, SizeIs(2));
  // 7 idle, up to 8 wanted: 6, three groups of 2; the seventh goes to the next job.
  EXPECT_THAT(d.placements[0].worker_ids, SizeIs(6));
  EXPECT_EQ(d.placements[0].reason,
            "6 idle CPU workers on 1 host (min 2, max 8, a multiple of the group size 2)");
  EXPECT_THAT(d.placements[1].worker_ids, ElementsAre("h/cpu6"));
  // At max_workers already a multiple: no rounding.
  hybrid.max_workers = 4;
  d = Schedule({hybrid}, idle);
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, SizeIs(4));
}

TEST(ScheduleTest, FifoWithinKindLaterJobsGetTheRest) {
  std::vector<IdleWorkerView> idle;
  for (int i = 0; i < 5; ++i) idle.push_back(Cpu("h", i));
  ScheduleDecision d = Schedule({Job("first", DEVICE_KIND_CPU, 2, 2),
                                 Job("second", DEVICE_KIND_CPU, 2, 2),
                                 Job("third", DEVICE_KIND_CPU, 2, 2)},
                                idle);
  ASSERT_THAT(d.placements, SizeIs(2));
  EXPECT_EQ(d.placements[0].job_id, "first");
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cpu0", "h/cpu1"));
  EXPECT_EQ(d.placements[1].job_id, "second");
  EXPECT_THAT(d.placements[1].worker_ids, ElementsAre("h/cpu2", "h/cpu3"));
  EXPECT_THAT(d.waiting, ElementsAre(Pair("third", "needs 2 idle CPU workers, 1 idle")));
}

TEST(ScheduleTest, HeadOfLineBlocksSmallerLaterJobsOfSameKind) {
  ScheduleDecision d = Schedule({Job("big", DEVICE_KIND_CPU, 4, 4),
                                 Job("small", DEVICE_KIND_CPU, 1, 1),
                                 Job("small2", DEVICE_KIND_CPU, 1, 1)},
                                {Cpu("h", 0), Cpu("h", 1)});
  EXPECT_THAT(d.placements, IsEmpty());
  EXPECT_THAT(d.waiting,
              ElementsAre(Pair("big", "needs 4 idle CPU workers, 2 idle"),
                          Pair("small", "queued behind job big (first come, first served)"),
                          Pair("small2", "queued behind job big (first come, first served)")));
}

TEST(ScheduleTest, BlockedKindDoesNotBlockOtherKinds) {
  ScheduleDecision d = Schedule({Job("big-gpu", DEVICE_KIND_CUDA, 8, 8),
                                 Job("cpu-job", DEVICE_KIND_CPU, 1, 2),
                                 Job("small-gpu", DEVICE_KIND_CUDA, 1, 1)},
                                {Gpu("g", 0), Gpu("g", 1), Cpu("c", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_EQ(d.placements[0].job_id, "cpu-job");
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("c/cpu0"));
  EXPECT_THAT(d.waiting,
              ElementsAre(Pair("big-gpu", "needs 8 idle CUDA workers, 2 idle"),
                          Pair("small-gpu", "queued behind job big-gpu (first come, first served)")));
}

TEST(ScheduleTest, WorkersOfAKindServeOnlyThatKind) {
  ScheduleDecision d = Schedule({Job("gpu", DEVICE_KIND_CUDA, 1, 4), Job("cpu", DEVICE_KIND_CPU, 1, 4)},
                                {Cpu("h", 0), Gpu("h", 0), Cpu("h", 1), Gpu("h", 1)});
  ASSERT_THAT(d.placements, SizeIs(2));
  EXPECT_EQ(d.placements[0].job_id, "gpu");
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cuda0", "h/cuda1"));
  EXPECT_EQ(d.placements[1].job_id, "cpu");
  EXPECT_THAT(d.placements[1].worker_ids, ElementsAre("h/cpu0", "h/cpu1"));
}

TEST(ScheduleTest, EarlierJobPlacedEvenWhenLaterOneCouldUseMore) {
  // FIFO, not best fit: the first job takes its max even if that starves the next one.
  ScheduleDecision d = Schedule({Job("a", DEVICE_KIND_CPU, 1, 3), Job("b", DEVICE_KIND_CPU, 2, 2)},
                                {Cpu("h", 0), Cpu("h", 1), Cpu("h", 2)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_EQ(d.placements[0].job_id, "a");
  EXPECT_THAT(d.placements[0].worker_ids, SizeIs(3));
  EXPECT_THAT(d.waiting, ElementsAre(Pair("b", "needs 2 idle CPU workers, 0 idle")));
}

TEST(ScheduleTest, EveryJobIsEitherPlacedOrWaiting) {
  std::vector<WaitingJobView> jobs;
  for (int i = 0; i < 10; ++i) {
    jobs.push_back(Job(absl::StrCat("j", i), i % 2 ? DEVICE_KIND_CPU : DEVICE_KIND_CUDA, 1 + i % 3,
                       2 + i % 3));
  }
  std::vector<IdleWorkerView> idle;
  for (int i = 0; i < 7; ++i) idle.push_back(Cpu(absl::StrCat("h", i % 3), i));
  for (int i = 0; i < 5; ++i) idle.push_back(Gpu(absl::StrCat("g", i % 2), i));
  ScheduleDecision d = Schedule(jobs, idle);
  EXPECT_EQ(d.placements.size() + d.waiting.size(), jobs.size());
  // No worker handed out twice.
  std::set<std::string> used;
  size_t total = 0;
  for (const auto& p : d.placements) {
    total += p.worker_ids.size();
    used.insert(p.worker_ids.begin(), p.worker_ids.end());
  }
  EXPECT_EQ(used.size(), total);
  EXPECT_LE(total, idle.size());
}

// Issue 37: the GPU recovery bench's spare shares GPU 0 with rank 0, and generation 1 took both
// GPU-0 workers, so NCCL refused the communicator ("Duplicate GPU detected") three times and
// the job failed. A placement takes one worker of a GPU, whatever its device index says.
IdleWorkerView OnGpu(IdleWorkerView w, std::string uuid) {
  w.gpu_uuid = Intern(std::move(uuid));
  return w;
}

TEST(ScheduleTest, APlacementNeverHoldsTwoWorkersOfOneGpu) {
  IdleWorkerView spare = OnGpu(Gpu("h", 0), "GPU-0");
  spare.worker_id = Intern("h/spare");
  ScheduleDecision d = Schedule({Job("j", DEVICE_KIND_CUDA, 4, 4)},
                                {OnGpu(Gpu("h", 0), "GPU-0"), spare, OnGpu(Gpu("h", 1), "GPU-1"),
                                 OnGpu(Gpu("h", 2), "GPU-2"), OnGpu(Gpu("h", 3), "GPU-3")});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cuda0", "h/cuda1", "h/cuda2", "h/cuda3"));
  EXPECT_THAT(d.waiting, IsEmpty());
}

TEST(ScheduleTest, WorkersSharingAGpuCountOnceAndTheReasonSaysSo) {
  IdleWorkerView spare = OnGpu(Gpu("h", 0), "GPU-0");
  spare.worker_id = Intern("h/spare");
  ScheduleDecision d =
      Schedule({Job("j", DEVICE_KIND_CUDA, 2, 2)}, {OnGpu(Gpu("h", 0), "GPU-0"), spare});
  EXPECT_THAT(d.placements, IsEmpty());
  ASSERT_THAT(d.waiting, SizeIs(1));
  EXPECT_EQ(d.waiting[0].second,
            "needs 2 idle CUDA workers, 2 idle, 1 of them sharing a GPU with another");
}

TEST(ScheduleTest, AJobIsNotPlacedOnWorkersItRefusedAndSaysWhy) {
  WaitingJobView job = Job("j", DEVICE_KIND_CPU, 2, 2);
  job.excluded = {{"h/cpu0", "has no checkpointd"}};
  ScheduleDecision d = Schedule({job}, {Cpu("h", 0), Cpu("h", 1), Cpu("h", 2)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cpu1", "h/cpu2"));

  d = Schedule({job}, {Cpu("h", 0), Cpu("h", 1)});
  EXPECT_THAT(d.placements, IsEmpty());
  ASSERT_THAT(d.waiting, SizeIs(1));
  EXPECT_EQ(d.waiting[0].second,
            "needs 2 idle CPU workers, 2 idle, 1 of them refused by this job (h/cpu0: has no "
            "checkpointd)");
  // Another job may still have the worker.
  d = Schedule({job, Job("k", DEVICE_KIND_CPU, 1, 1)}, {Cpu("h", 0), Cpu("h", 1)});
  EXPECT_THAT(d.placements, IsEmpty()) << "k waits behind j, first come first served";
  d = Schedule({Job("k", DEVICE_KIND_CPU, 1, 1)}, {Cpu("h", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
}

TEST(ScheduleTest, ALaterJobGetsTheOtherWorkerOfAGpuAnEarlierOneTook) {
  IdleWorkerView spare = OnGpu(Gpu("h", 0), "GPU-0");
  spare.worker_id = Intern("h/spare");
  ScheduleDecision d =
      Schedule({Job("a", DEVICE_KIND_CUDA, 2, 2), Job("b", DEVICE_KIND_CUDA, 1, 1)},
               {OnGpu(Gpu("h", 0), "GPU-0"), spare, OnGpu(Gpu("h", 1), "GPU-1")});
  ASSERT_THAT(d.placements, SizeIs(2));
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cuda0", "h/cuda1"));
  EXPECT_THAT(d.placements[1].worker_ids, ElementsAre("h/spare"));
}

// ---- CheckMembers ----------------------------------------------------------------------------

MemberView Member(std::string id, std::string checkpointd = "ckpt:7071",
                  std::string version = "0.1.0", std::string data_error = "") {
  return {std::move(id), std::move(version), std::move(checkpointd), std::move(data_error)};
}

TEST(CheckMembersTest, AgreeingMembersPass) {
  MemberCheck c = CheckMembers({Member("a"), Member("b")}, /*checkpoints=*/true);
  EXPECT_THAT(c.refused, IsEmpty());
  EXPECT_EQ(c.job_error, "");
  // Nobody has a checkpointd: the job trains without checkpoints, as before.
  c = CheckMembers({Member("a", ""), Member("b", "")}, true);
  EXPECT_THAT(c.refused, IsEmpty());
}

// Issue 37: one worker with WEFT_CHECKPOINTD, one without, stalled every generation at the
// first save for the 60 s collective timeout, in a loop.
TEST(CheckMembersTest, AMemberWithoutCheckpointdIsRefusedWhenItsPeersHaveOne) {
  MemberCheck c = CheckMembers({Member("a"), Member("b", "")}, true);
  ASSERT_THAT(c.refused, SizeIs(1));
  EXPECT_EQ(c.refused[0].worker_id, "b");
  EXPECT_THAT(c.refused[0].reason, HasSubstr("has no checkpointd"));
  EXPECT_THAT(c.refused[0].reason, HasSubstr("a saves to ckpt:7071"));
  // A job that does not checkpoint does not care.
  EXPECT_THAT(CheckMembers({Member("a"), Member("b", "")}, false).refused, IsEmpty());
}

TEST(CheckMembersTest, AMemberThatCannotReadItsDataIsRefusedAndNoneReadingFailsTheJob) {
  MemberCheck c =
      CheckMembers({Member("a"), Member("b", "ckpt:7071", "0.1.0", "data.train_path: /x: gone")},
                   true);
  ASSERT_THAT(c.refused, SizeIs(1));
  EXPECT_EQ(c.refused[0].worker_id, "b");
  EXPECT_THAT(c.refused[0].reason, HasSubstr("data.train_path: /x: gone"));
  c = CheckMembers({Member("a", "", "0.1.0", "data.train_path: /x: gone"),
                    Member("b", "", "0.1.0", "data.train_path: /x: gone")},
                   true);
  EXPECT_THAT(c.refused, IsEmpty());
  EXPECT_THAT(c.job_error, HasSubstr("no member can read the job's data: data.train_path: /x"));
}

TEST(CheckMembersTest, TheMembersOfAnotherReleaseThanMostAreRefused) {
  MemberCheck c = CheckMembers(
      {Member("a", "c", "0.1.0"), Member("b", "c", "0.2.0"), Member("c", "c", "0.2.0")}, true);
  ASSERT_THAT(c.refused, SizeIs(1));
  EXPECT_EQ(c.refused[0].worker_id, "a");
  EXPECT_THAT(c.refused[0].reason, HasSubstr("runs weft-worker 0.1.0 while its peers run 0.2.0"));
  // A tie goes to rank 0's release.
  c = CheckMembers({Member("a", "c", "0.1.0"), Member("b", "c", "0.2.0")}, true);
  ASSERT_THAT(c.refused, SizeIs(1));
  EXPECT_EQ(c.refused[0].worker_id, "b");
}


// ---- CheckLiveness ---------------------------------------------------------------------------

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);

WorkerLivenessView Idle(std::string id, absl::Time last) {
  return {std::move(id), weft::v1::WORKER_IDLE, last, absl::InfiniteFuture(), "", 0};
}
WorkerLivenessView Busy(std::string id, absl::Time last, std::string job, int64_t gen) {
  return {std::move(id), weft::v1::WORKER_BUSY, last, absl::InfiniteFuture(), std::move(job),
          gen};
}
GenerationView Gen(std::string job, int64_t gen, absl::Time start, int64_t hb_timeout_ms,
                   int64_t stall_ms = 300000) {
  GenerationView g;
  g.job_id = std::move(job);
  g.generation = gen;
  g.start_time = start;
  g.last_progress_time = start;
  g.heartbeat_timeout_ms = hb_timeout_ms;
  g.stall_timeout_ms = stall_ms;
  return g;
}
LivenessOptions Opts(int64_t idle_ms = 3000, int64_t rendezvous_ms = 120000) {
  LivenessOptions o;
  o.idle_heartbeat_timeout_ms = idle_ms;
  o.rendezvous_timeout_ms = rendezvous_ms;
  return o;
}

TEST(CheckLivenessTest, IdleWorkerExactlyAtTimeoutIsAlive) {
  auto f = CheckLiveness(kT0 + absl::Milliseconds(3000), {Idle("w", kT0)}, {}, Opts(3000));
  EXPECT_THAT(f, IsEmpty());
}

// A dropped session (the process exited) is fatal after the grace, long before
// the heartbeat timeout; within the grace the worker may still reconnect.
TEST(CheckLivenessTest, LostConnectionIsDeadAfterTheGraceNotTheTimeout) {
  WorkerLivenessView w = Busy("w", kT0, "job", 1);
  w.connection_lost = kT0 + absl::Milliseconds(100);
  LivenessOptions opts = Opts();
  opts.connection_lost_grace_ms = 1000;
  const std::vector<GenerationView> gens = {Gen("job", 1, kT0, /*hb_timeout_ms=*/30000)};
  EXPECT_THAT(CheckLiveness(kT0 + absl::Milliseconds(1100), {w}, gens, opts), IsEmpty());
  auto f = CheckLiveness(kT0 + absl::Milliseconds(1101), {w}, gens, opts);
  ASSERT_THAT(f, SizeIs(1));
  // Its own kind (issue 12): not counted as a heartbeat timeout.
  EXPECT_EQ(f[0].kind, FailureKind::kConnectionLost);
  EXPECT_TRUE(IsWorkerDeath(f[0].kind));
  EXPECT_EQ(f[0].worker_id, "w");
  EXPECT_EQ(f[0].job_id, "job");
  EXPECT_EQ(f[0].generation, 1);
  EXPECT_THAT(f[0].reason, HasSubstr("lost its connection 1001 ms ago"));
}

TEST(CheckLivenessTest, LostConnectionGraceNeverExceedsTheHeartbeatTimeout) {
  WorkerLivenessView w = Idle("w", kT0);
  w.connection_lost = kT0;
  LivenessOptions opts = Opts(/*idle_ms=*/500);
  opts.connection_lost_grace_ms = 1000;
  auto f = CheckLiveness(kT0 + absl::Milliseconds(501), {w}, {}, opts);
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].kind, FailureKind::kHeartbeatTimeout);
  EXPECT_THAT(f[0].reason, HasSubstr("missed heartbeats"));
}

TEST(CheckLivenessTest, IdleWorkerOneMsPastTimeoutIsDead) {
  auto f = CheckLiveness(kT0 + absl::Milliseconds(3001), {Idle("w", kT0)}, {}, Opts(3000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].kind, FailureKind::kHeartbeatTimeout);
  EXPECT_EQ(f[0].worker_id, "w");
  EXPECT_EQ(f[0].job_id, "");  // idle: no generation ends
  EXPECT_EQ(f[0].generation, 0);
  EXPECT_EQ(f[0].reason, "worker w missed heartbeats for 3001 ms (timeout 3000 ms)");
}

TEST(CheckLivenessTest, BusyWorkerUsesItsGenerationsTimeout) {
  const auto gen = Gen("job", 2, kT0, /*hb_timeout_ms=*/10000);
  std::vector<WorkerLivenessView> workers = {Busy("busy", kT0, "job", 2), Idle("idle", kT0)};
  // 5 s: past the idle timeout (3 s), within the job's (10 s).
  auto f = CheckLiveness(kT0 + absl::Seconds(5), workers, {gen}, Opts(3000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].worker_id, "idle");

  f = CheckLiveness(kT0 + absl::Milliseconds(10000), workers, {gen}, Opts(3000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].worker_id, "idle");

  f = CheckLiveness(kT0 + absl::Milliseconds(10001), workers, {gen}, Opts(3000));
  ASSERT_THAT(f, SizeIs(2));
  const Failure& busy = f[0].worker_id == "busy" ? f[0] : f[1];
  EXPECT_EQ(busy.worker_id, "busy");
  EXPECT_EQ(busy.kind, FailureKind::kHeartbeatTimeout);
  EXPECT_EQ(busy.job_id, "job");
  EXPECT_EQ(busy.generation, 2);
  EXPECT_EQ(busy.reason, "worker busy missed heartbeats for 10001 ms (timeout 10000 ms)");
}

TEST(CheckLivenessTest, BusyWorkerWithShorterJobTimeoutDiesBeforeIdleTimeout) {
  const auto gen = Gen("job", 1, kT0, /*hb_timeout_ms=*/1000);
  auto f = CheckLiveness(kT0 + absl::Milliseconds(1001), {Busy("w", kT0, "job", 1)}, {gen},
                         Opts(3000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].job_id, "job");
  EXPECT_EQ(f[0].generation, 1);
}

TEST(CheckLivenessTest, WorkerOfAStaleGenerationUsesIdleTimeout) {
  // The worker claims generation 1 but the job's active generation is 2.
  const auto gen = Gen("job", 2, kT0 + absl::Seconds(100), /*hb_timeout_ms=*/60000);
  auto f = CheckLiveness(kT0 + absl::Milliseconds(3001), {Busy("w", kT0, "job", 1)}, {gen},
                         Opts(3000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].worker_id, "w");
  EXPECT_EQ(f[0].job_id, "");
  EXPECT_EQ(f[0].generation, 0);
}

TEST(CheckLivenessTest, DeadWorkersAreSkipped) {
  WorkerLivenessView dead = Idle("dead", kT0 - absl::Hours(1));
  dead.state = weft::v1::WORKER_DEAD;
  auto f = CheckLiveness(kT0, {dead}, {}, Opts());
  EXPECT_THAT(f, IsEmpty());
}

TEST(CheckLivenessTest, HeartbeatInTheFutureIsAlive) {
  auto f = CheckLiveness(kT0, {Idle("w", kT0 + absl::Seconds(5))}, {}, Opts());
  EXPECT_THAT(f, IsEmpty());
}

// A generation kept over a coordinator restart waits for its members until the deadline, not
// a millisecond longer, and names those that did not come back.
TEST(CheckLivenessTest, KeptGenerationEndsAtItsReattachDeadline) {
  GenerationView g = Gen("j", 4, kT0, 3000);
  g.not_reattached = {"w1", "w2"};
  g.reattach_deadline = kT0 + absl::Seconds(10);
  EXPECT_THAT(CheckLiveness(kT0 + absl::Seconds(10), {}, {g}, Opts()), IsEmpty());
  auto f = CheckLiveness(kT0 + absl::Seconds(10) + absl::Milliseconds(1), {}, {g}, Opts());
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].kind, FailureKind::kReattachTimeout);
  EXPECT_EQ(f[0].job_id, "j");
  EXPECT_EQ(f[0].generation, 4);
  EXPECT_FALSE(IsWorkerDeath(f[0].kind));
  EXPECT_THAT(f[0].reason, HasSubstr("missing: w1, w2"));
  // Once all are back, the deadline means nothing.
  g.not_reattached.clear();
  EXPECT_THAT(CheckLiveness(kT0 + absl::Seconds(11), {}, {g}, Opts()), IsEmpty());
}

TEST(CheckLivenessTest, RendezvousTimeoutListsWorkersNotJoined) {
  GenerationView gen = Gen("job", 3, kT0, 3000);
  gen.not_joined = {"h/cpu1", "h/cpu3"};
  auto f = CheckLiveness(kT0 + absl::Milliseconds(5000), {}, {gen}, Opts(3000, 5000));
  EXPECT_THAT(f, IsEmpty());  // exactly at the rendezvous timeout

  f = CheckLiveness(kT0 + absl::Milliseconds(5001), {}, {gen}, Opts(3000, 5000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].kind, FailureKind::kRendezvousTimeout);
  EXPECT_EQ(f[0].worker_id, "");
  EXPECT_EQ(f[0].job_id, "job");
  EXPECT_EQ(f[0].generation, 3);
  EXPECT_EQ(f[0].reason,
            "rendezvous of generation 3 incomplete after 5001 ms (timeout 5000 ms); not joined: "
            "h/cpu1, h/cpu3");
}

TEST(CheckLivenessTest, NoStallCheckBeforeRendezvousCompletes) {
  GenerationView gen = Gen("job", 1, kT0, 3000, /*stall_ms=*/4000);
  gen.not_joined = {"w"};
  // Past the stall timeout but within the rendezvous timeout: nothing.
  auto f = CheckLiveness(kT0 + absl::Seconds(10), {}, {gen}, Opts(3000, 60000));
  EXPECT_THAT(f, IsEmpty());
}

TEST(CheckLivenessTest, StallAfterRendezvousUsesLastProgress) {
  GenerationView gen = Gen("job", 4, kT0, 3000, /*stall_ms=*/10000);
  gen.last_progress_time = kT0 + absl::Seconds(50);
  gen.step = 17;
  // Long after start (no rendezvous timeout once joined), exactly at the stall timeout.
  auto f = CheckLiveness(kT0 + absl::Seconds(60), {}, {gen}, Opts(3000, 1000));
  EXPECT_THAT(f, IsEmpty());

  f = CheckLiveness(kT0 + absl::Seconds(60) + absl::Milliseconds(1), {}, {gen}, Opts(3000, 1000));
  ASSERT_THAT(f, SizeIs(1));
  EXPECT_EQ(f[0].kind, FailureKind::kStall);
  EXPECT_EQ(f[0].job_id, "job");
  EXPECT_EQ(f[0].generation, 4);
  EXPECT_EQ(f[0].worker_id, "");
  EXPECT_EQ(f[0].reason,
            "generation 4 made no progress for 10001 ms (stall timeout 10000 ms); last step 17");
}

TEST(CheckLivenessTest, SubMillisecondPastTimeoutIsNotYetAFailure) {
  // Durations are compared in whole milliseconds.
  auto f = CheckLiveness(kT0 + absl::Microseconds(3000999), {Idle("w", kT0)}, {}, Opts(3000));
  EXPECT_THAT(f, IsEmpty());
}

TEST(CheckLivenessTest, ReportsEveryFailureOfOneCheck) {
  GenerationView joining = Gen("a", 1, kT0, 3000);
  joining.not_joined = {"a0"};
  GenerationView stalled = Gen("b", 1, kT0, 3000, 4000);
  std::vector<WorkerLivenessView> workers = {Idle("i0", kT0), Idle("i1", kT0 + absl::Seconds(4)),
                                             Busy("b0", kT0, "b", 1)};
  auto f = CheckLiveness(kT0 + absl::Seconds(5), workers, {joining, stalled}, Opts(3000, 4500));
  std::vector<std::pair<FailureKind, std::string>> got;
  for (const auto& x : f) got.emplace_back(x.kind, x.worker_id.empty() ? x.job_id : x.worker_id);
  EXPECT_THAT(got, ::testing::UnorderedElementsAre(
                       Pair(FailureKind::kHeartbeatTimeout, "i0"),
                       Pair(FailureKind::kHeartbeatTimeout, "b0"),
                       Pair(FailureKind::kRendezvousTimeout, "a"), Pair(FailureKind::kStall, "b")));
}

// ---- DecideAfterFailure ----------------------------------------------------------------------

TEST(DecideAfterFailureTest, RestartsWithinBudget) {
  RecoveryDecision d = DecideAfterFailure(0, 3, false, "worker w lost");
  EXPECT_EQ(d.next_state, weft::v1::RECOVERING);
  EXPECT_TRUE(d.counts_as_restart);
  EXPECT_EQ(d.reason, "worker w lost; restarting (1 of 3)");

  d = DecideAfterFailure(2, 3, false, "worker w lost");
  EXPECT_EQ(d.next_state, weft::v1::RECOVERING);
  EXPECT_TRUE(d.counts_as_restart);
  EXPECT_EQ(d.reason, "worker w lost; restarting (3 of 3)");
}

TEST(DecideAfterFailureTest, FailsWhenBudgetExhausted) {
  RecoveryDecision d = DecideAfterFailure(3, 3, false, "worker w lost");
  EXPECT_EQ(d.next_state, weft::v1::FAILED);
  EXPECT_FALSE(d.counts_as_restart);
  EXPECT_EQ(d.reason, "worker w lost; restart budget exhausted (3 of 3 used)");
}

TEST(DecideAfterFailureTest, ZeroBudgetFailsOnFirstFailure) {
  RecoveryDecision d = DecideAfterFailure(0, 0, false, "worker w lost");
  EXPECT_EQ(d.next_state, weft::v1::FAILED);
  EXPECT_FALSE(d.counts_as_restart);
  EXPECT_THAT(d.reason, HasSubstr("worker w lost"));
  EXPECT_THAT(d.reason, HasSubstr("restart budget exhausted (0 of 0 used)"));
}

TEST(DecideAfterFailureTest, PermanentErrorNeverRetried) {
  for (int restarts : {0, 1, 5}) {
    RecoveryDecision d = DecideAfterFailure(restarts, 5, true, "rank 1: no such file /data/x");
    EXPECT_EQ(d.next_state, weft::v1::FAILED);
    EXPECT_FALSE(d.counts_as_restart);
    EXPECT_EQ(d.reason, "rank 1: no such file /data/x (permanent error: not retried)");
  }
}

TEST(DecideRepeatedRankErrorTest, OnlyTheSameErrorAgainOnAnotherWorkerIsTheJobs) {
  const std::string e = "step 1200: cuBLAS GEMM (8192 x 4096 x 4096): an illegal address";
  EXPECT_FALSE(DecideRepeatedRankError("", "", e, "h/gpu0").repeated);  // the first time
  EXPECT_FALSE(DecideRepeatedRankError(e, "h/gpu0", "step 1201: " + e.substr(11), "h/gpu1")
                   .repeated);
  EXPECT_FALSE(DecideRepeatedRankError(e, "h/gpu0", "", "h/gpu1").repeated);
  // The same worker again may be a failing machine: quarantine's business, not a verdict.
  EXPECT_FALSE(DecideRepeatedRankError(e, "h/gpu0", e, "h/gpu0").repeated);
  const RepeatDecision d = DecideRepeatedRankError(e, "h/gpu0", e, "g/gpu3");
  EXPECT_TRUE(d.repeated);
  EXPECT_THAT(d.reason, HasSubstr("same error on worker h/gpu0"));
  EXPECT_THAT(d.reason, HasSubstr("the job's, not a machine's"));
  EXPECT_TRUE(DecideRepeatedRankError("x", "a", "y", "b").reason.empty());
}

TEST(IsWorkerDeathTest, OnlyFailuresThatNameADeadWorker) {
  EXPECT_TRUE(IsWorkerDeath(FailureKind::kHeartbeatTimeout));
  EXPECT_TRUE(IsWorkerDeath(FailureKind::kConnectionLost));
  EXPECT_FALSE(IsWorkerDeath(FailureKind::kRendezvousTimeout));
  EXPECT_FALSE(IsWorkerDeath(FailureKind::kStall));
}

// ---- ScheduleSparingQuarantined ------------------------------------------------------------

TEST(ScheduleSparingQuarantinedTest, HealthyWorkersFirst) {
  auto d = ScheduleSparingQuarantined({Job("j", DEVICE_KIND_CPU, 1, 1)}, {Cpu("h", 1)},
                                      {Cpu("h", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cpu1"));
  EXPECT_THAT(d.waiting, IsEmpty());
}

TEST(ScheduleSparingQuarantinedTest, QuarantinedWorkersWhenTheJobCannotStartWithoutThem) {
  auto d = ScheduleSparingQuarantined({Job("j", DEVICE_KIND_CPU, 2, 2)}, {Cpu("h", 1)},
                                      {Cpu("h", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cpu0", "h/cpu1"));
  EXPECT_THAT(d.waiting, IsEmpty());
}

TEST(ScheduleSparingQuarantinedTest, HealthyWorkersTakenInTheFirstPassAreNotHandedOutTwice) {
  auto d = ScheduleSparingQuarantined(
      {Job("a", DEVICE_KIND_CPU, 1, 1), Job("b", DEVICE_KIND_CPU, 2, 2)}, {Cpu("h", 1)},
      {Cpu("h", 0)});
  ASSERT_THAT(d.placements, SizeIs(1));
  EXPECT_EQ(d.placements[0].job_id, "a");
  EXPECT_THAT(d.placements[0].worker_ids, ElementsAre("h/cpu1"));
  ASSERT_THAT(d.waiting, SizeIs(1));
  EXPECT_EQ(d.waiting[0].first, "b");
  EXPECT_THAT(d.waiting[0].second, HasSubstr("needs 2 idle CPU workers, 1 idle"));
}

// ---- WaitingByCounts -----------------------------------------------------------------------

TEST(WaitingByCountsTest, NoneWhenTheQueueHeadCanBePlaced) {
  EXPECT_FALSE(WaitingByCounts({Job("j", DEVICE_KIND_CPU, 2, 2)}, {{DEVICE_KIND_CPU, 2}}));
  // A job of another kind behind a blocked one can still start.
  EXPECT_FALSE(WaitingByCounts(
      {Job("big", DEVICE_KIND_CPU, 8, 8), Job("gpu", DEVICE_KIND_CUDA, 1, 1)},
      {{DEVICE_KIND_CPU, 3}, {DEVICE_KIND_CUDA, 1}}));
}

TEST(WaitingByCountsTest, ReasonsAreSchedules) {
  const std::vector<WaitingJobView> jobs = {Job("big", DEVICE_KIND_CPU, 4, 4),
                                            Job("small", DEVICE_KIND_CPU, 1, 1),
                                            Job("gpu", DEVICE_KIND_CUDA, 1, 1)};
  auto d = WaitingByCounts(jobs, {{DEVICE_KIND_CPU, 3}});
  ASSERT_TRUE(d.has_value());
  EXPECT_THAT(d->placements, IsEmpty());
  const ScheduleDecision full = Schedule(jobs, {Cpu("h", 0), Cpu("h", 1), Cpu("h", 2)});
  EXPECT_EQ(d->waiting, full.waiting);
  EXPECT_THAT(d->waiting,
              ElementsAre(Pair("big", "needs 4 idle CPU workers, 3 idle"),
                          Pair("small", HasSubstr("queued behind job big")),
                          Pair("gpu", "needs 1 idle CUDA worker, 0 idle")));
}

TEST(WaitingByCountsTest, QuarantinedWorkersCountAsScheduleSparingQuarantinedHandsThemOut) {
  // One healthy and one quarantined idle worker: the job of 2 starts (second pass), so the
  // counts, which include quarantined workers, must not say it waits.
  const std::vector<WaitingJobView> jobs = {Job("j", DEVICE_KIND_CPU, 2, 2)};
  EXPECT_THAT(ScheduleSparingQuarantined(jobs, {Cpu("h", 1)}, {Cpu("h", 0)}).placements,
              SizeIs(1));
  EXPECT_FALSE(WaitingByCounts(jobs, {{DEVICE_KIND_CPU, 2}}));
  // With 3 needed, both say it waits, with the same reason.
  const std::vector<WaitingJobView> three = {Job("j", DEVICE_KIND_CPU, 3, 3)};
  auto d = WaitingByCounts(three, {{DEVICE_KIND_CPU, 2}});
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->waiting, ScheduleSparingQuarantined(three, {Cpu("h", 1)}, {Cpu("h", 0)}).waiting);
}

TEST(WaitingByCountsTest, NothingWaitingNothingToSay) {
  auto d = WaitingByCounts({}, {});
  ASSERT_TRUE(d.has_value());
  EXPECT_THAT(d->waiting, IsEmpty());
  EXPECT_THAT(d->placements, IsEmpty());
}

// ---- IdleHeartbeatFor ----------------------------------------------------------------------

TEST(IdleHeartbeatForTest, ConfiguredWhileUnderTheCap) {
  const IdleHeartbeat configured{500, 3000};
  IdleHeartbeat h = IdleHeartbeatFor(2500, configured, 5000);  // exactly 5000 a second
  EXPECT_EQ(h.interval_ms, 500);
  EXPECT_EQ(h.timeout_ms, 3000);
  h = IdleHeartbeatFor(0, configured, 5000);
  EXPECT_EQ(h.interval_ms, 500);
}

TEST(IdleHeartbeatForTest, StretchesIntervalAndTimeoutTogetherPastTheCap) {
  IdleHeartbeat h = IdleHeartbeatFor(10000, {500, 3000}, 5000);
  EXPECT_EQ(h.interval_ms, 2000);
  EXPECT_EQ(h.timeout_ms, 12000);
  h = IdleHeartbeatFor(2501, {500, 3000}, 5000);  // rounds the interval up
  EXPECT_EQ(h.interval_ms, 501);
  EXPECT_EQ(h.timeout_ms, 3006);
}

TEST(IdleHeartbeatForTest, NoCapIsTheConfiguredValues) {
  IdleHeartbeat h = IdleHeartbeatFor(1000000, {500, 3000}, 0);
  EXPECT_EQ(h.interval_ms, 500);
  EXPECT_EQ(h.timeout_ms, 3000);
}

// ---- DecideQuarantine ----------------------------------------------------------------------

TEST(DecideQuarantineTest, CountsFailuresBelowTheThreshold) {
  QuarantineDecision d = DecideQuarantine(kT0, "h/cpu0", 0, "rank 0: boom", QuarantineOptions{});
  EXPECT_EQ(d.consecutive_failures, 1);
  EXPECT_FALSE(d.quarantined_until.has_value());
  EXPECT_THAT(d.reason, HasSubstr("1 of 2"));
}

TEST(DecideQuarantineTest, QuarantinesAtTheThresholdForTheCooldownAndResetsTheCount) {
  QuarantineOptions opts;
  opts.after_failures = 2;
  opts.cooldown_ms = 60000;
  QuarantineDecision d = DecideQuarantine(kT0, "h/cpu0", 1, "rank 0: boom", opts);
  ASSERT_TRUE(d.quarantined_until.has_value());
  EXPECT_EQ(*d.quarantined_until, kT0 + absl::Seconds(60));
  EXPECT_EQ(d.consecutive_failures, 0);
  EXPECT_THAT(d.reason, HasSubstr("worker h/cpu0 quarantined until "));
  EXPECT_THAT(d.reason, HasSubstr("after 2 failed generations in a row (last: rank 0: boom)"));
}

TEST(DecideQuarantineTest, DisabledLeavesTheCountAlone) {
  QuarantineOptions opts;
  opts.after_failures = 0;
  QuarantineDecision d = DecideQuarantine(kT0, "w", 7, "x", opts);
  EXPECT_EQ(d.consecutive_failures, 7);
  EXPECT_FALSE(d.quarantined_until.has_value());
}

// ---- Job lifecycle -------------------------------------------------------------------------

namespace v1 = weft::v1;
constexpr v1::JobState PENDING = v1::PENDING, RUNNING = v1::RUNNING, RECOVERING = v1::RECOVERING,
                       SUCCEEDED = v1::SUCCEEDED, FAILED = v1::FAILED, CANCELLED = v1::CANCELLED;
using JobState = v1::JobState;

// ---- assignments ----

TEST(LostAssignmentTest, SentAgainOnlyToAMemberThatNeitherJoinedNorHasItQueued) {
  const AssignmentView lost{.worker_id = "h/cpu1",
                            .job_id = "j-1",
                            .generation = 3,
                            .generation_active = true,
                            .joined = false,
                            .join_queued = false};
  const std::optional<std::string> reason = LostAssignment(lost);
  ASSERT_TRUE(reason.has_value());
  EXPECT_THAT(*reason, HasSubstr("worker h/cpu1"));
  EXPECT_THAT(*reason, HasSubstr("job j-1 generation 3"));
  EXPECT_THAT(*reason, HasSubstr("was lost; sending it again"));

  AssignmentView joined = lost;
  joined.joined = true;  // it had the command: its run joined, then ended
  EXPECT_FALSE(LostAssignment(joined).has_value());
  AssignmentView queued = lost;
  queued.join_queued = true;  // the heartbeat's own answer carries it
  EXPECT_FALSE(LostAssignment(queued).has_value());
  AssignmentView ended = lost;
  ended.generation_active = false;  // nothing to join; Release already dealt with it
  EXPECT_FALSE(LostAssignment(ended).has_value());
}

TEST(JobHasEndedTest, OnlyTheFinalStates) {
  EXPECT_TRUE(JobHasEnded(SUCCEEDED));
  EXPECT_TRUE(JobHasEnded(FAILED));
  EXPECT_TRUE(JobHasEnded(CANCELLED));
  EXPECT_FALSE(JobHasEnded(PENDING));
  EXPECT_FALSE(JobHasEnded(RUNNING));
  EXPECT_FALSE(JobHasEnded(RECOVERING));
}

TEST(CheckTransitionTest, EveryAllowedTransitionIsAccepted) {
  const std::vector<std::pair<JobState, JobState>> allowed = {
      {PENDING, RUNNING},       {PENDING, CANCELLED},   {RUNNING, RECOVERING},
      {RUNNING, FAILED},        {RUNNING, SUCCEEDED},   {RUNNING, CANCELLED},
      {RECOVERING, RUNNING},    {RECOVERING, PENDING},  {RECOVERING, CANCELLED},
  };
  for (const auto& [from, to] : allowed) {
    EXPECT_TRUE(CheckTransition(from, to).ok())
        << JobState_Name(from) << " -> " << JobState_Name(to) << ": "
        << CheckTransition(from, to);
  }
}

TEST(CheckTransitionTest, EveryOtherPairIsRefusedNamingBothStates) {
  const std::set<std::pair<JobState, JobState>> allowed = {
      {PENDING, RUNNING},    {PENDING, CANCELLED},    {RUNNING, RECOVERING},
      {RUNNING, FAILED},     {RUNNING, SUCCEEDED},    {RUNNING, CANCELLED},
      {RECOVERING, RUNNING}, {RECOVERING, PENDING},   {RECOVERING, CANCELLED},
  };
  const JobState all[] = {PENDING, RUNNING, RECOVERING, SUCCEEDED, FAILED, CANCELLED};
  int refused = 0;
  for (JobState from : all) {
    for (JobState to : all) {
      if (allowed.contains({from, to})) continue;
      const absl::Status s = CheckTransition(from, to);
      EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition)
          << JobState_Name(from) << " -> " << JobState_Name(to);
      EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(JobState_Name(from), " -> ",
                                                      JobState_Name(to), " refused: ")));
      ++refused;
    }
  }
  EXPECT_EQ(refused, 36 - 9);
}

TEST(CheckTransitionTest, RefusalsSayWhy) {
  EXPECT_THAT(CheckTransition(SUCCEEDED, RUNNING).message(),
              HasSubstr("an ended job never changes state again"));
  EXPECT_THAT(CheckTransition(CANCELLED, CANCELLED).message(),
              HasSubstr("already in that state"));
  EXPECT_THAT(CheckTransition(PENDING, SUCCEEDED).message(),
              HasSubstr("a pending job has no generation"));
  EXPECT_THAT(CheckTransition(RUNNING, PENDING).message(), HasSubstr("RECOVERING"));
  EXPECT_THAT(CheckTransition(RECOVERING, FAILED).message(),
              HasSubstr("no generation to succeed or fail with"));
}

}  // namespace
}  // namespace weft::coordinator
