// Recovery with real processes (coordinator, checkpointd, CPU workers on 127.0.0.1): a worker
// SIGKILLed or SIGSTOPped mid-job is declared lost, the survivors abort their collectives, a
// new generation forms with an idle spare, restores the last checkpoint and finishes; a
// SIGKILLed and restarted coordinator keeps the running generation, whose members attach to it
// again. Each ends SUCCEEDED with the model an uninterrupted run of the same world size gives,
// bit for bit. Saves that checkpointd cannot take (killed, or its disk full) become
// CHECKPOINT_FAILED events while the job trains on.
#include <signal.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/small_disk.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/worker/cluster.h"

namespace weft {
namespace {

using testing::Cluster;
using testing::ExpectSameModel;
using testing::Eventually;
using testing::TempDir;
using ::testing::HasSubstr;

constexpr int kSteps = 160;

class RecoveryE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = dir_.File("corpus.txt");
    testing::WriteFile(corpus_, testing::WordCorpus());
  }

  v1::JobSpec Spec(int world, int64_t steps = kSteps) const {
    return testing::RecoveryJobSpec("recover", corpus_, world, steps);
  }

  // The same job without interruption, on exactly `world` workers.
  v1::JobStatus Uninterrupted(int world, int64_t steps = kSteps) {
    return testing::RunUninterrupted(dir_.File(absl::StrCat("straight", world, "-", steps)),
                                     world, Spec(world, steps));
  }

  // Runs the job on `world` workers plus one spare, and once a mid-run checkpoint is
  // committed, sends `signal` to one of the job's workers. Returns the final status.
  v1::JobStatus InterruptedBySignal(int world, int signal) {
    Cluster cluster(dir_.File(absl::StrCat("interrupted", world, "-", signal)), world + 1);
    cluster.Start();
    auto job = cluster.client().SubmitJob(Spec(world));
    EXPECT_TRUE(job.ok()) << job.status();
    const std::string id = job->job_id();
    EXPECT_TRUE(Eventually([&] { return cluster.Status(id).checkpoint_step() >= 40; },
                           absl::Seconds(120)))
        << cluster.Logs();
    const v1::JobStatus before = cluster.Status(id);
    EXPECT_LT(before.step(), kSteps) << "the job ended before it could be interrupted";
    EXPECT_EQ(before.worker_ids_size(), world);
    const int victim = Cluster::WorkerIndex(before.worker_ids(world - 1));
    EXPECT_GE(victim, 0);
    cluster.worker(victim).Signal(signal);
    EXPECT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(120))) << cluster.Logs();
    const v1::JobStatus after = cluster.Status(id);
    EXPECT_EQ(after.restarts(), 1) << cluster.Logs();
    EXPECT_EQ(after.generation(), 2);
    bool lost = false;
    for (const auto& e : after.events()) {
      // A killed process drops its session (CONNECTION_LOST, or WORKER_LOST should its
      // heartbeat deadline pass first); a frozen one only goes silent (WORKER_LOST).
      if (e.type() == v1::WORKER_LOST || (signal == SIGKILL && e.type() == v1::CONNECTION_LOST)) {
        lost = true;
        EXPECT_THAT(e.message(), HasSubstr(before.worker_ids(world - 1)));
      }
    }
    EXPECT_TRUE(lost);
    EXPECT_THAT(cluster.Logs(), HasSubstr("restored checkpoint"));
    if (signal == SIGSTOP) cluster.worker(victim).Signal(SIGKILL);
    cluster.KillEverything();
    return after;
  }

  // The job run straight, then interrupted by `signal` (InterruptedBySignal), ends with the
  // same model.
  void ExpectTheSameModelAsUninterrupted(int world, int signal) {
    const v1::JobStatus straight = Uninterrupted(world);
    ExpectSameModel(straight, InterruptedBySignal(world, signal));
  }

  TempDir dir_;
  std::string corpus_;
};

// A checkpoint that cannot be stored is not silent: with checkpointd SIGKILLed mid-job, the
// workers' next saves fail, the job records CHECKPOINT_FAILED events that say which step and
// why, and trains on; once checkpointd is back on its port and data, saves commit again and
// the job succeeds.
TEST_F(RecoveryE2eTest, SavesFailingWhileCheckpointdIsDownAreJobEventsAndTheJobGoesOn) {
  // Long enough to outlast the kill, the failed upload's 3 s wait for checkpointd (client/
  // rpc_call.h) and the restart: one machine reported the failure at step ~390.
  constexpr int kLongSteps = 1500;
  Cluster cluster(dir_.File("checkpointd-down"), 2);
  cluster.Start();
  auto job =
      cluster.client().SubmitJob(testing::RecoveryJobSpec("ckpt-down", corpus_, 2, kLongSteps));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  ASSERT_TRUE(Eventually([&] { return cluster.Status(id).checkpoint_step() >= 20; },
                         absl::Seconds(120)))
      << cluster.Logs();
  cluster.KillCheckpointd();
  const auto failed_event = [&]() -> std::optional<v1::JobEvent> {
    const v1::JobStatus status = cluster.Status(id);
    for (const auto& e : status.events()) {
      if (e.type() == v1::CHECKPOINT_FAILED) return e;
    }
    return std::nullopt;
  };
  ASSERT_TRUE(Eventually([&] { return failed_event().has_value(); }, absl::Seconds(120)))
      << cluster.Logs();
  const v1::JobStatus during = cluster.Status(id);
  EXPECT_EQ(during.state(), v1::RUNNING) << cluster.Logs();
  EXPECT_LT(during.step(), kLongSteps) << "the job ended before checkpointd came back";
  const v1::JobEvent failed = *failed_event();
  EXPECT_THAT(failed.message(), ::testing::MatchesRegex(
                                    "checkpoint at step [0-9]+ not saved by rank [01] .*"));
  const int64_t committed_before = during.checkpoint_step();

  ASSERT_NO_FATAL_FAILURE(cluster.RestartCheckpointd());
  ASSERT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(180))) << cluster.Logs();
  const v1::JobStatus after = cluster.Status(id);
  EXPECT_GT(after.checkpoint_step(), committed_before) << "no save committed after the restart";
  EXPECT_EQ(after.generation(), 1) << "a failed save must not restart the job";
  cluster.KillEverything();
}

// A save whose answer from checkpointd is lost after checkpointd stored the shard: the
// worker's upload goes again, checkpointd replaces what the first stream left, and the
// checkpoint commits with no CHECKPOINT_FAILED event and no restart.
TEST_F(RecoveryE2eTest, ASaveWhoseAnswerIsLostIsSentAgainAndCommits) {
  Cluster cluster(dir_.File("lost-save-answer"), 2);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  // The workers started by Start dial checkpointd itself: start them again through a proxy.
  auto proxy = testing::TcpProxy::Start(cluster.checkpointd_port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  cluster.set_checkpointd_dial((*proxy)->address());
  for (int i = 0; i < 2; ++i) {
    cluster.worker(i).Signal(SIGKILL);
    (void)cluster.worker(i).Wait(absl::Seconds(10));
    ASSERT_NO_FATAL_FAILURE(cluster.StartWorker(i));
  }
  // Saves at 200 and 400: the first one comes seconds after the start.
  v1::JobSpec spec = testing::RecoveryJobSpec("lost-answer", corpus_, 2, 400);
  spec.mutable_checkpoint()->set_interval_steps(200);
  auto job = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  // Past the start (where a restore may read from checkpointd), before the first save.
  ASSERT_TRUE(Eventually([&] { return cluster.Status(id).step() >= 3; }, absl::Seconds(60)))
      << cluster.Logs();
  ASSERT_LT(cluster.Status(id).step(), 200) << "the first save came before the cut was armed";
  (*proxy)->CutOnNextGrpcResponse();
  ASSERT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(120))) << cluster.Logs();
  EXPECT_EQ((*proxy)->cuts(), 1) << "no answer from checkpointd was cut";
  const v1::JobStatus s = cluster.Status(id);
  EXPECT_EQ(s.checkpoint_step(), 400);
  EXPECT_EQ(s.restarts(), 0);
  for (const auto& e : s.events()) {
    EXPECT_NE(e.type(), v1::CHECKPOINT_FAILED) << e.message();
  }
  cluster.KillEverything();
}

// The same with checkpointd's disk full: its data directory is a 16 MiB tmpfs made for the
// test and each checkpoint is about 20 MB, so every save is refused by checkpointd itself;
// the events say so and the job still trains to the end. Needs root (mount); skips otherwise.
TEST_F(RecoveryE2eTest, SavesRefusedByAFullDiskAreJobEventsAndTheJobGoesOn) {
  const std::string dir = dir_.File("disk-full");
  // Destroyed after the cluster (whose processes die with it), on every way out of the test.
  auto disk = testing::SmallDisk::Mount(Cluster::CheckpointDirUnder(dir), 16 << 20);
  if (!disk.ok()) GTEST_SKIP() << disk.status();
  Cluster cluster(dir, 2);
  cluster.Start();
  v1::JobSpec spec = testing::RecoveryJobSpec("disk-full", corpus_, 2, 60);
  // 1.6M parameters: params, m and v are about 20 MB a checkpoint.
  spec.mutable_model()->set_hidden_size(256);
  spec.mutable_model()->set_num_heads(4);
  auto job = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  EXPECT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(180))) << cluster.Logs();
  const v1::JobStatus after = cluster.Status(id);
  std::vector<std::string> failures;
  for (const auto& e : after.events()) {
    if (e.type() == v1::CHECKPOINT_FAILED) failures.push_back(e.message());
  }
  ASSERT_FALSE(failures.empty()) << after.DebugString() << cluster.Logs();
  EXPECT_THAT(failures[0], HasSubstr("not saved by rank"));
  // checkpointd refuses the shard before storing any of it, naming the bytes.
  EXPECT_THAT(absl::StrJoin(failures, "\n"), HasSubstr("no room on the checkpoint store's disk"));
  EXPECT_EQ(after.checkpoint_step(), 0);
  // A rank whose save failed tells rank 0 at once: rank 0 does not sit out its commit timeout
  // while the other rank reaches the end of training and times out in a collective.
  EXPECT_EQ(after.restarts(), 0) << after.DebugString() << cluster.Logs();
  cluster.KillEverything();
}

// Issue 37: one worker with a checkpointd and one without used to stall every generation at
// its first save until the 60 s collective timeout, restart from step 0, and loop until
// max_restarts. The rendezvous now refuses the one without at once (MEMBER_REFUSED, no
// restart spent); with a fitting worker the job trains, and its generation says it started
// fresh, then (after a kill) which checkpoint it restored.
TEST_F(RecoveryE2eTest, AMemberWithoutCheckpointdIsRefusedAtOnceAndTheJobRunsWithoutIt) {
  Cluster cluster(dir_.File("disagree"), 3);
  ASSERT_NO_FATAL_FAILURE(cluster.StartServices());
  ASSERT_NO_FATAL_FAILURE(cluster.StartWorker(0));
  ASSERT_NO_FATAL_FAILURE(cluster.StartWorker(1, /*checkpointd=*/false));
  auto job = cluster.client().SubmitJob(testing::RecoveryJobSpec("disagree", corpus_, 2, 60));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  auto refused = [&]() -> std::optional<v1::JobEvent> {
    const v1::JobStatus s = cluster.Status(id);
    for (const auto& e : s.events()) {
      if (e.type() == v1::MEMBER_REFUSED) return e;
    }
    return std::nullopt;
  };
  // Seconds, not the 60 s of a collective timeout.
  ASSERT_TRUE(Eventually([&] { return refused().has_value(); }, absl::Seconds(20)))
      << cluster.Logs();
  EXPECT_THAT(refused()->message(), HasSubstr("node/cpu1 has no checkpointd"));
  EXPECT_EQ(cluster.Status(id).restarts(), 0);
  EXPECT_TRUE(cluster.WaitFor(id, v1::PENDING, absl::Seconds(10))) << cluster.Logs();

  ASSERT_NO_FATAL_FAILURE(cluster.StartWorker(2));
  EXPECT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(120))) << cluster.Logs();
  const v1::JobStatus after = cluster.Status(id);
  EXPECT_EQ(after.restarts(), 0);
  EXPECT_GT(after.checkpoint_step(), 0);
  bool fresh = false;
  for (const auto& e : after.events()) {
    fresh |= e.type() == v1::STARTED_FRESH &&
             absl::StrContains(e.message(), "from seed 5 (no checkpoint of job " + id + ")");
  }
  EXPECT_TRUE(fresh) << after.DebugString();

  // Resuming from it restores its last checkpoint and says so; resuming from a job with none
  // is refused at submit.
  v1::JobSpec next = testing::RecoveryJobSpec("next", corpus_, 2, 80);
  next.set_resume_from_job(id);
  auto resumed = cluster.client().SubmitJob(next);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(cluster.WaitFor(resumed->job_id(), v1::SUCCEEDED, absl::Seconds(120)))
      << cluster.Logs();
  bool restored = false;
  const v1::JobStatus resumed_status = cluster.Status(resumed->job_id());
  for (const auto& e : resumed_status.events()) {
    restored |= e.type() == v1::CHECKPOINT_RESTORED &&
                absl::StrContains(e.message(), absl::StrCat("restored step ",
                                                            after.checkpoint_step(), " from job ",
                                                            id, " (world 2 -> 2)"));
  }
  EXPECT_TRUE(restored) << resumed_status.DebugString();
  cluster.KillEverything();
}

TEST_F(RecoveryE2eTest, KilledWorkerOfTwoIsReplacedByASpareAndTheModelIsUnchanged) {
  ExpectTheSameModelAsUninterrupted(2, SIGKILL);
}

TEST_F(RecoveryE2eTest, KilledWorkerOfThreeIsReplacedByASpareAndTheModelIsUnchanged) {
  ExpectTheSameModelAsUninterrupted(3, SIGKILL);
}

// A frozen process keeps its connection: the missed heartbeats (1.5 s) give it away.
TEST_F(RecoveryE2eTest, HungWorkerIsDetectedAndReplacedAndTheModelIsUnchanged) {
  ExpectTheSameModelAsUninterrupted(2, SIGSTOP);
}

// The workers train on while the coordinator is down (their collectives need none) and attach
// again to the generation the restarted coordinator kept: no step is trained twice, no restart
// is spent, and the saves after the outage commit in the same generation (their store is the
// one the previous process wrote through). The model is the uninterrupted run's, bit for bit.
TEST_F(RecoveryE2eTest, KilledAndRestartedCoordinatorKeepsTheGenerationAndTheJobFinishes) {
  // Long enough to train on well past the outage and the members' return (about 4 s).
  constexpr int64_t kLongSteps = 3 * kSteps;
  const v1::JobStatus straight = Uninterrupted(2, kLongSteps);
  Cluster cluster(dir_.File("coordinator-restart"), 2);
  cluster.Start();
  auto job = cluster.client().SubmitJob(Spec(2, kLongSteps));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  ASSERT_TRUE(Eventually([&] { return cluster.Status(id).checkpoint_step() >= 40; },
                         absl::Seconds(120)))
      << cluster.Logs();
  const v1::JobStatus before = cluster.Status(id);
  ASSERT_LT(before.step(), kSteps);
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator(/*down=*/absl::Seconds(2)));
  const auto kept_events = [](const v1::JobStatus& s) {
    int kept = 0;
    for (const auto& e : s.events()) kept += e.type() == v1::GENERATION_KEPT ? 1 : 0;
    return kept;
  };
  ASSERT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(120))) << cluster.Logs();
  const v1::JobStatus after = cluster.Status(id);
  EXPECT_EQ(after.generation(), 1) << after.DebugString();
  EXPECT_EQ(after.restarts(), 0);
  EXPECT_EQ(after.step(), kLongSteps);
  for (const auto& e : after.events()) {
    EXPECT_NE(e.type(), v1::WORKER_LOST) << e.message();
    EXPECT_NE(e.type(), v1::CONNECTION_LOST) << e.message();
  }
  // Kept, then every member attached again while it trained.
  EXPECT_EQ(kept_events(after), 2) << after.DebugString();
  EXPECT_GT(after.checkpoint_step(), before.checkpoint_step()) << after.DebugString();
  const std::string logs = cluster.Logs();
  EXPECT_THAT(logs, HasSubstr("attached again to job"));
  EXPECT_THAT(logs, ::testing::Not(HasSubstr("restored checkpoint")));
  ExpectSameModel(straight, after);
  cluster.KillEverything();
}

// Workers that fail the same way every time a generation starts (here: their checkpointd is
// unreachable, so nothing can be restored) do not loop forever: each failure costs a restart,
// and once the budget is spent the job FAILS with the workers' own error, which
// `trainctl status` shows.
TEST_F(RecoveryE2eTest, WorkersFailingAtEveryStartExhaustTheBudgetAndTheJobSaysWhy) {
  auto coordinator = testing::CoordinatorProcess::Start(dir_.File("startup-coordinator"),
                                                        {"--tick-interval-ms=50"});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<std::unique_ptr<testing::Subprocess>> workers;
  for (int i = 0; i < 2; ++i) {
    auto w = testing::Subprocess::Start(
        {testing::BinDir() + "/weft-worker", "--coordinator=" + (*coordinator)->address(),
         absl::StrCat("--device=cpu:", i), "--host=node", "--checkpointd=127.0.0.1:1",
         "--metrics-address=none", "--output-dir=" + dir_.File("startup-models")},
        dir_.File(absl::StrCat("startup-worker", i, ".log")));
    ASSERT_TRUE(w.ok());
    workers.push_back(std::move(*w));
  }
  CoordinatorClient client((*coordinator)->address());
  auto job = client.SubmitJob(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  v1::JobStatus status;
  ASSERT_TRUE(Eventually(
      [&] {
        auto j = client.GetJob(job->job_id());
        if (j.ok()) status = j->status();
        return status.state() == v1::FAILED;
      },
      absl::Seconds(120)))
      << testing::ReadFile((*coordinator)->log_path());
  EXPECT_EQ(status.restarts(), 2);  // the spec's max_restarts
  EXPECT_EQ(status.step(), 0);
  EXPECT_THAT(status.error(), HasSubstr("restart budget exhausted"));
  EXPECT_THAT(status.error(), HasSubstr("127.0.0.1:1"));  // the workers' own error
  int rank_errors = 0;
  for (const auto& e : status.events()) rank_errors += e.type() == v1::RANK_ERROR;
  EXPECT_GE(rank_errors, 3) << "one failed start per generation";

  testing::CommandResult shown =
      testing::RunCommand({testing::BinDir() + "/trainctl", "--coordinator",
                           (*coordinator)->address(), "status", job->job_id()});
  EXPECT_EQ(shown.exit_code, 0);
  EXPECT_THAT(shown.out, HasSubstr("FAILED"));
  EXPECT_THAT(shown.out, HasSubstr("restart budget exhausted"));
  EXPECT_THAT(shown.out, HasSubstr("127.0.0.1:1"));
  for (auto& w : workers) EXPECT_TRUE(w->Running()) << "a failed start must not kill the worker";
}

}  // namespace
}  // namespace weft

