// Weft's CPU models against Hugging Face transformers (tests/fixtures/hf, README there): each
// fixture directory is imported with the Hugging Face importer and run forward and backward on
// its batch; the loss and the logits at four positions must agree to 1e-5 relative, and every
// sampled gradient to 1e-5 of its tensor's largest gradient. The gradients are located through
// the import mapping, so a wrong row split or transpose fails here.
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "worker/engine/cpu/gpt2_model.h"
#include "worker/engine/cpu/llama_model.h"
#include "worker/engine/cpu/model.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"
#include "worker/hf/hf_checkpoint.h"
#include "worker/hf/hf_config.h"
#include "worker/hf/hf_export.h"
#include "worker/hf/hf_mapping.h"

namespace weft::hf {
namespace {

using Json = nlohmann::json;

std::string Fixture(const std::string& name) {
  return std::string(WEFT_HF_FIXTURES) + "/" + name;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::vector<int32_t> Flat(const Json& rows) {
  std::vector<int32_t> out;
  for (const Json& row : rows) {
    for (const Json& v : row) out.push_back(v.get<int32_t>());
  }
  return out;
}

// The fixture's model, imported.
struct Imported {
  weft::v1::ModelSpec spec;
  std::unique_ptr<HfImporter> importer;
  std::vector<std::vector<float>> units;
};

Imported Import(const std::string& dir) {
  Imported m;
  auto spec = ModelSpecFromHfConfig(ReadText(dir + "/config.json"), dir + "/config.json");
  EXPECT_TRUE(spec.ok()) << spec.status();
  weft::v1::JobSpec job;
  *job.mutable_model() = *spec;
  ApplyJobSpecDefaults(&job);
  m.spec = job.model();
  auto importer = HfImporter::Open(dir, m.spec);
  EXPECT_TRUE(importer.ok()) << importer.status();
  if (!importer.ok()) return m;
  m.importer = std::move(*importer);
  const engine::ModelArch& arch = m.importer->arch();
  for (int u = 0; u < arch.NumUnits(); ++u) {
    m.units.emplace_back(arch.UnitSize(u));
    EXPECT_TRUE(m.importer->ReadParams(u, 0, arch.UnitSize(u), m.units.back().data()).ok());
  }
  return m;
}

void ExpectRelativelyNear(double got, double want, double tolerance, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tolerance * std::max(std::abs(want), 1e-30))
      << what << ": Weft " << got << ", transformers " << want;
}

class HfReferenceTest : public ::testing::TestWithParam<const char*> {};

TEST_P(HfReferenceTest, LossLogitsAndGradientsMatchTransformers) {
  const std::string dir = Fixture(GetParam());
  const Json ref = Json::parse(ReadText(dir + "/reference.json"));
  Imported m = Import(dir);
  ASSERT_NE(m.importer, nullptr);
  const engine::ModelArch& arch = m.importer->arch();
  const int b = ref["batch"].get<int>();
  const int t = ref["seq_len"].get<int>();
  const std::vector<int32_t> inputs = Flat(ref["inputs"]);
  const std::vector<int32_t> targets = Flat(ref["targets"]);
  ASSERT_EQ(inputs.size(), static_cast<size_t>(b * t));
  auto made = engine::cpu::CreateCpuModel(arch, b, t, engine::Checkpointing::kNone);
  ASSERT_TRUE(made.ok()) << made.status();
  auto model = *std::move(made);
  const int layers = arch.num_layers();
  auto forward = [&] {
    model->SetShape(b, t);
    model->EncoderForward(m.units[0].data(), inputs.data());
    for (int l = 0; l < layers; ++l) model->BlockForward(l, m.units[1 + l].data());
  };

  forward();
  model->ClassifierForward(m.units[0].data(), nullptr, 1.0f);
  const int vp = arch.padded_vocab_size();
  for (const Json& row : ref["logits"]) {
    const int rb = row["b"].get<int>();
    const int rt = row["t"].get<int>();
    const float* logits = model->Logits() + (static_cast<size_t>(rb) * t + rt) * vp;
    const Json& values = row["values"];
    ASSERT_EQ(values.size(), static_cast<size_t>(arch.vocab_size()));
    // Relative to the row's largest logit: single logits near 0 have no relative precision.
    double scale = 0;
    for (const Json& v : values) scale = std::max(scale, std::abs(v.get<double>()));
    for (size_t v = 0; v < values.size(); ++v) {
      EXPECT_NEAR(logits[v], values[v].get<double>(), 1e-5 * scale)
          << "logit (" << rb << ", " << rt << ", " << v << ")";
    }
  }

  forward();
  const float loss = model->ClassifierForward(m.units[0].data(), targets.data(), 1.0f);
  ExpectRelativelyNear(loss, ref["loss"].get<double>(), 1e-5, "loss");
  std::vector<std::vector<float>> grads;
  for (const auto& unit : m.units) grads.emplace_back(unit.size(), 0.0f);
  model->ClassifierBackward(m.units[0].data(), grads[0].data());
  for (int l = layers - 1; l >= 0; --l) {
    model->BlockBackward(l, m.units[1 + l].data(), grads[1 + l].data());
  }
  model->EncoderBackward(grads[0].data());

  auto mapping = HfTensorMapping(arch);
  ASSERT_TRUE(mapping.ok());
  std::map<std::string, const HfTensorMap*> by_name;
  for (const HfTensorMap& entry : *mapping) by_name[entry.name] = &entry;
  int checked = 0;
  for (const auto& [name, sample] : ref["grads"].items()) {
    ASSERT_TRUE(by_name.count(name)) << name << " is in the fixture but not in the mapping";
    const HfTensorMap& entry = *by_name[name];
    const double max_abs = sample["max_abs"].get<double>();
    for (size_t i = 0; i < sample["indices"].size(); ++i) {
      const int64_t index = sample["indices"][i].get<int64_t>();
      const float got = grads[entry.unit][UnitOffsetOf(entry, index)];
      EXPECT_NEAR(got, sample["values"][i].get<double>(), 1e-5 * max_abs)
          << name << "[" << index << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16 * static_cast<int>(ref["grads"].size()));
}

// ---- Packed documents and loss masks (the fixture's "packed" section). ----

// One forward (and backward) of the packed batch through a CPU model of element type T: the
// loss as the mean over the targets that count, the four rows of logits, every unit's
// gradient of that mean.
struct PackedRun {
  double loss = 0;
  std::vector<std::vector<double>> logits;  // ref["logits"]'s positions, vocab_size each
  std::vector<std::vector<double>> grads;   // by unit
};

// `labels` (-100: ignored) and `doc_starts` (nullptr: one document a row) are the packed
// section's, or the whole batch's targets.
template <typename Model, typename Config>
PackedRun RunPacked(const Config& config, const engine::ModelArch& arch,
                    const std::vector<std::vector<float>>& units, const Json& ref,
                    const Json& variant, const std::vector<int32_t>& labels,
                    const std::vector<int32_t>* doc_starts, bool reset_positions) {
  using T = std::remove_cvref_t<decltype(std::declval<Model>().Logits()[0])>;
  const int b = ref["batch"].get<int>();
  const int t = ref["seq_len"].get<int>();
  const std::vector<int32_t> inputs = Flat(ref["inputs"]);
  int counted = 0;
  for (int32_t l : labels) counted += l >= 0 ? 1 : 0;
  std::vector<std::vector<T>> params;
  for (const auto& unit : units) params.emplace_back(unit.begin(), unit.end());
  Model model(config, b, t, engine::Checkpointing::kNone);
  const int layers = arch.num_layers();
  auto forward = [&] {
    model.SetShape(b, t);
    if (doc_starts != nullptr) model.SetDocuments(doc_starts->data(), reset_positions);
    model.EncoderForward(params[0].data(), inputs.data());
    for (int l = 0; l < layers; ++l) model.BlockForward(l, params[1 + l].data());
  };
  PackedRun run;
  forward();
  model.ClassifierForward(params[0].data(), nullptr, T(1));
  const int vp = arch.padded_vocab_size();
  for (const Json& row : variant["logits"]) {
    const T* l =
        model.Logits() + (static_cast<size_t>(row["b"].get<int>()) * t + row["t"].get<int>()) * vp;
    run.logits.emplace_back(l, l + arch.vocab_size());
  }
  forward();
  // The model's loss sums over every position and divides by B * T; the mean over the
  // targets that count is that times B * T / counted, and so is its gradient's scale.
  const double scale = static_cast<double>(b) * t / counted;
  run.loss =
      model.ClassifierForward(params[0].data(), labels.data(), static_cast<T>(scale)) * scale;
  std::vector<std::vector<T>> grads;
  for (const auto& unit : params) grads.emplace_back(unit.size(), T(0));
  model.ClassifierBackward(params[0].data(), grads[0].data());
  for (int l = layers - 1; l >= 0; --l) {
    model.BlockBackward(l, params[1 + l].data(), grads[1 + l].data());
  }
  model.EncoderBackward(grads[0].data());
  for (const auto& g : grads) run.grads.emplace_back(g.begin(), g.end());
  return run;
}

// RunPacked with the CPU model of `arch`, in float64 or float32.
PackedRun RunModel(bool f64, const engine::ModelArch& arch,
                   const std::vector<std::vector<float>>& units, const Json& ref,
                   const Json& variant, const std::vector<int32_t>& labels,
                   const std::vector<int32_t>* doc_starts, bool reset) {
  if (const auto* llama = dynamic_cast<const engine::LlamaArch*>(&arch)) {
    return f64 ? RunPacked<engine::cpu::LlamaModel<double>>(llama->config(), arch, units, ref,
                                                            variant, labels, doc_starts, reset)
               : RunPacked<engine::cpu::LlamaModel<float>>(llama->config(), arch, units, ref,
                                                           variant, labels, doc_starts, reset);
  }
  const auto& gpt = dynamic_cast<const engine::Gpt2Arch&>(arch);
  return f64 ? RunPacked<engine::cpu::GptModel<double>>(gpt.config(), arch, units, ref, variant,
                                                        labels, doc_starts, reset)
             : RunPacked<engine::cpu::GptModel<float>>(gpt.config(), arch, units, ref, variant,
                                                       labels, doc_starts, reset);
}

// `run` against transformers' figures `want` (the fixture, or one of its packed variants): the
// loss to `loss_tolerance` relative, the logits to 1e-5 of their row's largest, every sampled
// gradient (located through the import mapping of `arch`) to 1e-5 of its tensor's largest.
void ExpectMatches(const PackedRun& run, const Json& want, const engine::ModelArch& arch,
                   double loss_tolerance) {
  auto mapping = HfTensorMapping(arch);
  ASSERT_TRUE(mapping.ok());
  std::map<std::string, const HfTensorMap*> by_name;
  for (const HfTensorMap& entry : *mapping) by_name[entry.name] = &entry;
  ExpectRelativelyNear(run.loss, want["loss"].get<double>(), loss_tolerance, "loss");
  for (size_t r = 0; r < run.logits.size(); ++r) {
    const Json& values = want["logits"][r]["values"];
    double scale = 0;
    for (const Json& v : values) scale = std::max(scale, std::abs(v.get<double>()));
    for (size_t v = 0; v < values.size(); ++v) {
      EXPECT_NEAR(run.logits[r][v], values[v].get<double>(), 1e-5 * scale)
          << "logit row " << r << " column " << v;
    }
  }
  int checked = 0;
  for (const auto& [tensor, sample] : want["grads"].items()) {
    ASSERT_TRUE(by_name.count(tensor)) << tensor;
    const HfTensorMap& entry = *by_name[tensor];
    const double max_abs = sample["max_abs"].get<double>();
    for (size_t i = 0; i < sample["indices"].size(); ++i) {
      const int64_t index = sample["indices"][i].get<int64_t>();
      EXPECT_NEAR(run.grads[entry.unit][UnitOffsetOf(entry, index)],
                  sample["values"][i].get<double>(), 1e-5 * max_abs)
          << tensor << "[" << index << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 16 * static_cast<int>(want["grads"].size()));
}

// The float64 model on the whole batch (every target counts, one document a row): the loss to
// 1e-6 relative, the logits to 1e-5 of their row's largest, every sampled gradient to 1e-5 of
// its tensor's largest.
TEST_P(HfReferenceTest, Float64LossLogitsAndGradientsMatchTransformers) {
  const std::string dir = Fixture(GetParam());
  const Json ref = Json::parse(ReadText(dir + "/reference.json"));
  Imported m = Import(dir);
  ASSERT_NE(m.importer, nullptr);
  const engine::ModelArch& arch = m.importer->arch();
  const PackedRun run = RunModel(/*f64=*/true, arch, m.units, ref, ref, Flat(ref["targets"]),
                                 /*doc_starts=*/nullptr, /*reset=*/false);
  ExpectMatches(run, ref, arch, 1e-6);
}

// transformers, fed the packed batch with labels = -100 where a target is ignored and each
// document on its own (positions restarted or not), against Weft's CPU model in float64
// (the loss to 1e-6 relative, every sampled gradient to 1e-5 of its tensor's largest) and in
// float32, the engine's own (1e-5 both).
TEST_P(HfReferenceTest, PackedDocumentsWithLossMasksMatchTransformers) {
  const std::string dir = Fixture(GetParam());
  const Json ref = Json::parse(ReadText(dir + "/reference.json"));
  ASSERT_TRUE(ref.contains("packed")) << dir << ": regenerate with make_reference.py";
  Imported m = Import(dir);
  ASSERT_NE(m.importer, nullptr);
  const engine::ModelArch& arch = m.importer->arch();
  const std::vector<int32_t> labels = Flat(ref["packed"]["labels"]);
  const std::vector<int32_t> doc_starts = Flat(ref["packed"]["doc_starts"]);
  for (const char* name : {"packed_reset", "packed_continue"}) {
    const Json& variant = ref["packed"][name];
    const bool reset = std::string(name) == "packed_reset";
    for (const bool f64 : {true, false}) {
      SCOPED_TRACE(absl::StrCat(name, f64 ? " float64" : " float32"));
      const PackedRun run = RunModel(f64, arch, m.units, ref, variant, labels, &doc_starts, reset);
      ExpectMatches(run, variant, arch, f64 ? 1e-6 : 1e-5);
    }
  }
}

// Imported and exported again, a checkpoint transformers saved comes out with the same tensor
// names, shapes and values (fp32), whatever the file layout.
TEST_P(HfReferenceTest, ExportGivesBackWhatTransformersSaved) {
  const std::string dir = Fixture(GetParam());
  Imported m = Import(dir);
  ASSERT_NE(m.importer, nullptr);
  weft::testing::TempDir tmp;
  const std::string out = tmp.File("export");
  ASSERT_TRUE(ExportHf(out, m.spec, m.units, {}).ok());
  auto exported = HfCheckpoint::Open(out);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const HfCheckpoint& saved = m.importer->checkpoint();
  EXPECT_EQ((*exported)->TensorNames(), saved.TensorNames());
  for (const std::string& name : saved.TensorNames()) {
    const HfCheckpoint::Located a = saved.Find(name);
    const HfCheckpoint::Located b = (*exported)->Find(name);
    ASSERT_NE(b.tensor, nullptr) << name;
    ASSERT_EQ(a.tensor->shape, b.tensor->shape) << name;
    std::vector<float> x(a.tensor->elements), y(b.tensor->elements);
    ASSERT_TRUE(a.file->Read(*a.tensor, 0, a.tensor->elements, x.data()).ok());
    ASSERT_TRUE(b.file->Read(*b.tensor, 0, b.tensor->elements, y.data()).ok());
    EXPECT_EQ(x, y) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfReferenceTest,
                         ::testing::Values("gpt2", "llama", "llama_tied", "qwen2", "qwen3",
                                           "mistral", "mistral_nowindow"));

}  // namespace
}  // namespace weft::hf
