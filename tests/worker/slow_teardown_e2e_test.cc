// A generation run whose teardown outlasts the heartbeat timeout (real processes on 127.0.0.1:
// a coordinator and one CPU worker) does not get its worker declared dead: the agent tears runs
// down off its heartbeat thread. The slowness is real time spent in the run's thread, through
// the worker's test-only --test-teardown-delay-ms, standing for an upload that is finishing.
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kHeartbeatTimeoutMs = 1500;
// More than three heartbeat timeouts: a heartbeat thread that waited for it would be silent
// long enough to be declared dead several times over.
constexpr int kTeardownDelayMs = 5000;

// The worker `id` as the coordinator sees it (a default status if it is not listed).
v1::WorkerStatus WorkerNamed(CoordinatorClient& client, const std::string& id) {
  auto workers = client.ListWorkers();
  if (workers.ok()) {
    for (const auto& w : *workers) {
      if (w.info().worker_id() == id) return w;
    }
  }
  return v1::WorkerStatus();
}

TEST(SlowTeardownE2eTest, WorkerStaysAliveWhileARunTearsDownLongerThanTheHeartbeatTimeout) {
  testing::TempDir dir;
  const std::string corpus = dir.File("corpus.txt");
  testing::WriteFile(corpus, testing::WordCorpus());
  auto coordinator = testing::CoordinatorProcess::Start(
      dir.File("coordinator"),
      {"--tick-interval-ms=50", "--heartbeat-interval-ms=200",
       absl::StrCat("--heartbeat-timeout-ms=", kHeartbeatTimeoutMs)});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string worker_log = dir.File("worker.log");
  auto worker = testing::Subprocess::Start(
      {testing::BinDir() + "/weft-worker", "--coordinator=" + (*coordinator)->address(),
       "--device=cpu:0", "--host=node", "--checkpointd=none", "--metrics-address=none",
       "--output-dir=" + dir.File("models"),
       absl::StrCat("--test-teardown-delay-ms=", kTeardownDelayMs)},
      worker_log);
  ASSERT_TRUE(worker.ok());
  CoordinatorClient client((*coordinator)->address());
  const std::string id = "node/cpu0";
  ASSERT_TRUE(testing::Eventually([&] { return WorkerNamed(client, id).incarnation() > 0; },
                                  absl::Seconds(30)))
      << testing::ReadFile(worker_log);
  const int64_t incarnation = WorkerNamed(client, id).incarnation();

  // A job far too long to finish here, cancelled once it trains: the worker aborts its run.
  v1::JobSpec long_job = testing::RecoveryJobSpec("long", corpus, 1, 1000000);
  ASSERT_EQ(long_job.fault().heartbeat_timeout_ms(), kHeartbeatTimeoutMs);
  auto job = client.SubmitJob(long_job);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto j = client.GetJob(job->job_id());
        return j.ok() && j->status().step() >= 5;
      },
      absl::Seconds(60)))
      << testing::ReadFile(worker_log);
  ASSERT_TRUE(client.CancelJob(job->job_id(), "test: tear the run down").ok());

  // Through the whole teardown and a heartbeat timeout past it, the worker is never dead.
  const absl::Time until = absl::Now() + absl::Milliseconds(kTeardownDelayMs +
                                                            2 * kHeartbeatTimeoutMs);
  bool teardown_seen = false;
  while (absl::Now() < until) {
    const v1::WorkerStatus w = WorkerNamed(client, id);
    ASSERT_NE(w.state(), v1::WORKER_DEAD) << w.reason() << "\n" << testing::ReadFile(worker_log);
    ASSERT_EQ(w.incarnation(), incarnation);
    teardown_seen = teardown_seen ||
                    absl::StrContains(testing::ReadFile(worker_log), "test-only teardown delay");
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(teardown_seen) << "the run never began its slow teardown\n"
                             << testing::ReadFile(worker_log);
  EXPECT_THAT(testing::ReadFile((*coordinator)->log_path()), Not(HasSubstr("missed heartbeats")));

  // The same process, still registered, takes the next job and finishes it.
  auto next = client.SubmitJob(testing::RecoveryJobSpec("next", corpus, 1, 20));
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(testing::Eventually(
      [&] {
        auto j = client.GetJob(next->job_id());
        return j.ok() && j->status().state() == v1::SUCCEEDED;
      },
      absl::Seconds(60)))
      << testing::ReadFile(worker_log);
  EXPECT_EQ(WorkerNamed(client, id).incarnation(), incarnation);
  EXPECT_TRUE((*worker)->Running());
}

}  // namespace
}  // namespace weft
