// Exact resume with real processes: a job whose every process (coordinator, checkpointd, the
// workers) is SIGKILLed after a checkpoint, then started again, ends with the same model, bit
// for bit, as the same job run without interruption (full and hybrid sharding).
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
#include "tests/worker/cluster.h"
#include "client/checkpoint_client.h"
#include "worker/checkpointer.h"
#include "worker/model_io/safetensors.h"
#include "worker/engine/gpt2/gpt2_arch.h"

namespace weft {
namespace {

using testing::Cluster;
using testing::Eventually;
using testing::TempDir;

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

// Full sharding on 2 workers; hybrid sharding on 4 (2 replicas of groups of 2), where only the
// first group writes the checkpoints and every rank restores them.
class KillAndResumeE2eTest : public ::testing::TestWithParam<bool> {};

TEST_P(KillAndResumeE2eTest, KillingEveryProcessAfterACheckpointChangesNothing) {
  const bool hybrid = GetParam();
  const int workers = hybrid ? 4 : 2;
  TempDir dir;
  const std::string corpus = dir.File("corpus.txt");
  testing::WriteFile(corpus, testing::WordCorpus());
  v1::JobSpec spec = Spec(corpus);
  if (hybrid) {
    spec.mutable_resources()->set_min_workers(4);
    spec.mutable_resources()->set_max_workers(4);
    spec.mutable_sharding()->set_scope(v1::ShardingSpec::GROUP);
    spec.mutable_sharding()->set_group_size(2);
  }

  // The uninterrupted run.
  const v1::JobStatus straight = testing::RunUninterrupted(dir.File("straight"), workers, spec);
  ASSERT_EQ(straight.state(), v1::SUCCEEDED);
  EXPECT_EQ(straight.checkpoint_step(), 160);
  EXPECT_GT(straight.checkpoint_save_ms(), 0);

  // The interrupted run: everything dies once a mid-run checkpoint is committed.
  Cluster cluster(dir.File("interrupted"), workers);
  ASSERT_NO_FATAL_FAILURE(cluster.Start());
  auto job = cluster.client().SubmitJob(spec);
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
  if (hybrid) EXPECT_THAT(cluster.Logs(), ::testing::HasSubstr("2 replicas of 2 ranks"));

  testing::ExpectSameModel(straight, resumed);
  EXPECT_EQ(resumed.last_metrics().loss(), straight.last_metrics().loss());
}

INSTANTIATE_TEST_SUITE_P(Sharding, KillAndResumeE2eTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "hybrid" : "full"; });

// Every unit of `spec`'s model with all parameters = `value` (AdamW moments 0), as one rank.
std::vector<model_io::UnitSlice> FilledState(const v1::JobSpec& spec, float value) {
  const engine::GptConfig config = engine::ConfigFromSpec(spec.model());
  std::vector<model_io::UnitSlice> state;
  for (int u = 0; u < engine::NumUnits(config); ++u) {
    model_io::UnitSlice slice;
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
  testing::WriteFile(corpus, testing::WordCorpus());
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
                    .Commit(worker::CheckpointManifestFor(seed_job->job_id(), step, step, 1, spec,
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
