// A chaos soak with real processes: a 2-worker job with one spare trains while the coordinator,
// checkpointd and the workers are SIGKILLed at random moments (each started again right after),
// for about two minutes. The job must succeed with the model of an uninterrupted run, bit for
// bit, and nothing the services acknowledged may be lost: the job stays known, its committed
// checkpoint step and restart count never go back, and its newest committed checkpoint is the
// one checkpointd holds. Prints `CHAOS seed=S kills=K ... steps_redone=R` for the notes.
// WEFT_CHAOS_SEED replays a run's kill schedule; WEFT_CHAOS_SECONDS changes its length.
#include <signal.h>

#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/checkpoint_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"

namespace weft {
namespace {

using testing::Cluster;
using testing::ExpectSameModel;
using testing::TempDir;

int64_t EnvInt(const char* name, int64_t fallback) {
  int64_t v = 0;
  const char* s = std::getenv(name);
  return s != nullptr && absl::SimpleAtoi(s, &v) ? v : fallback;
}

// What the soak saw of the job, poll by poll: what must never go back, and the steps redone.
struct Observed {
  int64_t checkpoint_step = 0;
  int32_t restarts = 0;
  int64_t generation = 0;
  int64_t step = 0;
  int64_t steps_redone = 0;
  int polls_unknown = 0;  // polls that found no such job (the coordinator down is not that)

  void Poll(Cluster& cluster, const std::string& id) {
    auto job = cluster.client().GetJob(id);
    if (!job.ok()) {
      // A coordinator just killed is unreachable; one that answers must know the job.
      if (job.status().code() == absl::StatusCode::kNotFound) ++polls_unknown;
      return;
    }
    const v1::JobStatus& s = job->status();
    EXPECT_GE(s.checkpoint_step(), checkpoint_step) << "a committed checkpoint was forgotten";
    EXPECT_GE(s.restarts(), restarts) << "a restart was forgotten";
    checkpoint_step = std::max(checkpoint_step, s.checkpoint_step());
    restarts = std::max(restarts, s.restarts());
    if (s.generation() > generation) {
      // A new generation restores the newest checkpoint: what was trained past it is redone.
      for (const auto& e : s.events()) {
        int64_t restored = 0;
        if (e.type() == v1::CHECKPOINT_RESTORED && e.generation() == s.generation() &&
            sscanf(e.message().c_str(), "restored step %ld", &restored) == 1) {
          steps_redone += std::max<int64_t>(0, step - restored);
          generation = s.generation();
        }
        if (e.type() == v1::STARTED_FRESH && e.generation() == s.generation()) {
          steps_redone += step;
          generation = s.generation();
        }
      }
    }
    step = std::max(step, s.step());
  }
};

TEST(ChaosE2eTest, RandomKillsOfEveryProcessLoseNothingAndChangeNoBit) {
  TempDir dir;
  const std::string corpus = dir.File("corpus.txt");
  testing::WriteFile(corpus, testing::WordCorpus());
  v1::JobSpec spec = testing::RecoveryJobSpec("chaos", corpus, 2, 4500);
  spec.mutable_fault()->set_max_restarts(100);
  spec.mutable_checkpoint()->set_interval_steps(25);
  // About 90 s on an idle 2-core machine, over 120 s on a loaded one.
  const v1::JobStatus straight =
      testing::RunUninterrupted(dir.File("straight"), 2, spec, absl::Seconds(400));
  ASSERT_EQ(straight.state(), v1::SUCCEEDED);

  const uint32_t seed = static_cast<uint32_t>(
      EnvInt("WEFT_CHAOS_SEED", absl::ToUnixMicros(absl::Now()) & 0x7fffffff));
  const absl::Duration length = absl::Seconds(EnvInt("WEFT_CHAOS_SECONDS", 120));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> victim_of(0, 4);  // coordinator, checkpointd, worker 0-2
  std::uniform_int_distribution<int> gap_ms(2000, 6000);

  Cluster cluster(dir.File("chaos"), 3);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto submitted = cluster.client().SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job_id();

  std::map<std::string, int> kills;
  Observed seen;
  const absl::Time end = absl::Now() + length;
  absl::Time next_kill = absl::Now() + absl::Milliseconds(gap_ms(rng));
  while (absl::Now() < end) {
    seen.Poll(cluster, id);
    if (cluster.Status(id).state() == v1::SUCCEEDED) break;
    if (absl::Now() < next_kill) {
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    const int victim = victim_of(rng);
    if (victim == 0) {
      ASSERT_NO_FATAL_FAILURE(cluster.RestartCoordinator());
      ++kills["coordinator"];
    } else if (victim == 1) {
      cluster.KillCheckpointd();
      ASSERT_NO_FATAL_FAILURE(cluster.RestartCheckpointd());
      ++kills["checkpointd"];
    } else {
      const int w = victim - 2;
      cluster.worker(w).Signal(SIGKILL);
      (void)cluster.worker(w).Wait(absl::Seconds(10));
      ASSERT_NO_FATAL_FAILURE(cluster.StartWorker(w));
      ++kills["worker"];
    }
    next_kill = absl::Now() + absl::Milliseconds(gap_ms(rng));
  }
  EXPECT_TRUE(cluster.WaitFor(id, v1::SUCCEEDED, absl::Seconds(240)))
      << "seed " << seed << "\n" << cluster.Status(id).DebugString() << cluster.Logs();
  seen.Poll(cluster, id);
  const v1::JobStatus after = cluster.Status(id);
  EXPECT_EQ(seen.polls_unknown, 0) << "the coordinator answered that it did not know the job";

  // The newest committed checkpoint is in checkpointd.
  CheckpointClient checkpoints(cluster.checkpointd_address());
  auto listed = checkpoints.List(id);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_FALSE(listed->empty());
  EXPECT_EQ(listed->front().step(), after.checkpoint_step()) << "seed " << seed;

  ExpectSameModel(straight, after);
  int total = 0;
  for (const auto& [what, n] : kills) total += n;
  std::printf("CHAOS seed=%u kills=%d coordinator=%d checkpointd=%d worker=%d restarts=%d "
              "generations=%ld steps=%ld steps_redone=%ld\n",
              seed, total, kills["coordinator"], kills["checkpointd"], kills["worker"],
              after.restarts(), after.generation(), after.step(), seen.steps_redone);
  cluster.KillEverything();
}

}  // namespace
}  // namespace weft
