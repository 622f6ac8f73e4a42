// weft-worker --device cuda:K end to end: a real coordinator and real worker processes, one per
// GPU, NCCL between them. Label gpu: each fixture skips without its GPUs (one or two), so a
// one-GPU machine still runs the first and the last case.
//  - one GPU worker, and two, train a job to completion through the services;
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
#include "tests/worker/cluster.h"

namespace weft {
namespace {

using testing::Eventually;
using ::testing::HasSubstr;

constexpr int kHeartbeatTimeoutMs = 3000;

// `gpus` workers, node/cuda0..gpus-1, each on its own GPU.
class GpuWorkersTest : public testing::WorkersTest {
 protected:
  explicit GpuWorkersTest(int gpus) : gpus_(gpus) {}

  void SetUp() override {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < gpus_) {
      GTEST_SKIP() << "needs " << gpus_ << " CUDA devices";
    }
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(testing::SentenceCorpus(4000)));
    for (int i = 0; i < gpus_; ++i) {
      ASSERT_NO_FATAL_FAILURE(StartWorker(absl::StrCat("cuda:", i),
                                          {"--collective-timeout-ms=120000",
                                           "--metrics-address=none", "--checkpointd=none"}));
    }
    ASSERT_TRUE(Eventually(
        [&] {
          auto w = client_->ListWorkers();
          return w.ok() && static_cast<int>(w->size()) == gpus_;
        },
        absl::Seconds(30)))
        << Logs();
  }

  // A small GPT on every GPU; `batch` sequences of 256 bytes per rank.
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
      resources { device_kind: DEVICE_KIND_CUDA min_workers: )pb",
                                              gpus_, R"pb( }
      fault { heartbeat_interval_ms: 250 heartbeat_timeout_ms: )pb",
                                              kHeartbeatTimeoutMs, R"pb( max_restarts: 0 }
    )pb"),
                                 "gpu-e2e");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // Trains Spec(60) through the services and checks that it learned and reported memory.
  void TrainToCompletion() {
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

  const int gpus_;
};

class OneGpuWorkerE2eTest : public GpuWorkersTest {
 protected:
  OneGpuWorkerE2eTest() : GpuWorkersTest(1) {}
};

class GpuWorkerE2eTest : public GpuWorkersTest {
 protected:
  GpuWorkerE2eTest() : GpuWorkersTest(2) {}

  // Stops rank 1's process with `signal` mid-training and returns how long rank 0 stayed in
  // the generation afterwards (until its own log says the run was aborted).
  absl::Duration SurvivorReleaseAfter(int signal) {
    auto submitted = client_->SubmitJob(Spec(1000000));
    EXPECT_TRUE(submitted.ok());
    EXPECT_TRUE(WaitForStep(submitted->job_id(), 20, absl::Seconds(120))) << Logs();
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
};

TEST_F(OneGpuWorkerE2eTest, OneGpuWorkerTrainsToCompletion) { TrainToCompletion(); }

TEST_F(GpuWorkerE2eTest, TwoGpuWorkersTrainToCompletion) { TrainToCompletion(); }

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

TEST_F(OneGpuWorkerE2eTest, ImpossibleMemoryFailsTheJobBeforeTrainingWithTheNumbers) {
  // 4096 sequences of 256 tokens at width 8192 on one GPU: even with every block recomputed
  // (the last resort of activation checkpointing AUTO, the default), the 8 blocks' saved
  // inputs alone are 128 GiB, beside 96 GiB of optimizer state, more than any GPU has. The job
  // is Spec's with that model and batch, 3 restarts allowed, and nothing else set.
  v1::JobSpec spec = Spec(10, 4096);
  spec.set_name("too-big");
  spec.mutable_model()->set_num_layers(8);
  spec.mutable_model()->set_hidden_size(8192);
  spec.mutable_model()->set_num_heads(64);
  spec.clear_lr_schedule();
  spec.mutable_training()->clear_val_interval_steps();
  spec.mutable_training()->clear_seed();
  spec.clear_fault();
  spec.mutable_fault()->set_max_restarts(3);
  auto submitted = client_->SubmitJob(spec);
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
