// Exact resume with real processes: a job whose every process (coordinator, checkpointd, both
// workers) is SIGKILLed after a checkpoint, then started again, ends with the same model, bit
// for bit, as the same job run without interruption.
#include <signal.h>

#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/data/safetensors.h"

namespace weft {
namespace {

using testing::CoordinatorProcess;
using testing::Eventually;
using testing::Subprocess;
using testing::TempDir;

std::string Corpus() {
  std::string text;
  const char* words[] = {"alpha ", "beta ", "gamma ", "delta ", "epsilon\n"};
  for (int i = 0; i < 4000; ++i) text += words[(i * 7 + i / 5) % 5];
  return text;
}

// A coordinator, a checkpointd and two workers whose state lives under `dir`.
class Cluster {
 public:
  explicit Cluster(const std::string& dir) : dir_(dir) {}

  void Start() {
    auto cp = CoordinatorProcess::Start(dir_ + "/coordinator", {"--tick-interval-ms=50"});
    ASSERT_TRUE(cp.ok()) << cp.status();
    coordinator_ = std::move(*cp);
    const std::string port_file = dir_ + "/checkpointd.port";
    std::remove(port_file.c_str());
    auto ck = Subprocess::Start({testing::BinDir() + "/weft-checkpointd", "--listen=127.0.0.1:0",
                                 "--port-file=" + port_file, "--data-dir=" + dir_ + "/ckpt",
                                 "--metrics-address=none"},
                                dir_ + "/checkpointd.log");
    ASSERT_TRUE(ck.ok());
    checkpointd_ = std::move(*ck);
    auto port = testing::WaitForFile(port_file, absl::Seconds(30));
    ASSERT_TRUE(port.ok()) << testing::ReadFile(dir_ + "/checkpointd.log");
    const std::string checkpointd =
        absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*port));
    for (int i = 0; i < 2; ++i) {
      auto w = Subprocess::Start(
          {testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
           absl::StrCat("--device=cpu:", i), "--host=node", "--checkpointd=" + checkpointd,
           "--output-dir=" + dir_ + "/models", "--metrics-address=none"},
          absl::StrCat(dir_, "/worker", i, ".log"));
      ASSERT_TRUE(w.ok());
      workers_.push_back(std::move(*w));
    }
    client_ = std::make_unique<CoordinatorClient>(coordinator_->address());
  }

  void KillEverything() {
    for (auto& w : workers_) w->Signal(SIGKILL);
    checkpointd_->Signal(SIGKILL);
    coordinator_->process().Signal(SIGKILL);
    for (auto& w : workers_) (void)w->Wait(absl::Seconds(10));
    (void)checkpointd_->Wait(absl::Seconds(10));
    (void)coordinator_->process().Wait(absl::Seconds(10));
    workers_.clear();
  }

  CoordinatorClient& client() { return *client_; }

  v1::JobStatus Status(const std::string& id) {
    auto job = client_->GetJob(id);
    return job.ok() ? job->status() : v1::JobStatus();
  }

  bool WaitFor(const std::string& id, v1::JobState state, absl::Duration timeout) {
    return Eventually([&] { return Status(id).state() == state; }, timeout);
  }

  std::string Logs() {
    std::string all = testing::ReadFile(coordinator_->log_path());
    for (const char* f : {"/worker0.log", "/worker1.log", "/checkpointd.log"}) {
      absl::StrAppend(&all, "\n--- ", f, "\n", testing::ReadFile(dir_ + f));
    }
    return all;
  }

 private:
  std::string dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<Subprocess> checkpointd_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::unique_ptr<CoordinatorClient> client_;
};

v1::JobSpec Spec(const std::string& corpus) {
  auto spec = ParseJobSpecText(absl::StrCat(R"pb(
    name: "resume"
    model { num_layers: 2 hidden_size: 32 num_heads: 2 vocab_size: 256 context_length: 32 }
    data { format: DATA_FORMAT_TEXT_BYTES train_path: ")pb", corpus, R"pb(" }
    optimizer { learning_rate: 0.01 }
    lr_schedule { warmup_steps: 10 }
    training { total_steps: 160 micro_batch_size: 4 seed: 11 }
    zero_stage: 3
    resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
    checkpoint { interval_steps: 20 keep_last: 2 }
  )pb"),
                               "resume");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<data::TensorData> Model(const v1::JobStatus& status) {
  auto file = data::ReadSafetensors(status.model_path());
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? file->tensors : std::vector<data::TensorData>();
}

TEST(ResumeE2eTest, KillingEveryProcessAfterACheckpointChangesNothing) {
  TempDir dir;
  const std::string corpus = dir.File("corpus.txt");
  testing::WriteFile(corpus, Corpus());

  // The uninterrupted run.
  v1::JobStatus straight;
  {
    Cluster cluster(dir.File("straight"));
    ASSERT_NO_FATAL_FAILURE(cluster.Start());
    auto job = cluster.client().SubmitJob(Spec(corpus));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(cluster.WaitFor(job->job_id(), v1::SUCCEEDED, absl::Seconds(120)))
        << cluster.Logs();
    straight = cluster.Status(job->job_id());
    EXPECT_EQ(straight.checkpoint_step(), 160);
    EXPECT_GT(straight.checkpoint_save_ms(), 0);
    cluster.KillEverything();
  }

  // The interrupted run: everything dies once a mid-run checkpoint is committed.
  Cluster cluster(dir.File("interrupted"));
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto job = cluster.client().SubmitJob(Spec(corpus));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(Eventually([&] { return cluster.Status(job->job_id()).checkpoint_step() >= 40; },
                         absl::Seconds(120)))
      << cluster.Logs();
  const v1::JobStatus before = cluster.Status(job->job_id());
  ASSERT_LT(before.step(), 160) << "the job ended before it could be interrupted";
  cluster.KillEverything();

  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  ASSERT_TRUE(cluster.WaitFor(job->job_id(), v1::SUCCEEDED, absl::Seconds(120)))
      << cluster.Logs();
  const v1::JobStatus resumed = cluster.Status(job->job_id());
  EXPECT_EQ(resumed.generation(), 2);
  EXPECT_EQ(resumed.restarts(), 0);
  EXPECT_THAT(cluster.Logs(), ::testing::HasSubstr("restored checkpoint"));

  const auto a = Model(straight);
  const auto b = Model(resumed);
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(a[i].data == b[i].data) << a[i].name << " differs after resume";
  }
  EXPECT_EQ(resumed.last_metrics().loss(), straight.last_metrics().loss());
}

}  // namespace
}  // namespace weft
