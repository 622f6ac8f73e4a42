// Supervised fine-tuning end to end, as examples/sft/sft.sh runs it against a real coordinator
// and two CPU workers on 127.0.0.1: chat data prepared with a loss mask, a job initialised from a
// Hugging Face directory that trains on packed, document-masked conversations, the export back
// to Hugging Face. Then the numbers: the training loss falls from a random model's; the export
// holds exactly the trained weights; the validation rows are rebuilt here as the workers read
// them (and `trainctl data batches` prints the same); and, with WEFT_TRANSFORMERS_PYTHON (a
// python with torch and transformers; CI has none), transformers' masked loss on those rows
// equals Weft's final validation loss, and on the first training step's rows with the initial
// model equals Weft's first training loss.
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"
#include "worker/data/token_dataset.h"
#include "worker/hf/hf_checkpoint.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using weft::testing::CommandResult;
using weft::testing::ReadFile;
using weft::testing::RunCommand;
using weft::testing::WriteFile;

const std::string kSource = WEFT_SOURCE_DIR;
constexpr int kWorld = 2;
constexpr int kSteps = 40;

// The rows of every rank for `micro_steps` micro-batches of `step`, as GenerationRun feeds the
// engine (StepLoop for training, MaybeValidate for validation: step 0, micro i), in the order
// micro-batch, rank, row; as the JSON tests/fixtures/hf/masked_loss.py reads. The mean over all
// their counted targets is the loss Weft reports for them.
nlohmann::json RanksRows(const v1::JobSpec& spec, data::Split split, int64_t step,
                         int micro_steps) {
  const v1::TrainingSpec& training = spec.training();
  const data::TokenDataset::Options options{spec.model().vocab_size(), training.sequence_length(),
                                            training.grad_accum_steps()};
  auto dataset = data::TokenDataset::Open(spec.data(), options, split);
  EXPECT_TRUE(dataset.ok()) << dataset.status();
  if (!dataset.ok()) return {};
  const int t = training.sequence_length();
  const int b = training.micro_batch_size();
  nlohmann::json inputs = nlohmann::json::array(), targets = nlohmann::json::array(),
                 doc_starts = nlohmann::json::array();
  for (int micro = 0; micro < micro_steps; ++micro) {
    for (int rank = 0; rank < kWorld; ++rank) {
      std::vector<int32_t> in(b * t), tg(b * t), ds(b * t);
      (*dataset)->Batch(training.seed(), step, micro, rank, kWorld, b, in.data(), tg.data(),
                        ds.data());
      for (int row = 0; row < b; ++row) {
        const auto cut = [&](const std::vector<int32_t>& v) {
          return std::vector<int32_t>(v.begin() + row * t, v.begin() + (row + 1) * t);
        };
        inputs.push_back(cut(in));
        targets.push_back(cut(tg));
        doc_starts.push_back(cut(ds));
      }
    }
  }
  return {{"inputs", inputs},
          {"targets", targets},
          {"doc_starts", doc_starts},
          {"reset_positions", spec.data().reset_positions()}};
}

// Runs masked_loss.py on `model_dir` and `batch_json`; the loss it prints (NaN on failure).
double TransformersLoss(const std::string& python, const std::string& model_dir,
                        const std::string& batch_json, std::string* output) {
  CommandResult r =
      RunCommand({python, kSource + "/tests/fixtures/hf/masked_loss.py", model_dir, batch_json}, {},
                 absl::Seconds(240));
  *output = absl::StrCat("exit ", r.exit_code, ": ", r.out, r.err);
  const size_t at = r.out.find("masked_loss=");
  double loss = std::nan("");
  if (r.exit_code != 0 || at == std::string::npos) return loss;
  const std::string rest = r.out.substr(at + 12);
  if (!absl::SimpleAtod(rest.substr(0, rest.find(' ')), &loss)) return std::nan("");
  return loss;
}

class SftE2eTest : public testing::WorkersTest {
 protected:
  void SetUp() override {
    // No corpus: the example prepares its own data.
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(""));
    for (int i = 0; i < kWorld; ++i) {
      ASSERT_NO_FATAL_FAILURE(StartWorker(
          absl::StrCat("cpu:", i),
          {"--checkpointd=none", "--metrics-address=none", "--collective-timeout-ms=20000"}));
    }
  }

  v1::Job GetJob(const std::string& id) {
    auto job = client_->GetJob(id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job();
  }
};

TEST_F(SftE2eTest, FineTunesFromHuggingFaceAndTransformersAgreesOnTheHeldOutLoss) {
  const char* python_env = std::getenv("WEFT_TRANSFORMERS_PYTHON");
  const std::string python = python_env == nullptr ? "" : python_env;
  const std::string work = dir_.File("sft");

  // The example as a user runs it, on this test's services. The script's own transformers
  // check is left to the end of this test, which makes it on rows it rebuilt itself.
  const CommandResult run = RunCommand({"/bin/bash", kSource + "/examples/sft/sft.sh"},
                                       {{"WEFT_BIN", testing::BinDir()},
                                        {"SFT_WORK", work},
                                        {"SFT_STEPS", absl::StrCat(kSteps)},
                                        {"SFT_COORDINATOR", coordinator_->address()},
                                        {"WEFT_TRANSFORMERS_PYTHON", ""}},
                                       absl::Seconds(180));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err << Logs();
  EXPECT_THAT(run.out, HasSubstr("SFT job="));
  const std::string id(absl::StripAsciiWhitespace(ReadFile(work + "/job-id")));
  const v1::Job job = GetJob(id);
  const v1::JobStatus& status = job.status();
  ASSERT_EQ(status.state(), v1::SUCCEEDED) << status.error() << Logs();
  EXPECT_EQ(status.step(), kSteps);
  EXPECT_EQ(status.restarts(), 0);
  const v1::JobSpec& spec = job.spec();  // normalized: what the workers were given
  ASSERT_EQ(spec.resources().min_workers(), kWorld);
  ASSERT_EQ(spec.resources().max_workers(), kWorld);
  EXPECT_EQ(spec.data().sampling(), v1::DataSpec::PACKED);
  EXPECT_TRUE(spec.data().document_masking());
  EXPECT_TRUE(spec.data().reset_positions());
  EXPECT_EQ(spec.init_from_hf_dir(), work + "/model");

  // The training loss: a random model's at first (ln 576 = 6.36 over the answers' tokens), then
  // falling as it learns the answers' pattern. The first status `watch` saw is usually step 1's.
  double first_loss = 0;
  int64_t first_step = 0;
  std::istringstream watched(ReadFile(work + "/watch.jsonl"));
  for (std::string line; std::getline(watched, line) && first_step == 0;) {
    const nlohmann::json s = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(s.is_discarded()) << line;
    if (!s.contains("last_metrics")) continue;
    ASSERT_TRUE(absl::SimpleAtoi(s["last_metrics"].value("step", "0"), &first_step)) << line;
    first_loss = s["last_metrics"].value("loss", 0.0);
  }
  const double final_loss = status.last_metrics().loss();
  const double val_loss = status.last_metrics().val_loss();
  ASSERT_GT(first_step, 0) << "no step in watch.jsonl";
  if (first_step <= 3) {
    EXPECT_GT(first_loss, 5.0) << "step " << first_step;
  }
  EXPECT_LT(final_loss, 0.5 * first_loss);
  EXPECT_GT(val_loss, 0.0);
  EXPECT_LT(val_loss, 0.5 * first_loss);

  // The export: Weft's importer takes it for the job's model (config.json describes it, every
  // tensor is there with its shape), and it holds the trained weights bit for bit (fp32).
  auto trained = model_io::LoadModel(status.model_path());
  ASSERT_TRUE(trained.ok()) << trained.status();
  auto exported = hf::HfImporter::Open(work + "/hf", spec.model());
  ASSERT_TRUE(exported.ok()) << exported.status();
  ASSERT_EQ(static_cast<size_t>(exported->get()->arch().NumUnits()), trained->units.size());
  for (size_t u = 0; u < trained->units.size(); ++u) {
    std::vector<float> read(trained->units[u].size());
    ASSERT_TRUE(exported->get()->ReadParams(u, 0, read.size(), read.data()).ok());
    EXPECT_TRUE(read == trained->units[u]) << "unit " << u << " of " << work << "/hf";
  }
  EXPECT_EQ(ReadFile(work + "/hf/tokenizer.json"), ReadFile(work + "/model/tokenizer.json"));

  // The validation rows, rebuilt as every rank read them; `trainctl data batches` (what the
  // script compares with) printed the same.
  const nlohmann::json val = RanksRows(spec, data::Split::kVal, 0, spec.training().val_batches());
  ASSERT_FALSE(val.is_null());
  EXPECT_EQ(val, nlohmann::json::parse(ReadFile(work + "/val-batch.json"), nullptr, false));
  // They are packed conversations, with targets ignored (prompts, boundaries, padding).
  int counted = 0, ignored = 0, packed_rows = 0;
  for (size_t r = 0; r < val["inputs"].size(); ++r) {
    for (const auto& target : val["targets"][r]) (target.get<int>() >= 0 ? counted : ignored)++;
    for (const auto& start : val["doc_starts"][r]) {
      if (start.get<int>() > 0) {
        ++packed_rows;
        break;
      }
    }
  }
  EXPECT_EQ(val["inputs"].size(),
            spec.training().val_batches() * kWorld * spec.training().micro_batch_size());
  EXPECT_GT(counted, 100);
  EXPECT_GT(ignored, counted);
  EXPECT_GT(packed_rows, 0);
  const std::string val_json = dir_.File("val-batch.json");
  WriteFile(val_json, val.dump());

  if (python.empty()) {
    GTEST_SKIP() << "WEFT_TRANSFORMERS_PYTHON is not set (a python with torch and "
                    "transformers): the fine-tuning ran and was checked, but not against "
                    "transformers' masked loss";
  }

  // The first training step, on its own: a job of one step from the same model and data. Its
  // loss is the initial model's on step 0's rows.
  v1::JobSpec one = spec;
  one.set_name("sft-first-step");
  one.mutable_training()->set_total_steps(1);
  one.mutable_lr_schedule()->set_warmup_steps(0);
  auto submitted = client_->SubmitJob(one);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::JobStatus first = WaitForEnd(submitted->job_id(), absl::Seconds(60));
  ASSERT_EQ(first.state(), v1::SUCCEEDED) << first.error() << Logs();
  const std::string train_json = dir_.File("train-step0.json");
  WriteFile(train_json,
            RanksRows(spec, data::Split::kTrain, 0, spec.training().grad_accum_steps()).dump());

  // Two transformers runs at once: most of each is importing torch.
  std::string val_output, train_output;
  double hf_val = 0, hf_train = 0;
  std::thread val_thread(
      [&] { hf_val = TransformersLoss(python, work + "/hf", val_json, &val_output); });
  hf_train = TransformersLoss(python, work + "/model", train_json, &train_output);
  val_thread.join();
  const double weft_train = first.last_metrics().loss();
  std::cout << absl::StrFormat(
      "SFT weft_val_loss=%.17g transformers_val_loss=%.17g weft_first_train_loss=%.17g "
      "transformers_first_train_loss=%.17g\n",
      val_loss, hf_val, weft_train, hf_train);
  ASSERT_FALSE(std::isnan(hf_val)) << val_output;
  ASSERT_FALSE(std::isnan(hf_train)) << train_output;
  EXPECT_LE(std::abs(hf_val - val_loss), 1e-4 * std::abs(val_loss)) << val_output;
  EXPECT_LE(std::abs(hf_train - weft_train), 1e-4 * std::abs(weft_train)) << train_output;
}

// The committed conversations are what their generator writes (standard library only, so CI
// has what it needs).
TEST(SftExampleTest, ConversationsAreWhatTheGeneratorWrites) {
  const CommandResult made =
      RunCommand({"/usr/bin/env", "python3", kSource + "/examples/sft/make_conversations.py"});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_TRUE(made.out == ReadFile(kSource + "/examples/sft/conversations.jsonl"))
      << "run examples/sft/make_conversations.py > examples/sft/conversations.jsonl";
}

}  // namespace
}  // namespace weft
