// Recovery with real processes (coordinator, checkpointd, CPU workers on 127.0.0.1): a worker
// SIGKILLed or SIGSTOPped mid-job is declared lost, the survivors abort their collectives, a
// new generation forms with an idle spare, restores the last checkpoint and finishes; a
// SIGKILLed and restarted coordinator picks the job up again. Each ends SUCCEEDED with the
// model an uninterrupted run of the same world size gives, bit for bit.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
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

  v1::JobSpec Spec(int world) const {
    return testing::RecoveryJobSpec("recover", corpus_, world, kSteps);
  }

  // The same job without interruption, on exactly `world` workers.
  v1::JobStatus Uninterrupted(int world) {
    return testing::RunUninterrupted(dir_.File(absl::StrCat("straight", world)), world,
                                     Spec(world));
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

// The workers keep training and retrying their reports while the coordinator is down; the
// restarted coordinator reloads the job, ends the generation it cannot vouch for, and a new
// one resumes from the last checkpoint.
TEST_F(RecoveryE2eTest, KilledAndRestartedCoordinatorFinishesTheJob) {
  const v1::JobStatus straight = Uninterrupted(2);
  Cluster cluster(dir_.File("coordinator-restart"), 2);
  cluster.Start();
  auto job = cluster.client().SubmitJob(Spec(2));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  ASSERT_TRUE(Eventually([&] { return cluster.Status(id).checkpoint_step() >= 40; },
                         absl::Seconds(120)))
      << cluster.Logs();
  ASSERT_LT(cluster.Status(id).step(), kSteps);
  ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator());
  ASSERT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(120))) << cluster.Logs();
  const v1::JobStatus after = cluster.Status(id);
  EXPECT_GE(after.generation(), 2);
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
