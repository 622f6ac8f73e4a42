// weft-worker --device cuda:K end to end: a real coordinator and real worker processes, one per
// GPU, NCCL between them. Label gpu: skips without two GPUs.
//  - two GPU workers train a job to completion through the services;
//  - a rank SIGKILLed mid-training leaves the survivor inside NCCL for less than the job's
//    heartbeat timeout (its dropped connection gives it away), a SIGSTOPped one for the
//    timeout plus the abort's latency: the coordinator declares the rank lost and tells the
//    survivor to abort, which calls ncclCommAbort;
//  - a job whose memory plan does not fit fails before training, its error giving the numbers.
#include <cuda_runtime_api.h>
#include <signal.h>

#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

using testing::CoordinatorProcess;
using testing::Eventually;
using testing::Subprocess;
using testing::TempDir;
using ::testing::HasSubstr;

constexpr int kHeartbeatTimeoutMs = 3000;

std::string Corpus() {
  const char* subjects[] = {"the cat", "a dog", "the old man", "my friend", "the bird"};
  const char* verbs[] = {"sees", "likes", "finds", "wants", "helps"};
  const char* objects[] = {"the ball.", "a red hat.", "the sun.", "some bread.", "the river."};
  std::string text;
  for (int i = 0; i < 4000; ++i) {
    absl::StrAppend(&text, subjects[i % 5], " ", verbs[(i / 5) % 5], " ", objects[(i / 25) % 5],
                    "\n");
  }
  return text;
}

class GpuWorkerE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 2) {
      GTEST_SKIP() << "needs 2 CUDA devices";
    }
    auto cp = CoordinatorProcess::Start(dir_.path(), {"--tick-interval-ms=50"});
    ASSERT_TRUE(cp.ok()) << cp.status();
    coordinator_ = std::move(*cp);
    client_ = std::make_unique<CoordinatorClient>(coordinator_->address());
    corpus_ = dir_.File("corpus.txt");
    testing::WriteFile(corpus_, Corpus());
    for (int i = 0; i < 2; ++i) {
      auto p = Subprocess::Start(
          {testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
           absl::StrCat("--device=cuda:", i), "--host=node", "--output-dir=" + dir_.File("models"),
           "--collective-timeout-ms=120000", "--metrics-address=none", "--checkpointd=none"},
          dir_.File(absl::StrCat("worker", i, ".log")));
      ASSERT_TRUE(p.ok());
      workers_.push_back(std::move(*p));
    }
    ASSERT_TRUE(Eventually(
        [&] {
          auto w = client_->ListWorkers();
          return w.ok() && w->size() == 2;
        },
        absl::Seconds(30)))
        << Logs();
  }

  // A small GPT on the GPU; `batch` sequences of 256 bytes per rank.
  v1::JobSpec Spec(int64_t steps, int batch = 8) {
    auto spec = ParseJobSpecText(absl::StrCat(R"pb(
      name: "gpu-e2e"
      model { num_layers: 4 hidden_size: 256 num_heads: 4 vocab_size: 256 context_length: 256 }
      data { format: DATA_FORMAT_TEXT_BYTES val_fraction: 0.1 train_path: ")pb", corpus_,
                                              R"pb(" }
      optimizer { learning_rate: 0.003 }
      lr_schedule { warmup_steps: 5 }
      training { val_interval_steps: 25 seed: 3 micro_batch_size: )pb", batch,
                                              " total_steps: ", steps, R"pb( }
      zero_stage: 3
      resources { device_kind: DEVICE_KIND_CUDA min_workers: 2 }
      fault { heartbeat_interval_ms: 250 heartbeat_timeout_ms: )pb",
                                              kHeartbeatTimeoutMs, R"pb( max_restarts: 0 }
    )pb"),
                                 "gpu-e2e");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  v1::JobStatus WaitForEnd(const std::string& id, absl::Duration timeout) {
    v1::JobStatus status;
    Eventually(
        [&] {
          auto job = client_->GetJob(id);
          if (job.ok()) status = job->status();
          return job.ok() && (status.state() == v1::SUCCEEDED || status.state() == v1::FAILED ||
                              status.state() == v1::CANCELLED);
        },
        timeout);
    return status;
  }

  bool WaitForStep(const std::string& id, int64_t step) {
    return Eventually(
        [&] {
          auto job = client_->GetJob(id);
          return job.ok() && job->status().step() >= step;
        },
        absl::Seconds(120));
  }

  std::string Logs() {
    std::string all = testing::ReadFile(coordinator_->log_path());
    for (size_t i = 0; i < workers_.size(); ++i) {
      absl::StrAppend(&all, "\n--- worker ", i, "\n",
                      testing::ReadFile(dir_.File(absl::StrCat("worker", i, ".log"))));
    }
    return all;
  }

  // Stops rank 1's process with `signal` mid-training and returns how long rank 0 stayed in
  // the generation afterwards (until its own log says the run was aborted).
  absl::Duration SurvivorReleaseAfter(int signal) {
    auto submitted = client_->SubmitJob(Spec(1000000));
    EXPECT_TRUE(submitted.ok());
    EXPECT_TRUE(WaitForStep(submitted->job_id(), 20)) << Logs();
    workers_[1]->Signal(signal);
    const absl::Time stopped = absl::Now();
    EXPECT_TRUE(Eventually(
        [&] {
          return absl::StrContains(testing::ReadFile(dir_.File("worker0.log")), ": aborted:");
        },
        absl::Seconds(30)))
        << Logs();
    const absl::Duration released = absl::Now() - stopped;
    const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(30));
    EXPECT_EQ(s.state(), v1::FAILED) << Logs();
    EXPECT_THAT(s.error(), HasSubstr("node/cuda1"));
    EXPECT_TRUE(workers_[0]->Running()) << Logs();
    std::printf("survivor released %.2f s after signal %d (heartbeat timeout %.1f s)\n",
                absl::ToDoubleSeconds(released), signal, kHeartbeatTimeoutMs / 1000.0);
    if (signal == SIGSTOP) workers_[1]->Signal(SIGKILL);
    return released;
  }

  TempDir dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string corpus_;
};

TEST_F(GpuWorkerE2eTest, TwoGpuWorkersTrainToCompletion) {
  auto submitted = client_->SubmitJob(Spec(60));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(120));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.error() << "\n" << Logs();
  EXPECT_EQ(s.step(), 60);
  EXPECT_LT(s.last_metrics().loss(), 2.0) << "did not learn the corpus";
  EXPECT_GT(s.last_metrics().engine_device_bytes(), 0);
  EXPECT_GE(s.last_metrics().device_used_bytes(), s.last_metrics().engine_device_bytes());
  EXPECT_FALSE(s.model_path().empty());
}

// A killed process drops its session: the coordinator declares it dead after
// the 1 s connection-lost grace and tells the survivor to abort (ncclCommAbort). The release,
// log polling included, comes well inside the 3 s heartbeat timeout.
TEST_F(GpuWorkerE2eTest, KilledRankReleasesTheSurvivorWithinTheHeartbeatTimeout) {
  EXPECT_LT(SurvivorReleaseAfter(SIGKILL), absl::Milliseconds(kHeartbeatTimeoutMs));
}

// A frozen process keeps its sockets and NVLink mappings: only the heartbeat deadline can
// tell, after which the survivor is released at once (instead of spinning in its NCCL kernel
// until the 120 s collective timeout). Margin: the coordinator's tick, the abort, the polling.
TEST_F(GpuWorkerE2eTest, FrozenRankReleasesTheSurvivorAtTheHeartbeatTimeout) {
  EXPECT_LT(SurvivorReleaseAfter(SIGSTOP), absl::Milliseconds(kHeartbeatTimeoutMs + 1000));
}

TEST_F(GpuWorkerE2eTest, ImpossibleMemoryFailsTheJobBeforeTrainingWithTheNumbers) {
  // 256 sequences of 256 tokens per GPU at width 8192 need ~100s of GiB of activations.
  auto spec = ParseJobSpecText(absl::StrCat(R"pb(
      name: "too-big"
      model { num_layers: 8 hidden_size: 8192 num_heads: 64 vocab_size: 256 context_length: 256 }
      data { format: DATA_FORMAT_TEXT_BYTES val_fraction: 0.1 train_path: ")pb", corpus_,
                                            R"pb(" }
      optimizer { learning_rate: 0.003 }
      training { micro_batch_size: 256 total_steps: 10 }
      zero_stage: 3
      resources { device_kind: DEVICE_KIND_CUDA min_workers: 2 }
      fault { max_restarts: 3 }
    )pb"),
                               "too-big");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto submitted = client_->SubmitJob(*spec);
  ASSERT_TRUE(submitted.ok());
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(60));
  EXPECT_EQ(s.state(), v1::FAILED) << Logs();
  EXPECT_EQ(s.restarts(), 0) << "a job that cannot fit must not be retried";
  EXPECT_EQ(s.step(), 0);
  EXPECT_THAT(s.error(), HasSubstr("GiB is free"));
  EXPECT_THAT(s.error(), HasSubstr("micro_batch_size"));
}

}  // namespace
}  // namespace weft
