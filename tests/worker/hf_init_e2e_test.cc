// A job that starts from a Hugging Face directory, end to end (real coordinator and workers on
// 127.0.0.1): a model trained by one job, exported for Hugging Face, starts a second job at the
// first one's loss rather than at a random model's; a directory whose config.json does not
// match the spec fails the job before training, naming the field.
#include <thread>

#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"
#include "worker/hf/hf_export.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using ::testing::HasSubstr;

class HfInitE2eTest : public testing::WorkersTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(testing::SentenceCorpus(2000)));
    for (int i = 0; i < 2; ++i) {
      ASSERT_NO_FATAL_FAILURE(StartWorker(absl::StrCat("cpu:", i),
                                          {"--collective-timeout-ms=20000",
                                           "--metrics-address=none"}));
    }
  }

  v1::JobSpec Spec(int64_t steps, const std::string& hf_dir) {
    auto spec = ParseJobSpecText(absl::StrCat(R"pb(
      name: "hf"
      model { num_layers: 2 hidden_size: 32 num_heads: 2 vocab_size: 256 context_length: 32 }
      data { format: DATA_FORMAT_TEXT_BYTES train_path: ")pb", corpus_, R"pb(" }
      optimizer { learning_rate: 0.01 }
      lr_schedule { warmup_steps: )pb", steps > 5 ? 5 : 0, R"pb( }
      training { micro_batch_size: 4 seed: 3 total_steps: )pb", steps, R"pb( }
      zero_stage: 3
      resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
      fault { heartbeat_interval_ms: 200 heartbeat_timeout_ms: 1500 max_restarts: 2 }
      init_from_hf_dir: ")pb", hf_dir, R"pb(")pb"),
                                 "hf");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  v1::JobStatus Run(const v1::JobSpec& spec) {
    auto submitted = client_->SubmitJob(spec);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return {};
    return WaitForEnd(submitted->job_id(), absl::Seconds(120));
  }
};

TEST_F(HfInitE2eTest, JobStartsFromTheExportedWeightsAndAMismatchFailsBeforeTraining) {
  // A trains from scratch; its model goes out as a Hugging Face directory (bf16, sharded).
  const v1::JobStatus a = Run(Spec(60, ""));
  ASSERT_EQ(a.state(), v1::SUCCEEDED) << Logs();
  const float trained_loss = a.last_metrics().loss();
  ASSERT_LT(trained_loss, 3.0f);
  auto model = model_io::LoadModel(a.model_path());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string hf_dir = dir_.File("hf");
  hf::HfExportOptions options;
  options.dtype = model_io::Dtype::kBF16;
  options.max_shard_bytes = 20000;
  ASSERT_TRUE(hf::ExportHf(hf_dir, model->spec.model(), model->units, options).ok());

  // B's first step is at A's loss; C, the same spec without the import, at a random model's.
  const v1::JobStatus b = Run(Spec(1, hf_dir));
  ASSERT_EQ(b.state(), v1::SUCCEEDED) << Logs();
  const v1::JobStatus c = Run(Spec(1, ""));
  ASSERT_EQ(c.state(), v1::SUCCEEDED) << Logs();
  EXPECT_LT(b.last_metrics().loss(), trained_loss + 0.5f);
  EXPECT_GT(c.last_metrics().loss(), 5.0f) << "ln 256 = 5.55 for a random model";

  // A spec the directory does not describe: failed at once, permanently, naming the field.
  v1::JobSpec wrong = Spec(10, hf_dir);
  wrong.mutable_model()->set_num_layers(3);
  const v1::JobStatus d = Run(wrong);
  EXPECT_EQ(d.state(), v1::FAILED) << Logs();
  EXPECT_THAT(d.error(), HasSubstr("init_from_hf_dir"));
  EXPECT_THAT(d.error(), HasSubstr("model.num_layers is 3 but config.json n_layer is 2"));
  EXPECT_THAT(d.error(), HasSubstr("permanent"));
  EXPECT_EQ(d.restarts(), 0);
  EXPECT_EQ(d.step(), 0);
}

}  // namespace
}  // namespace weft
