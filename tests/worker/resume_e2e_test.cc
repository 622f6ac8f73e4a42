// Exact resume with real processes: a job whose every process (coordinator, checkpointd, both
// workers) is SIGKILLed after a checkpoint, then started again, ends with the same model, bit
// for bit, as the same job run without interruption.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "client/checkpoint_client.h"
#include "worker/checkpointer.h"
#include "worker/data/safetensors.h"
#include "worker/engine/gpt.h"

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
    checkpointd_address_ = absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*port));
    const std::string& checkpointd = checkpointd_address_;
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
  const std::string& checkpointd_address() const { return checkpointd_address_; }
  std::string checkpoint_dir() const { return dir_ + "/ckpt"; }

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
  std::string checkpointd_address_;
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

// Every unit of `spec`'s model with all parameters = `value` (AdamW moments 0), as one rank.
std::vector<worker::UnitSlice> FilledState(const v1::JobSpec& spec, float value) {
  const engine::GptConfig config = engine::ConfigFromSpec(spec.model());
  std::vector<worker::UnitSlice> state;
  for (int u = 0; u < engine::NumUnits(config); ++u) {
    worker::UnitSlice slice;
    slice.unit = u;
    slice.size = static_cast<int64_t>(engine::UnitSize(config, u));
    slice.end = slice.size;
    slice.params.assign(slice.size, value);
    slice.m.assign(slice.size, 0.0f);
    slice.v.assign(slice.size, 0.0f);
    state.push_back(std::move(slice));
  }
  return state;
}

// Flips one byte inside the first run of `value` floats found in a blob file under `dir`.
bool FlipByteOf(const std::string& dir, float value) {
  std::string pattern;
  for (int i = 0; i < 16; ++i) pattern.append(reinterpret_cast<const char*>(&value), 4);
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.path().extension() != ".blob") continue;
    const std::string contents = testing::ReadFile(entry.path());
    const size_t at = contents.find(pattern);
    if (at == std::string::npos) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at + 6));
    const char c = static_cast<char>(contents[at + 6] ^ 0x40);
    f.write(&c, 1);
    return true;
  }
  return false;
}

TEST(ResumeE2eTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  TempDir dir;
  const std::string corpus = dir.File("corpus.txt");
  testing::WriteFile(corpus, Corpus());
  Cluster cluster(dir.File("cluster"));
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  // Large enough units (> 64 KiB) that checkpointd keeps their data in blob files.
  v1::JobSpec spec = Spec(corpus);
  spec.mutable_model()->set_hidden_size(64);
  spec.mutable_training()->set_total_steps(25);

  // A job to resume from, with checkpoints at steps 20 and 40 written by one rank.
  v1::JobSpec seed = spec;
  seed.mutable_resources()->set_min_workers(8);  // never runs
  auto seed_job = cluster.client().SubmitJob(seed);
  ASSERT_TRUE(seed_job.ok());
  ASSERT_TRUE(cluster.client().CancelJob(seed_job->job_id()).ok());
  CheckpointClient checkpoints(cluster.checkpointd_address());
  for (const auto& [step, value] : {std::pair{20, 0.0078125f}, std::pair{40, 0.01171875f}}) {
    const auto state = FilledState(spec, value);
    ASSERT_TRUE(checkpoints
                    .WriteShard(seed_job->job_id(), step, 0, 1, worker::ShardTensorsOf(state))
                    .ok());
    ASSERT_TRUE(checkpoints
                    .Commit(worker::CheckpointManifestFor(seed_job->job_id(), step, 1, spec,
                                                          state))
                    .ok());
  }
  // One flipped byte in the newest checkpoint's parameters.
  ASSERT_TRUE(FlipByteOf(cluster.checkpoint_dir(), 0.01171875f));

  // Two workers resume from the seed job: step 40 fails its checksum on some rank, so every
  // rank falls back to step 20 (read at world size 2 what one rank wrote) and trains on.
  v1::JobSpec resume = spec;
  resume.set_resume_from_job(seed_job->job_id());
  auto job = cluster.client().SubmitJob(resume);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(cluster.WaitFor(job->job_id(), v1::SUCCEEDED, absl::Seconds(120)))
      << cluster.Logs();
  const std::string logs = cluster.Logs();
  EXPECT_THAT(logs, ::testing::HasSubstr(
                        absl::StrCat(seed_job->job_id(), " step 40 cannot be restored")));
  EXPECT_THAT(logs, ::testing::HasSubstr(
                        absl::StrCat("restored checkpoint ", seed_job->job_id(), " step 20")));
  // The DATA_LOSS names the tensor and the checkpoint.
  EXPECT_THAT(logs, ::testing::HasSubstr(absl::StrCat(
                        "tensor u0.params of checkpoint ", seed_job->job_id(), " step 40")));
  EXPECT_EQ(cluster.Status(job->job_id()).step(), 25);
}

}  // namespace
}  // namespace weft
