// Unit tests for common/job_spec: text parsing, defaults, validation, parameter count.
#include "common/job_spec.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using v1::JobSpec;

// Every field set explicitly except those whose defaults are under test.
constexpr char kFullSpec[] = R"pb(
name: "gpt2-124m.run_1"
model {
  num_layers: 12
  hidden_size: 768
  num_heads: 12
  vocab_size: 50257
  context_length: 1024
}
data {
  train_path: "/data/fineweb_train.bin"
  val_path: "/data/fineweb_val.bin"
  format: DATA_FORMAT_UINT16_BIN
}
optimizer { learning_rate: 6e-4 }
lr_schedule { kind: COSINE warmup_steps: 100 }
training {
  total_steps: 1000
  micro_batch_size: 8
  val_interval_steps: 50
  seed: 1337
}
zero_stage: 3
resources { device_kind: DEVICE_KIND_CUDA min_workers: 8 }
checkpoint { interval_steps: 200 }
)pb";

JobSpec ParseOrDie(std::string_view text) {
  auto spec = ParseJobSpecText(text, "job.pb.txt");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : JobSpec();
}

// The message of the error ParseJobSpecText must refuse `text` with: INVALID_ARGUMENT, the
// position prefixed with `filename`.
std::string ParseError(std::string_view text, std::string_view filename) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecText(text, filename);
  EXPECT_FALSE(spec.ok()) << text;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  return std::string(spec.status().message());
}

// A small valid CPU spec with every default already applied.
JobSpec ValidCpuSpec() {
  JobSpec spec;
  spec.set_name("tiny");
  auto* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(64);
  m->set_num_heads(4);
  m->set_vocab_size(256);
  m->set_context_length(128);
  spec.mutable_data()->set_train_path("/data/shakespeare.txt");
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_TEXT_BYTES);
  spec.mutable_optimizer()->set_learning_rate(1e-3);
  spec.mutable_training()->set_total_steps(100);
  spec.mutable_training()->set_micro_batch_size(4);
  spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
  spec.mutable_resources()->set_min_workers(2);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

TEST(ParseJobSpecTextTest, FullSpecParsesAndNormalizesWithDocumentedDefaults) {
  absl::StatusOr<JobSpec> spec = NormalizeJobSpec(ParseOrDie(kFullSpec));
  ASSERT_TRUE(spec.ok()) << spec.status();

  EXPECT_EQ(spec->name(), "gpt2-124m.run_1");
  EXPECT_EQ(spec->model().num_layers(), 12);
  EXPECT_EQ(spec->model().padded_vocab_size(), 50304);  // 50257 rounded up to 128
  EXPECT_EQ(spec->data().format(), weft::v1::DATA_FORMAT_UINT16_BIN);
  EXPECT_EQ(spec->data().val_fraction(), 0.0);  // val_path given: nothing held out

  const auto& o = spec->optimizer();
  EXPECT_DOUBLE_EQ(o.learning_rate(), 6e-4);
  ASSERT_TRUE(o.has_beta1());
  EXPECT_DOUBLE_EQ(o.beta1(), 0.9);
  EXPECT_DOUBLE_EQ(o.beta2(), 0.95);
  EXPECT_DOUBLE_EQ(o.epsilon(), 1e-8);
  EXPECT_DOUBLE_EQ(o.weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(o.grad_clip_norm(), 1.0);

  EXPECT_EQ(spec->lr_schedule().kind(), weft::v1::LrSchedule::COSINE);
  EXPECT_EQ(spec->lr_schedule().warmup_steps(), 100);
  EXPECT_DOUBLE_EQ(spec->lr_schedule().min_lr_ratio(), 0.1);

  const auto& t = spec->training();
  EXPECT_EQ(t.sequence_length(), 1024);  // = context_length
  EXPECT_EQ(t.grad_accum_steps(), 1);
  EXPECT_EQ(t.val_batches(), 8);  // validation enabled
  EXPECT_EQ(t.activation_checkpointing(), weft::v1::ActivationCheckpointing::AUTO);
  EXPECT_EQ(t.seed(), 1337u);

  EXPECT_EQ(spec->precision(), weft::v1::BF16);  // CUDA default
  EXPECT_EQ(spec->zero_stage(), 3);
  EXPECT_EQ(spec->resources().min_workers(), 8);
  EXPECT_EQ(spec->resources().max_workers(), 8);  // = min_workers
  EXPECT_EQ(spec->checkpoint().interval_steps(), 200);
  EXPECT_EQ(spec->checkpoint().keep_last(), 3);

  const auto& f = spec->fault();
  EXPECT_EQ(f.heartbeat_interval_ms(), 500);
  EXPECT_EQ(f.heartbeat_timeout_ms(), 3000);
  ASSERT_TRUE(f.has_max_restarts());
  EXPECT_EQ(f.max_restarts(), 3);
  ASSERT_TRUE(f.has_max_skipped_steps());
  EXPECT_EQ(f.max_skipped_steps(), 3);
  EXPECT_EQ(f.stall_timeout_ms(), 300000);
}

TEST(ApplyJobSpecDefaultsTest, CpuDefaultsToFp32AndHoldsOutValidationFraction) {
  JobSpec spec = ValidCpuSpec();
  EXPECT_EQ(spec.precision(), weft::v1::FP32);
  EXPECT_DOUBLE_EQ(spec.data().val_fraction(), 0.1);  // no val_path
  EXPECT_EQ(spec.model().padded_vocab_size(), 256);   // already a multiple of 128
  EXPECT_EQ(spec.training().val_batches(), 0);        // validation disabled: no default
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
}

TEST(ApplyJobSpecDefaultsTest, PaddedVocabRoundsUpToMultipleOf128) {
  for (auto [vocab, padded] : std::vector<std::pair<int, int>>{
           {2, 128}, {128, 128}, {129, 256}, {256, 256}, {257, 384}, {50257, 50304}}) {
    JobSpec spec;
    spec.mutable_model()->set_vocab_size(vocab);
    ApplyJobSpecDefaults(&spec);
    EXPECT_EQ(spec.model().padded_vocab_size(), padded) << "vocab " << vocab;
  }
}

TEST(ApplyJobSpecDefaultsTest, ExplicitValuesAreKeptIncludingExplicitZeros) {
  JobSpec spec = ParseOrDie(R"pb(
    model { vocab_size: 50257 padded_vocab_size: 50432 context_length: 256 }
    optimizer { beta1: 0 beta2: 0.99 weight_decay: 0 grad_clip_norm: 0 }
    lr_schedule { kind: CONSTANT min_lr_ratio: 0 }
    training { sequence_length: 64 grad_accum_steps: 4 val_interval_steps: 10 val_batches: 2 }
    precision: FP32
    resources { device_kind: DEVICE_KIND_CUDA min_workers: 2 max_workers: 6 }
    checkpoint { keep_last: 7 }
    fault { heartbeat_interval_ms: 100 heartbeat_timeout_ms: 1000 max_restarts: 0
            stall_timeout_ms: 60000 }
  )pb");
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.model().padded_vocab_size(), 50432);
  EXPECT_EQ(spec.optimizer().beta1(), 0.0);
  EXPECT_DOUBLE_EQ(spec.optimizer().beta2(), 0.99);
  EXPECT_EQ(spec.optimizer().weight_decay(), 0.0);
  EXPECT_EQ(spec.optimizer().grad_clip_norm(), 0.0);
  EXPECT_EQ(spec.lr_schedule().kind(), weft::v1::LrSchedule::CONSTANT);
  EXPECT_EQ(spec.lr_schedule().min_lr_ratio(), 0.0);
  EXPECT_EQ(spec.training().sequence_length(), 64);
  EXPECT_EQ(spec.training().grad_accum_steps(), 4);
  EXPECT_EQ(spec.training().val_batches(), 2);
  EXPECT_EQ(spec.precision(), weft::v1::FP32);  // explicit FP32 on CUDA stays
  EXPECT_EQ(spec.resources().max_workers(), 6);
  EXPECT_EQ(spec.checkpoint().keep_last(), 7);
  EXPECT_EQ(spec.fault().heartbeat_interval_ms(), 100);
  EXPECT_EQ(spec.fault().heartbeat_timeout_ms(), 1000);
  EXPECT_EQ(spec.fault().stall_timeout_ms(), 60000);
  ASSERT_TRUE(spec.fault().has_max_restarts());
  EXPECT_EQ(spec.fault().max_restarts(), 0);
}

TEST(NormalizeJobSpecTest, ExplicitZeroMaxRestartsStaysZero) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_fault()->clear_max_restarts();
  spec.mutable_fault()->set_max_restarts(0);
  absl::StatusOr<JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->fault().max_restarts(), 0);

  spec.mutable_fault()->clear_max_restarts();
  normalized = NormalizeJobSpec(spec);
  ASSERT_TRUE(normalized.ok()) << normalized.status();
  EXPECT_EQ(normalized->fault().max_restarts(), 3);
}

TEST(ApplyJobSpecDefaultsTest, IsIdempotent) {
  JobSpec once = ParseOrDie(kFullSpec);
  ApplyJobSpecDefaults(&once);
  JobSpec twice = once;
  ApplyJobSpecDefaults(&twice);
  EXPECT_EQ(once.SerializeAsString(), twice.SerializeAsString());
}

TEST(ParseJobSpecTextTest, SyntaxErrorReportsOneBasedLineAndColumn) {
  // Line 3 lacks the ':' between field and value; "12" starts at column 14.
  constexpr char kText[] =
      "name: \"x\"\n"
      "model {\n"
      "  num_layers 12\n"
      "}\n";
  EXPECT_THAT(ParseError(kText, "job.pb.txt"), StartsWith("job.pb.txt:3:14: "));
}

TEST(ParseJobSpecTextTest, ErrorOnFirstLineFirstColumnIsOneOne) {
  EXPECT_THAT(ParseError("}", "a.pb.txt"), StartsWith("a.pb.txt:1:1: "));
}

TEST(ParseJobSpecTextTest, UnterminatedMessageReportsEndPosition) {
  EXPECT_THAT(ParseError("model {\n  num_layers: 2\n", "f.txt"), StartsWith("f.txt:3:"));
}

TEST(ParseJobSpecTextTest, UnknownFieldIsNamedWithItsPosition) {
  constexpr char kText[] =
      "name: \"x\"\n"
      "model {\n"
      "  num_layers: 2\n"
      "  layers: 3\n"
      "}\n";
  const std::string message = ParseError(kText, "job.pb.txt");
  // protobuf reports the position of the token after the unknown name (the ':' at 4:9), so
  // only the line is pinned here.
  EXPECT_THAT(message, StartsWith("job.pb.txt:4:"));
  EXPECT_THAT(message, HasSubstr("weft.v1.ModelSpec"));
  EXPECT_THAT(message, HasSubstr("\"layers\""));
}

TEST(ParseJobSpecTextTest, WrongEnumValueIsNamed) {
  const std::string message =
      ParseError("name: \"x\"\nprecision: FP64 zero_stage: 1\n", "job.pb.txt");
  EXPECT_THAT(message, StartsWith("job.pb.txt:2:"));
  EXPECT_THAT(message, HasSubstr("FP64"));
  EXPECT_THAT(message, HasSubstr("precision"));
}

TEST(ParseJobSpecTextTest, WrongTypeIsAnError) {
  EXPECT_THAT(ParseError("training { total_steps: \"many\" }", "job.pb.txt"),
              StartsWith("job.pb.txt:1:"));
}

TEST(ParseJobSpecTextTest, EmptyTextIsAnEmptySpec) {
  absl::StatusOr<JobSpec> spec = ParseJobSpecText("", "job.pb.txt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->ByteSizeLong(), 0u);
}

TEST(ReadJobSpecFileTest, MissingFileNamesThePath) {
  weft::testing::TempDir dir;
  const std::string path = dir.File("does-not-exist.pb.txt");
  absl::StatusOr<JobSpec> spec = ReadJobSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(path));
}

TEST(ReadJobSpecFileTest, ReadsAFileAndLabelsErrorsWithItsPath) {
  weft::testing::TempDir dir;
  const std::string good = dir.File("good.pb.txt");
  std::ofstream(good) << kFullSpec;
  absl::StatusOr<JobSpec> spec = ReadJobSpecFile(good);
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "gpt2-124m.run_1");
  EXPECT_EQ(spec->resources().min_workers(), 8);

  const std::string bad = dir.File("bad.pb.txt");
  std::ofstream(bad) << "name: \"x\"\nbogus: 1\n";
  spec = ReadJobSpecFile(bad);
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), StartsWith(bad + ":2:"));
}

// A directory can be opened but not read: it must not come back as an empty, "valid" parse.
TEST(ReadJobSpecFileTest, DirectoryIsAnErrorNamingThePath) {
  weft::testing::TempDir dir;
  absl::StatusOr<JobSpec> spec = ReadJobSpecFile(dir.path());
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(dir.path()));
}

struct ViolationCase {
  std::string label;
  std::function<void(JobSpec*)> mutate;
  // The field path the violation must start with, and a piece of its message.
  std::string field;
  std::string problem;
  // A zero that ApplyJobSpecDefaults replaces (so NormalizeJobSpec accepts the spec).
  bool fixed_by_defaults = false;
};

class ValidateJobSpecViolationTest : public ::testing::TestWithParam<ViolationCase> {};

// `c` applied to the valid `spec` gives exactly one violation, of c.field; returns it.
std::vector<std::string> ExpectOnlyViolation(JobSpec spec, const ViolationCase& c) {
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  c.mutate(&spec);
  const std::vector<std::string> violations = ValidateJobSpec(spec);
  EXPECT_THAT(violations, ::testing::SizeIs(1)) << ::testing::PrintToString(violations);
  if (violations.size() != 1) return violations;
  EXPECT_THAT(violations[0], StartsWith(c.field + ": "));
  EXPECT_THAT(violations[0], HasSubstr(c.problem));
  return violations;
}

TEST_P(ValidateJobSpecViolationTest, NamesTheFieldOfTheOnlyViolation) {
  const ViolationCase& c = GetParam();
  JobSpec spec = ValidCpuSpec();
  const std::vector<std::string> violations = ExpectOnlyViolation(spec, c);
  ASSERT_THAT(violations, ::testing::SizeIs(1));
  c.mutate(&spec);

  absl::StatusOr<JobSpec> normalized = NormalizeJobSpec(spec);
  if (c.fixed_by_defaults) {
    EXPECT_TRUE(normalized.ok()) << normalized.status();
    return;
  }
  // NormalizeJobSpec reports the same violation (defaults never hide a set value).
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(normalized.status().message()), HasSubstr(violations[0]));
}

const ViolationCase kViolationCases[] = {
    {"EmptyName", [](JobSpec* s) { s->set_name(""); }, "name", "required"},
    {"NameWithSpace", [](JobSpec* s) { s->set_name("my job"); }, "name", "\"my job\" must be 1-64"},
    {"NameWithSlash", [](JobSpec* s) { s->set_name("a/b"); }, "name", "must be 1-64"},
    {"NameTooLong", [](JobSpec* s) { s->set_name(std::string(65, 'a')); }, "name", "must be 1-64"},
    {"ZeroLayers", [](JobSpec* s) { s->mutable_model()->set_num_layers(0); }, "model.num_layers",
     "must be >= 1, got 0"},
    {"TooManyLayers", [](JobSpec* s) { s->mutable_model()->set_num_layers(1025); },
     "model.num_layers", "must be <= 1024, got 1025"},
    {"ZeroHidden", [](JobSpec* s) { s->mutable_model()->set_hidden_size(0); }, "model.hidden_size",
     "must be >= 1, got 0"},
    // Found by the job spec fuzzer: the parameter count of such a width overflowed int64.
    {"HiddenTooLarge", [](JobSpec* s) { s->mutable_model()->set_hidden_size(1000000000); },
     "model.hidden_size", "must be <= 65536, got 1000000000"},
    {"ContextTooLong", [](JobSpec* s) { s->mutable_model()->set_context_length(1 << 21); },
     "model.context_length", "must be <= 1048576, got 2097152"},
    {"PaddedVocabTooLarge", [](JobSpec* s) { s->mutable_model()->set_padded_vocab_size(1 << 26); },
     "model.padded_vocab_size", "must be <= 33554432"},
    {"ZeroHeads", [](JobSpec* s) { s->mutable_model()->set_num_heads(0); }, "model.num_heads",
     "must be >= 1, got 0"},
    {"HiddenNotDivisibleByHeads", [](JobSpec* s) { s->mutable_model()->set_hidden_size(66); },
     "model.hidden_size", "divisible by model.num_heads (66 % 4 = 2)"},
    {"VocabTooSmall",
     [](JobSpec* s) {
       s->mutable_data()->set_format(weft::v1::DATA_FORMAT_UINT16_BIN);
       s->mutable_model()->set_vocab_size(1);
     },
     "model.vocab_size", "must be in [2, 16777216], got 1"},
    {"PaddedVocabBelowVocab", [](JobSpec* s) { s->mutable_model()->set_padded_vocab_size(255); },
     "model.padded_vocab_size", "must be >= model.vocab_size (256), got 255"},
    {"ZeroContext", [](JobSpec* s) { s->mutable_model()->set_context_length(0); },
     "model.context_length", "must be >= 1, got 0"},
    {"NoTrainPath", [](JobSpec* s) { s->mutable_data()->clear_train_path(); }, "data.train_path",
     "required"},
    {"NoFormat",
     [](JobSpec* s) { s->mutable_data()->set_format(weft::v1::DATA_FORMAT_UNSPECIFIED); },
     "data.format", "required"},
    {"TextBytesNeedsByteVocab",
     [](JobSpec* s) {
       s->mutable_model()->set_vocab_size(100);
       s->mutable_model()->set_padded_vocab_size(128);
     },
     "model.vocab_size", "must be >= 256 for DATA_FORMAT_TEXT_BYTES, got 100"},
    {"Uint16VocabTooLarge",
     [](JobSpec* s) {
       s->mutable_data()->set_format(weft::v1::DATA_FORMAT_UINT16_BIN);
       s->mutable_model()->set_vocab_size(65537);
       s->mutable_model()->set_padded_vocab_size(65664);
     },
     "model.vocab_size", "must be <= 65536 for DATA_FORMAT_UINT16_BIN, got 65537"},
    {"ValFractionTooLarge", [](JobSpec* s) { s->mutable_data()->set_val_fraction(0.6); },
     "data.val_fraction", "must be in [0, 0.5], got 0.6"},
    {"ValFractionNaN",
     [](JobSpec* s) {
       s->mutable_data()->set_val_fraction(std::numeric_limits<double>::quiet_NaN());
     },
     "data.val_fraction", "must be in [0, 0.5]"},
    {"DocumentMaskingWithoutManifest",
     [](JobSpec* s) { s->mutable_data()->set_document_masking(true); }, "data.document_masking",
     "needs documents"},
    {"PackedWithoutManifest",
     [](JobSpec* s) { s->mutable_data()->set_sampling(weft::v1::DataSpec::PACKED); },
     "data.sampling", "set data.manifest_path"},
    {"ResetPositionsWithoutDocumentMasking",
     [](JobSpec* s) { s->mutable_data()->set_reset_positions(true); }, "data.reset_positions",
     "only makes sense with data.document_masking"},
    {"ZeroLearningRate", [](JobSpec* s) { s->mutable_optimizer()->set_learning_rate(0); },
     "optimizer.learning_rate", "must be > 0, got 0"},
    {"InfiniteLearningRate",
     [](JobSpec* s) {
       s->mutable_optimizer()->set_learning_rate(std::numeric_limits<double>::infinity());
     },
     "optimizer.learning_rate", "must be > 0"},
    {"Beta1One", [](JobSpec* s) { s->mutable_optimizer()->set_beta1(1.0); }, "optimizer.beta1",
     "must be in [0, 1), got 1"},
    {"Beta2Negative", [](JobSpec* s) { s->mutable_optimizer()->set_beta2(-0.1); },
     "optimizer.beta2", "must be in [0, 1), got -0.1"},
    {"ZeroEpsilon", [](JobSpec* s) { s->mutable_optimizer()->set_epsilon(0); }, "optimizer.epsilon",
     "must be > 0, got 0"},
    {"NegativeWeightDecay", [](JobSpec* s) { s->mutable_optimizer()->set_weight_decay(-1); },
     "optimizer.weight_decay", "must be >= 0, got -1"},
    {"NaNClip",
     [](JobSpec* s) {
       s->mutable_optimizer()->set_grad_clip_norm(std::numeric_limits<double>::quiet_NaN());
     },
     "optimizer.grad_clip_norm", "must be >= 0"},
    {"NegativeDeviceMemoryLimit",
     [](JobSpec* s) { s->mutable_training()->set_device_memory_limit_gib(-1); },
     "training.device_memory_limit_gib", "must be >= 0 GiB (0: no limit), got -1"},
    {"InfiniteDeviceMemoryLimit",
     [](JobSpec* s) {
       s->mutable_training()->set_device_memory_limit_gib(
           std::numeric_limits<double>::infinity());
     },
     "training.device_memory_limit_gib", "must be >= 0 GiB"},
    {"ZeroTotalSteps", [](JobSpec* s) { s->mutable_training()->set_total_steps(0); },
     "training.total_steps", "must be >= 1, got 0"},
    {"ZeroMicroBatch", [](JobSpec* s) { s->mutable_training()->set_micro_batch_size(0); },
     "training.micro_batch_size", "must be >= 1, got 0"},
    {"SequenceLongerThanContext",
     [](JobSpec* s) { s->mutable_training()->set_sequence_length(129); },
     "training.sequence_length", "must be in [1, model.context_length = 128], got 129"},
    {"ZeroSequence", [](JobSpec* s) { s->mutable_training()->set_sequence_length(0); },
     "training.sequence_length", "got 0", true},
    {"ZeroGradAccum", [](JobSpec* s) { s->mutable_training()->set_grad_accum_steps(0); },
     "training.grad_accum_steps", "must be >= 1, got 0", true},
    {"NegativeValInterval", [](JobSpec* s) { s->mutable_training()->set_val_interval_steps(-1); },
     "training.val_interval_steps", "must be >= 0, got -1"},
    {"ValidationWithoutBatches",
     [](JobSpec* s) {
       s->mutable_training()->set_val_interval_steps(10);
       s->mutable_training()->set_val_batches(0);
     },
     "training.val_batches", "must be >= 1 when validation is enabled, got 0", true},
    {"WarmupNotBelowTotal", [](JobSpec* s) { s->mutable_lr_schedule()->set_warmup_steps(100); },
     "lr_schedule.warmup_steps", "must be in [0, training.total_steps = 100), got 100"},
    {"NegativeWarmup", [](JobSpec* s) { s->mutable_lr_schedule()->set_warmup_steps(-5); },
     "lr_schedule.warmup_steps", "got -5"},
    {"MinLrRatioAboveOne", [](JobSpec* s) { s->mutable_lr_schedule()->set_min_lr_ratio(1.5); },
     "lr_schedule.min_lr_ratio", "must be in [0, 1], got 1.5"},
    {"ZeroStageFour", [](JobSpec* s) { s->set_zero_stage(4); }, "zero_stage",
     "must be in [0, 3], got 4"},
    {"NegativeZeroStage", [](JobSpec* s) { s->set_zero_stage(-1); }, "zero_stage", "got -1"},
    {"NoDeviceKind",
     [](JobSpec* s) { s->mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_UNSPECIFIED); },
     "resources.device_kind", "required"},
    {"Bf16OnCpu", [](JobSpec* s) { s->set_precision(weft::v1::BF16); }, "precision",
     "BF16 needs resources.device_kind DEVICE_KIND_CUDA"},
    {"Fp32OnCuda",
     [](JobSpec* s) {
       s->mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
       s->set_precision(weft::v1::FP32);
     },
     "precision", "FP32 is the CPU engine's; DEVICE_KIND_CUDA trains in BF16"},
    {"ZeroMinWorkers", [](JobSpec* s) { s->mutable_resources()->set_min_workers(0); },
     "resources.min_workers", "must be >= 1, got 0"},
    {"MaxBelowMin", [](JobSpec* s) { s->mutable_resources()->set_max_workers(1); },
     "resources.max_workers", "must be >= resources.min_workers (2), got 1"},
    {"MaxWorkersTooLarge", [](JobSpec* s) { s->mutable_resources()->set_max_workers(65537); },
     "resources.max_workers", "must be <= 65536, got 65537"},
    {"NegativeCheckpointInterval",
     [](JobSpec* s) { s->mutable_checkpoint()->set_interval_steps(-1); },
     "checkpoint.interval_steps", "must be >= 0, got -1"},
    {"ZeroKeepLast", [](JobSpec* s) { s->mutable_checkpoint()->set_keep_last(0); },
     "checkpoint.keep_last", "must be >= 1, got 0", true},
    {"HeartbeatIntervalTooShort",
     [](JobSpec* s) { s->mutable_fault()->set_heartbeat_interval_ms(9); },
     "fault.heartbeat_interval_ms", "must be >= 10, got 9"},
    {"HeartbeatTimeoutNotAboveInterval",
     [](JobSpec* s) { s->mutable_fault()->set_heartbeat_timeout_ms(500); },
     "fault.heartbeat_timeout_ms", "must be > fault.heartbeat_interval_ms (500), got 500"},
    {"NegativeMaxRestarts", [](JobSpec* s) { s->mutable_fault()->set_max_restarts(-1); },
     "fault.max_restarts", "must be >= 0, got -1"},
    {"NegativeMaxSkippedSteps", [](JobSpec* s) { s->mutable_fault()->set_max_skipped_steps(-2); },
     "fault.max_skipped_steps", "must be >= 0, got -2"},
    {"StallNotAboveHeartbeatTimeout",
     [](JobSpec* s) { s->mutable_fault()->set_stall_timeout_ms(3000); }, "fault.stall_timeout_ms",
     "must be > fault.heartbeat_timeout_ms (3000), got 3000"},
};

INSTANTIATE_TEST_SUITE_P(EveryRule, ValidateJobSpecViolationTest, ::testing::ValuesIn(kViolationCases),
                         [](const ::testing::TestParamInfo<ViolationCase>& info) {
                           return info.param.label;
                         });

// The same small model as a Llama (GQA 4/2, SwiGLU 176), every default applied.
JobSpec ValidLlamaSpec() {
  JobSpec spec = ValidCpuSpec();
  auto* m = spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_kv_heads(2);
  m->set_intermediate_size(176);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

TEST(ApplyJobSpecDefaultsTest, LlamaDefaults) {
  JobSpec spec = ValidCpuSpec();
  EXPECT_EQ(spec.model().architecture(), weft::v1::GPT2);  // UNSPECIFIED is read as GPT2
  EXPECT_FALSE(spec.model().has_tie_word_embeddings());
  spec.mutable_model()->set_architecture(weft::v1::LLAMA);
  spec.mutable_model()->set_intermediate_size(176);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(spec.model().num_kv_heads(), 4);
  EXPECT_EQ(spec.model().rope_theta(), 10000.0);
  EXPECT_EQ(spec.model().rms_norm_eps(), 1e-5);
  EXPECT_TRUE(spec.model().has_tie_word_embeddings());
  EXPECT_FALSE(spec.model().tie_word_embeddings());
  EXPECT_EQ(spec.model().rope_scaling().kind(), weft::v1::RopeScaling::NONE);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
}

class ValidateLlamaSpecViolationTest : public ::testing::TestWithParam<ViolationCase> {};

TEST_P(ValidateLlamaSpecViolationTest, NamesTheFieldOfTheOnlyViolation) {
  ExpectOnlyViolation(ValidLlamaSpec(), GetParam());
}

weft::v1::RopeScaling Llama3Scaling() {
  weft::v1::RopeScaling r;
  r.set_kind(weft::v1::RopeScaling::LLAMA3);
  r.set_factor(8);
  r.set_low_freq_factor(1);
  r.set_high_freq_factor(4);
  r.set_original_context_length(8192);
  return r;
}

const ViolationCase kLlamaViolationCases[] = {
    {"KvHeadsDoNotDivideHeads", [](JobSpec* s) { s->mutable_model()->set_num_kv_heads(3); },
     "model.num_kv_heads", "must divide model.num_heads (4 % 3 = 1)"},
    {"MoreKvHeadsThanHeads", [](JobSpec* s) { s->mutable_model()->set_num_kv_heads(8); },
     "model.num_kv_heads", "must be in [1, model.num_heads = 4], got 8"},
    {"OddHeadSize",
     [](JobSpec* s) {
       s->mutable_model()->set_hidden_size(60);  // 60 / 4 = 15
       s->mutable_model()->set_head_dim(0);
     },
     "model.hidden_size", "head size hidden_size / num_heads = 15 must be even"},
    {"NoIntermediateSize", [](JobSpec* s) { s->mutable_model()->set_intermediate_size(0); },
     "model.intermediate_size", "must be in [1, 1048576] for LLAMA, got 0"},
    {"NegativeRopeTheta", [](JobSpec* s) { s->mutable_model()->set_rope_theta(-1); },
     "model.rope_theta", "must be > 0, got -1"},
    {"NanRmsEps",
     [](JobSpec* s) {
       s->mutable_model()->set_rms_norm_eps(std::numeric_limits<double>::quiet_NaN());
     },
     "model.rms_norm_eps", "must be > 0"},
    {"Llama3FactorNotAboveOne",
     [](JobSpec* s) {
       *s->mutable_model()->mutable_rope_scaling() = Llama3Scaling();
       s->mutable_model()->mutable_rope_scaling()->set_factor(1);
     },
     "model.rope_scaling.factor", "must be > 1 for LLAMA3, got 1"},
    {"Llama3HighNotAboveLow",
     [](JobSpec* s) {
       *s->mutable_model()->mutable_rope_scaling() = Llama3Scaling();
       s->mutable_model()->mutable_rope_scaling()->set_high_freq_factor(0.5);
     },
     "model.rope_scaling.high_freq_factor", "must be > model.rope_scaling.low_freq_factor (1)"},
    {"Llama3NoOriginalContext",
     [](JobSpec* s) {
       *s->mutable_model()->mutable_rope_scaling() = Llama3Scaling();
       s->mutable_model()->mutable_rope_scaling()->set_original_context_length(0);
     },
     "model.rope_scaling.original_context_length", "must be >= 1 for LLAMA3, got 0"},
    {"NoneWithFactor",
     [](JobSpec* s) { s->mutable_model()->mutable_rope_scaling()->set_factor(8); },
     "model.rope_scaling", "kind NONE takes no factor"},
    {"UnknownRopeKind",
     [](JobSpec* s) {
       s->mutable_model()->mutable_rope_scaling()->set_kind(
           static_cast<weft::v1::RopeScaling::Kind>(9));
     },
     "model.rope_scaling.kind", "unknown value 9"},
    {"HfDirWithResume",
     [](JobSpec* s) {
       s->set_init_from_hf_dir("/models/llama");
       s->set_resume_from_job("other-1");
     },
     "init_from_hf_dir", "not together with resume_from_job"},
    {"UnknownArchitecture",
     [](JobSpec* s) {
       s->mutable_model()->set_architecture(static_cast<weft::v1::Architecture>(99));
     },
     "model.architecture", "unknown value 99"},
    {"OddHeadDim", [](JobSpec* s) { s->mutable_model()->set_head_dim(15); }, "model.head_dim",
     "must be even and in [2, 1024] (rotary rotates pairs), got 15"},
    {"HeadDimTooLarge", [](JobSpec* s) { s->mutable_model()->set_head_dim(2048); },
     "model.head_dim", "must be even and in [2, 1024]"},
    {"SlidingWindowOutsideMistral",
     [](JobSpec* s) { s->mutable_model()->set_sliding_window(4096); }, "model.sliding_window",
     "is a MISTRAL field; must be unset for architecture LLAMA"},
    {"NegativeSlidingWindow",
     [](JobSpec* s) {
       s->mutable_model()->set_architecture(weft::v1::MISTRAL);
       s->mutable_model()->set_sliding_window(-1);
     },
     "model.sliding_window", "must be >= 0 (0: no window), got -1"},
    {"Fp8OnCpu", [](JobSpec* s) { s->set_precision(weft::v1::FP8); }, "precision",
     "FP8 needs resources.device_kind DEVICE_KIND_CUDA (the CPU engine is FP32)"},
    {"Fp8RowsNotMultipleOf16",
     [](JobSpec* s) {
       s->mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
       s->set_precision(weft::v1::FP8);
       s->mutable_training()->set_micro_batch_size(1);
       s->mutable_training()->set_sequence_length(30);
     },
     "precision",
     "FP8 needs training.micro_batch_size x training.sequence_length a multiple of 16"},
};

// FP8 on CUDA for the Llama family is a valid spec.
TEST(ValidateJobSpecTest, Fp8OnCudaForEveryArchitecture) {
  for (const weft::v1::Architecture a :
       {weft::v1::LLAMA, weft::v1::QWEN2, weft::v1::QWEN3, weft::v1::MISTRAL}) {
    JobSpec spec = ValidLlamaSpec();
    spec.mutable_model()->set_architecture(a);
    spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
    spec.set_precision(weft::v1::FP8);
    EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty()) << weft::v1::Architecture_Name(a);
  }
  JobSpec gpt2 = ValidCpuSpec();
  gpt2.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  gpt2.set_precision(weft::v1::FP8);
  EXPECT_THAT(ValidateJobSpec(gpt2), ::testing::IsEmpty());
}

INSTANTIATE_TEST_SUITE_P(EveryRule, ValidateLlamaSpecViolationTest,
                         ::testing::ValuesIn(kLlamaViolationCases),
                         [](const ::testing::TestParamInfo<ViolationCase>& info) {
                           return info.param.label;
                         });

TEST(ValidateJobSpecTest, ManifestReplacesPathsFormatAndTokenizer) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_data()->set_manifest_path("/data/fortunes/manifest.json");
  std::vector<std::string> v = ValidateJobSpec(spec);
  EXPECT_THAT(v, ::testing::UnorderedElementsAre(StartsWith("data.train_path: must be empty"),
                                                 StartsWith("data.format: must be empty")));
  spec.mutable_data()->clear_train_path();
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_UNSPECIFIED);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_data()->set_val_path("/data/val.bin");
  spec.mutable_data()->set_tokenizer_path("/data/spm.model");
  v = ValidateJobSpec(spec);
  EXPECT_THAT(v, ::testing::UnorderedElementsAre(StartsWith("data.val_path: must be empty"),
                                                 StartsWith("data.tokenizer_path: must be empty")));
}

TEST(ValidateJobSpecTest, SamplingModes) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_data()->set_sampling(weft::v1::DataSpec::SEQUENTIAL);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_data()->set_sampling(static_cast<weft::v1::DataSpec::Sampling>(7));
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith("data.sampling: unknown value 7")));
}

TEST(ValidateJobSpecTest, ActivationCheckpointingLevels) {
  JobSpec spec = ValidCpuSpec();
  for (auto level : {weft::v1::ActivationCheckpointing::AUTO, weft::v1::ActivationCheckpointing::NONE,
                     weft::v1::ActivationCheckpointing::SELECTIVE,
                     weft::v1::ActivationCheckpointing::FULL}) {
    spec.mutable_training()->set_activation_checkpointing(level);
    EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty()) << level;
  }
  spec.mutable_training()->set_activation_checkpointing(
      static_cast<weft::v1::ActivationCheckpointing::Level>(9));
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith("training.activation_checkpointing: unknown value 9")));
}

TEST(ValidateJobSpecTest, OptimizerOffloadIsForGpuJobs) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_optimizer()->set_offload(true);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith("optimizer.offload: only for DEVICE_KIND_CUDA")));
  spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  spec.set_precision(weft::v1::BF16);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
}

// A partial offload's share: in [0, 1], and only beside offload: true. NaN is refused too.
TEST(ValidateJobSpecTest, OptimizerOffloadFraction) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  spec.set_precision(weft::v1::BF16);
  spec.mutable_optimizer()->set_offload_fraction(0.5);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith(
                  "optimizer.offload_fraction: set without optimizer.offload: true")));
  spec.mutable_optimizer()->set_offload(true);
  for (double ok : {0.0, 0.25, 1.0}) {
    spec.mutable_optimizer()->set_offload_fraction(ok);
    EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty()) << ok;
  }
  for (double bad : {-0.1, 1.5, std::nan("")}) {
    spec.mutable_optimizer()->set_offload_fraction(bad);
    EXPECT_THAT(ValidateJobSpec(spec),
                ::testing::ElementsAre(StartsWith("optimizer.offload_fraction: must be in [0, 1]")))
        << bad;
  }
}

// offload_auto lets the engine choose the share: alone, on GPU jobs, with full sharding only.
TEST(ValidateJobSpecTest, OptimizerOffloadAuto) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_optimizer()->set_offload_auto(true);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::ElementsAre(StartsWith(
                                         "optimizer.offload_auto: only for DEVICE_KIND_CUDA")));
  spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  spec.set_precision(weft::v1::BF16);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_optimizer()->set_offload(true);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith(
                  "optimizer.offload_auto: set with optimizer.offload or offload_fraction")));
  spec.mutable_optimizer()->set_offload(false);
  spec.mutable_optimizer()->set_offload_fraction(0.5);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::Contains(StartsWith(
                  "optimizer.offload_auto: set with optimizer.offload or offload_fraction")));
  // Replicas of a shard must step alike.
  spec.mutable_optimizer()->set_offload_fraction(0.0);
  spec.set_zero_stage(3);
  spec.mutable_sharding()->set_scope(weft::v1::ShardingSpec::HOST);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith(
                  "optimizer.offload_auto: not with sharding.scope HOST, GROUP or AUTO")));
}

TEST(ValidateJobSpecTest, Gpt2RefusesEveryLlamaField) {
  JobSpec spec = ValidCpuSpec();
  auto* m = spec.mutable_model();
  m->set_num_kv_heads(2);
  m->set_intermediate_size(100);
  m->set_rope_theta(1);
  *m->mutable_rope_scaling() = Llama3Scaling();
  m->set_rms_norm_eps(1e-6);
  m->set_tie_word_embeddings(false);
  const std::vector<std::string> v = ValidateJobSpec(spec);
  ASSERT_THAT(v, ::testing::SizeIs(6)) << ::testing::PrintToString(v);
  for (const char* field : {"model.num_kv_heads", "model.intermediate_size", "model.rope_theta",
                            "model.rope_scaling", "model.rms_norm_eps"}) {
    EXPECT_THAT(v, ::testing::Contains(
                       StartsWith(absl::StrCat(field, ": is a LLAMA field; must be unset"))));
  }
  EXPECT_THAT(v, ::testing::Contains(StartsWith("model.tie_word_embeddings: GPT2 always ties")));
  m->set_tie_word_embeddings(true);  // says what GPT2 does anyway: accepted
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::SizeIs(5));
}

TEST(ValidateJobSpecTest, Uint32TokensTakeLlama3Vocabulary) {
  JobSpec spec = ValidLlamaSpec();
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_UINT32_BIN);
  spec.mutable_model()->set_vocab_size(128256);
  spec.mutable_model()->set_padded_vocab_size(128256);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_UINT16_BIN);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(HasSubstr("must be <= 65536 for DATA_FORMAT_UINT16_BIN")));
}

// proto3 enums are open: a SubmitJob request can carry a value outside the enum, and it reaches
// the workers unchanged: every enum field must reject such values.
TEST(ValidateJobSpecTest, OutOfRangeEnumValuesAreRejected) {
  JobSpec spec = ValidCpuSpec();
  spec.set_precision(static_cast<weft::v1::Precision>(7));
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::Contains(StartsWith("precision: ")));
  spec = ValidCpuSpec();
  spec.mutable_lr_schedule()->set_kind(static_cast<weft::v1::LrSchedule::Kind>(9));
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::Contains(StartsWith("lr_schedule.kind: ")));
}

TEST(ValidateJobSpecTest, OutOfRangeDeviceKindAndFormatAreRejected) {
  JobSpec spec = ValidCpuSpec();
  spec.mutable_resources()->set_device_kind(static_cast<weft::v1::DeviceKind>(5));
  spec.mutable_data()->set_format(static_cast<weft::v1::DataFormat>(6));
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::ElementsAre(StartsWith("data.format: "),
                                                            StartsWith("resources.device_kind: ")));
}

TEST(ValidateJobSpecTest, BoundaryValuesAreAccepted) {
  JobSpec spec = ValidCpuSpec();
  spec.set_name(std::string(64, 'z'));
  spec.mutable_model()->set_num_layers(1024);
  spec.mutable_data()->set_val_fraction(0.5);
  spec.mutable_training()->set_sequence_length(128);  // == context_length
  spec.mutable_lr_schedule()->set_warmup_steps(99);   // == total_steps - 1
  spec.mutable_lr_schedule()->set_min_lr_ratio(1.0);
  spec.set_zero_stage(3);
  spec.mutable_resources()->set_max_workers(65536);
  spec.mutable_fault()->set_heartbeat_interval_ms(10);
  spec.mutable_fault()->set_heartbeat_timeout_ms(11);
  spec.mutable_fault()->set_stall_timeout_ms(12);
  spec.mutable_fault()->set_max_restarts(0);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
}

TEST(NormalizeJobSpecTest, ReportsEveryProblemAtOnce) {
  JobSpec spec;  // nothing set at all
  spec.set_name("bad name");
  spec.mutable_model()->set_num_layers(2);
  spec.mutable_model()->set_hidden_size(64);
  spec.mutable_model()->set_num_heads(4);
  spec.mutable_model()->set_vocab_size(256);
  spec.mutable_model()->set_context_length(128);
  spec.mutable_data()->set_train_path("/x");
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_TEXT_BYTES);
  spec.mutable_training()->set_total_steps(10);
  spec.mutable_training()->set_micro_batch_size(1);
  spec.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
  spec.mutable_resources()->set_min_workers(1);
  // Four problems:
  spec.mutable_optimizer()->set_learning_rate(-1);
  spec.set_zero_stage(7);
  spec.mutable_checkpoint()->set_interval_steps(-3);
  absl::StatusOr<JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(normalized.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(normalized.status().message());
  std::vector<std::string> lines = absl::StrSplit(message, '\n');
  EXPECT_THAT(lines, ::testing::ElementsAre(
                         "invalid job spec (4 problems):", StartsWith("name: \"bad name\" must be"),
                         "optimizer.learning_rate: must be > 0, got -1",
                         "zero_stage: must be in [0, 3], got 7",
                         "checkpoint.interval_steps: must be >= 0, got -3"));
}

TEST(NormalizeJobSpecTest, EmptySpecNamesEveryRequiredField) {
  const std::vector<std::string> violations = [] {
    JobSpec spec;
    ApplyJobSpecDefaults(&spec);
    return ValidateJobSpec(spec);
  }();
  for (const char* field :
       {"name: required", "model.num_layers: ", "model.hidden_size: ", "model.num_heads: ",
        "model.vocab_size: ", "model.context_length: ", "data.train_path: required",
        "data.format: required", "optimizer.learning_rate: ", "training.total_steps: ",
        "training.micro_batch_size: ", "training.sequence_length: ",
        "resources.device_kind: required", "resources.min_workers: "}) {
    EXPECT_THAT(violations, ::testing::Contains(StartsWith(field))) << field;
  }
}

TEST(NormalizeJobSpecTest, SingleProblemSaysProblemNotProblems) {
  JobSpec spec = ValidCpuSpec();
  spec.set_zero_stage(5);
  absl::StatusOr<JobSpec> normalized = NormalizeJobSpec(spec);
  ASSERT_FALSE(normalized.ok());
  EXPECT_EQ(std::string(normalized.status().message()),
            "invalid job spec (1 problem):\nzero_stage: must be in [0, 3], got 5");
}

TEST(ModelParameterCountTest, Gpt2Small) {
  JobSpec spec = ParseOrDie(kFullSpec);
  ApplyJobSpecDefaults(&spec);
  EXPECT_EQ(ModelParameterCount(spec.model()), 124'475'904);
}

TEST(ModelParameterCountTest, UnpaddedVocabularyUsesVocabSize) {
  weft::v1::ModelSpec m;
  m.set_num_layers(12);
  m.set_hidden_size(768);
  m.set_num_heads(12);
  m.set_vocab_size(50257);
  m.set_context_length(1024);
  // The published GPT-2 small count (tied head, unpadded vocabulary).
  EXPECT_EQ(ModelParameterCount(m), 124'439'808);
}

// The published counts of the families' checkpoints (their vocabularies are multiples of 128,
// so padding adds nothing).
TEST(ModelParameterCountTest, Qwen2_5_7BQwen3_8BAndMistral7B) {
  auto shape = [](weft::v1::Architecture arch, int layers, int width, int heads, int kv, int inter,
                  int vocab) {
    weft::v1::ModelSpec m;
    m.set_architecture(arch);
    m.set_num_layers(layers);
    m.set_hidden_size(width);
    m.set_num_heads(heads);
    m.set_num_kv_heads(kv);
    m.set_intermediate_size(inter);
    m.set_vocab_size(vocab);
    m.set_padded_vocab_size(vocab);
    m.set_context_length(4096);
    m.set_tie_word_embeddings(false);
    return m;
  };
  EXPECT_EQ(ModelParameterCount(shape(weft::v1::QWEN2, 28, 3584, 28, 4, 18944, 152064)),
            7'615'616'512);
  weft::v1::ModelSpec qwen3 = shape(weft::v1::QWEN3, 36, 4096, 32, 8, 12288, 151936);
  qwen3.set_head_dim(128);
  EXPECT_EQ(ModelParameterCount(qwen3), 8'190'735'360);
  EXPECT_EQ(ModelParameterCount(shape(weft::v1::MISTRAL, 32, 4096, 32, 8, 14336, 32000)),
            7'241'732'096);
  // Qwen3-0.6B: 16 heads of 128 over a width of 1024 (queries twice as wide as the model), tied.
  weft::v1::ModelSpec small = shape(weft::v1::QWEN3, 28, 1024, 16, 8, 3072, 151936);
  small.set_head_dim(128);
  small.set_tie_word_embeddings(true);
  EXPECT_EQ(ModelParameterCount(small), 596'049'920);
}

TEST(ModelParameterCountTest, Llama3_8BAndTiedLlamaByHand) {
  weft::v1::ModelSpec m;
  m.set_architecture(weft::v1::LLAMA);
  m.set_num_layers(32);
  m.set_hidden_size(4096);
  m.set_num_heads(32);
  m.set_num_kv_heads(8);
  m.set_intermediate_size(14336);
  m.set_vocab_size(128256);
  m.set_padded_vocab_size(128256);
  m.set_context_length(8192);
  m.set_tie_word_embeddings(false);
  EXPECT_EQ(ModelParameterCount(m), 8'030'261'248);  // Meta-Llama-3-8B's published count
  // Tied, by hand: L=1, C=4, NH=2, NKV=1 (KV width 2), I=3, V=5.
  weft::v1::ModelSpec t;
  t.set_architecture(weft::v1::LLAMA);
  t.set_num_layers(1);
  t.set_hidden_size(4);
  t.set_num_heads(2);
  t.set_num_kv_heads(1);
  t.set_intermediate_size(3);
  t.set_vocab_size(5);
  t.set_padded_vocab_size(5);
  t.set_tie_word_embeddings(true);
  // embed 20 + norm 4 + block (norms 8, qkv 4 x 8 = 32, out 16, gate/up/down 36)
  EXPECT_EQ(ModelParameterCount(t), 20 + 4 + 8 + 32 + 16 + 36);
}

TEST(ModelParameterCountTest, TinyModelByHand) {
  weft::v1::ModelSpec m;
  m.set_num_layers(1);
  m.set_hidden_size(2);
  m.set_num_heads(1);
  m.set_vocab_size(3);
  m.set_padded_vocab_size(4);
  m.set_context_length(5);
  // wte 4*2 + wpe 5*2 + block (12*4 + 13*2 = 74) + final LN 2*2.
  EXPECT_EQ(ModelParameterCount(m), 8 + 10 + 74 + 4);
}


TEST(ValidateJobSpecTest, HybridShardingScopes) {
  JobSpec spec = ValidCpuSpec();  // min_workers 2
  spec.set_zero_stage(3);
  spec.mutable_sharding()->set_scope(weft::v1::ShardingSpec::HOST);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_sharding()->set_scope(weft::v1::ShardingSpec::GROUP);
  spec.mutable_sharding()->set_group_size(2);
  spec.mutable_resources()->set_max_workers(5);  // a generation of 5 takes 4
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_sharding()->set_group_size(1);  // pure replication
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  // Compressed replica all-reduces where there are replicas; AUTO like HOST.
  for (auto format : {weft::v1::ShardingSpec::WIRE_BF16, weft::v1::ShardingSpec::WIRE_INT8}) {
    spec.mutable_sharding()->set_replica_reduce_format(format);
    EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  }
  spec.mutable_sharding()->set_group_size(0);
  spec.mutable_sharding()->set_scope(weft::v1::ShardingSpec::AUTO);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
}

TEST(ValidateJobSpecTest, ReplicaReduceFormatErrorsNameTheField) {
  using weft::v1::ShardingSpec;
  JobSpec spec = ValidCpuSpec();
  spec.set_zero_stage(3);
  spec.mutable_sharding()->set_scope(ShardingSpec::HOST);
  spec.mutable_sharding()->set_replica_reduce_format(static_cast<ShardingSpec::WireFormat>(9));
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre("sharding.replica_reduce_format: unknown value 9; use "
                                     "WIRE_FP32, WIRE_BF16 or WIRE_INT8"));
  spec.mutable_sharding()->set_scope(ShardingSpec::WORLD);
  spec.mutable_sharding()->set_replica_reduce_format(ShardingSpec::WIRE_INT8);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith(
                  "sharding.replica_reduce_format: WIRE_INT8 needs scope HOST, GROUP or AUTO")));
  // AUTO shards ZeRO-3 state like HOST.
  spec.mutable_sharding()->set_scope(ShardingSpec::AUTO);
  spec.set_zero_stage(1);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith("sharding.scope: HOST, GROUP and AUTO shard")));
}

TEST(ValidateJobSpecTest, ReplicaOptimizerErrorsNameTheField) {
  using weft::v1::ShardingSpec;
  JobSpec spec = ValidCpuSpec();
  spec.set_zero_stage(3);
  spec.mutable_sharding()->set_scope(ShardingSpec::HOST);
  spec.mutable_sharding()->set_replica_optimizer(ShardingSpec::OPTIMIZER_SHARDED);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_sharding()->set_scope(ShardingSpec::AUTO);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
  spec.mutable_sharding()->set_replica_optimizer(static_cast<ShardingSpec::ReplicaOptimizer>(5));
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre("sharding.replica_optimizer: unknown value 5; use "
                                     "OPTIMIZER_REPLICATED or OPTIMIZER_SHARDED"));
  spec.mutable_sharding()->set_replica_optimizer(ShardingSpec::OPTIMIZER_SHARDED);
  spec.mutable_sharding()->set_scope(ShardingSpec::WORLD);
  EXPECT_THAT(ValidateJobSpec(spec),
              ::testing::ElementsAre(StartsWith(
                  "sharding.replica_optimizer: OPTIMIZER_SHARDED needs scope HOST, GROUP or "
                  "AUTO")));
  // An offloaded optimizer steps whole shards on the host: not with pieces of them.
  JobSpec gpu = spec;
  gpu.mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CUDA);
  gpu.mutable_sharding()->set_scope(ShardingSpec::HOST);
  gpu.mutable_optimizer()->set_offload(true);
  EXPECT_THAT(ValidateJobSpec(gpu),
              ::testing::Contains(StartsWith("sharding.replica_optimizer: OPTIMIZER_SHARDED is "
                                             "not with optimizer.offload")));
}

TEST(ValidateJobSpecTest, HybridShardingErrorsNameTheField) {
  using weft::v1::ShardingSpec;
  struct Case {
    ShardingSpec::Scope scope;
    int32_t group_size;
    int32_t zero_stage;
    std::string error;
  };
  const Case cases[] = {
      {static_cast<ShardingSpec::Scope>(7), 0, 3, "sharding.scope: unknown value 7"},
      {ShardingSpec::HOST, 2, 3, "sharding.group_size: only for scope GROUP"},
      {ShardingSpec::WORLD, 2, 3, "sharding.group_size: only for scope GROUP"},
      {ShardingSpec::GROUP, 0, 3, "sharding.group_size: must be >= 1 for scope GROUP, got 0"},
      {ShardingSpec::GROUP, -2, 3, "sharding.group_size: must be >= 1 for scope GROUP, got -2"},
      // ValidCpuSpec's min_workers is 2.
      {ShardingSpec::GROUP, 3, 3,
       "resources.min_workers: must be a multiple of sharding.group_size (3), got 2"},
      {ShardingSpec::GROUP, 2, 2,
       "sharding.scope: HOST, GROUP and AUTO shard ZeRO-3 state: need zero_stage 3, got 2"},
      {ShardingSpec::HOST, 0, 0,
       "sharding.scope: HOST, GROUP and AUTO shard ZeRO-3 state: need zero_stage 3, got 0"},
  };
  for (const Case& c : cases) {
    JobSpec spec = ValidCpuSpec();
    spec.set_zero_stage(c.zero_stage);
    spec.mutable_sharding()->set_scope(c.scope);
    spec.mutable_sharding()->set_group_size(c.group_size);
    EXPECT_THAT(ValidateJobSpec(spec), ::testing::ElementsAre(StartsWith(c.error))) << c.error;
  }
  // Full sharding takes every stage.
  JobSpec spec = ValidCpuSpec();
  spec.set_zero_stage(2);
  spec.mutable_sharding()->set_scope(ShardingSpec::WORLD);
  EXPECT_THAT(ValidateJobSpec(spec), ::testing::IsEmpty());
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

// Issue 37: a resume into another shape failed only on the worker, deep in a tensor ("range
// [0, 99136) of tensor u1.params"). The first field that shapes the parameters is named; the
// fields that only change what the same tensors compute are not.
TEST(ModelDifferenceTest, NamesTheFirstFieldThatShapesTheParameters) {
  weft::v1::ModelSpec a;
  a.set_architecture(weft::v1::LLAMA);
  a.set_num_layers(2);
  a.set_hidden_size(64);
  a.set_num_heads(4);
  a.set_num_kv_heads(2);
  a.set_intermediate_size(128);
  a.set_padded_vocab_size(256);
  a.set_context_length(128);
  weft::v1::ModelSpec b = a;
  EXPECT_EQ(ModelDifference(a, b, "here", "there"), "");
  b.set_rope_theta(500000);
  b.set_context_length(4096);  // Llama: no position embedding to shape
  EXPECT_EQ(ModelDifference(a, b, "here", "there"), "");
  b.set_num_kv_heads(4);
  EXPECT_EQ(ModelDifference(a, b, "here", "there"), "model.num_kv_heads: 2 here, 4 there");
  // head_dim by its value: set to hidden_size / num_heads it is the default's model.
  b = a;
  b.set_head_dim(a.hidden_size() / a.num_heads());
  EXPECT_EQ(ModelDifference(a, b, "here", "there"), "");
  b.set_head_dim(2 * a.hidden_size() / a.num_heads());
  EXPECT_EQ(ModelDifference(a, b, "here", "there"),
            absl::StrCat("model.head_dim: ", a.hidden_size() / a.num_heads(), " here, ",
                         2 * a.hidden_size() / a.num_heads(), " there"));
  b = a;
  b.set_architecture(weft::v1::GPT2);
  EXPECT_EQ(ModelDifference(a, b, "here", "there"), "model.architecture: LLAMA here, GPT2 there");
  // GPT-2's context length is its position embedding's rows.
  weft::v1::ModelSpec g = a;
  g.set_architecture(weft::v1::ARCHITECTURE_UNSPECIFIED);
  weft::v1::ModelSpec h = g;
  h.set_architecture(weft::v1::GPT2);
  EXPECT_EQ(ModelDifference(g, h, "here", "there"), "") << "unspecified is GPT-2";
  h.set_context_length(256);
  EXPECT_EQ(ModelDifference(g, h, "here", "there"), "model.context_length: 128 here, 256 there");
}

}  // namespace
}  // namespace weft
