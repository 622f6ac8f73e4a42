// Import of Hugging Face directories: exact values on every world size and stage, each rank
// reading only about its share of the bytes, bit-identical round trips through export, and a
// named error for every broken input.
#include "worker/hf/hf_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/worker/hf/hf_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"
#include "worker/hf/hf_config.h"
#include "worker/hf/hf_export.h"
#include "worker/zero/shard_layout.h"
#include "worker/zero/zero_cpu.h"
#include "worker/zero/zero_engine.h"

namespace weft::hf {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::ArchOf;
using testing::ExactUnits;
using testing::TinyGpt2;
using testing::TinyLlama;
using testing::WriteHfDir;

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Total bytes of the tensors Weft maps, in `dtype`.
uint64_t MappedBytes(const engine::ModelArch& arch, model_io::Dtype dtype) {
  auto mapping = HfTensorMapping(arch);
  EXPECT_TRUE(mapping.ok());
  uint64_t total = 0;
  for (const HfTensorMap& m : *mapping) total += m.size() * model_io::DtypeBytes(dtype);
  return total;
}

struct LlamaCase {
  bool tied;
  model_io::Dtype dtype;
  uint64_t max_shard_bytes;
};

class LlamaImportTest : public ::testing::TestWithParam<LlamaCase> {};

// Each rank, with its own importer (as on its own machine), reads its stage-3 shard of every
// unit: the values are exactly the model's, the optimizer moments 0, and the bytes it reads
// are its share: summed over ranks, every mapped byte exactly once.
TEST_P(LlamaImportTest, EachRankReadsExactlyItsShare) {
  const LlamaCase c = GetParam();
  weft::testing::TempDir tmp;
  const weft::v1::ModelSpec spec = TinyLlama(c.tied);
  auto arch = ArchOf(spec);
  const auto units = ExactUnits(*arch, 3);
  const std::string dir = tmp.File("hf");
  WriteHfDir(dir, spec, units, c.dtype, c.max_shard_bytes);
  if (c.max_shard_bytes < 100000) ASSERT_TRUE(fs::exists(fs::path(dir) / kHfIndexFile));
  const size_t bytes = model_io::DtypeBytes(c.dtype);
  for (int world : {1, 2, 3}) {
    uint64_t sum = 0;
    for (int rank = 0; rank < world; ++rank) {
      auto importer = HfImporter::Open(dir, spec);
      ASSERT_TRUE(importer.ok()) << importer.status();
      const zero::ShardLayout layout(zero::UnitSizes(*arch), world, rank);
      const model_io::RangeReader read = (*importer)->Reader();
      uint64_t kept_bytes = 0;
      for (int u = 0; u < arch->NumUnits(); ++u) {
        const zero::ShardRange r = layout.KeptRange(u, 3);
        std::vector<float> got(r.size());
        ASSERT_TRUE(read(model_io::CheckpointTensorName(u, model_io::UnitState::kParams), r.begin,
                         r.end, got.data())
                        .ok());
        EXPECT_EQ(got, std::vector<float>(units[u].begin() + r.begin, units[u].begin() + r.end))
            << "world " << world << " rank " << rank << " unit " << u;
        std::vector<float> m(r.size(), 1.0f);
        ASSERT_TRUE(read(model_io::CheckpointTensorName(u, model_io::UnitState::kM), r.begin, r.end,
                         m.data())
                        .ok());
        EXPECT_EQ(m, std::vector<float>(r.size(), 0.0f));
        kept_bytes += r.size() * bytes;
      }
      const uint64_t read_bytes = (*importer)->checkpoint().bytes_read();
      EXPECT_LE(read_bytes, kept_bytes) << "world " << world << " rank " << rank;
      if (world > 1) EXPECT_LT(read_bytes, MappedBytes(*arch, c.dtype) * 2 / world);
      sum += read_bytes;
    }
    EXPECT_EQ(sum, MappedBytes(*arch, c.dtype)) << "world " << world;
  }
}

INSTANTIATE_TEST_SUITE_P(
    TiedDtypesShards, LlamaImportTest,
    ::testing::Values(LlamaCase{false, model_io::Dtype::kF32, 5'000'000'000},
                      LlamaCase{true, model_io::Dtype::kBF16, 5'000'000'000},
                      LlamaCase{false, model_io::Dtype::kF16, 3000},
                      LlamaCase{true, model_io::Dtype::kF32, 2000}));

weft::v1::JobSpec Gpt2Job(int stage) {
  weft::v1::JobSpec spec;
  *spec.mutable_model() = TinyGpt2();
  auto* t = spec.mutable_training();
  t->set_total_steps(1);
  t->set_micro_batch_size(1);
  t->set_sequence_length(8);
  t->set_seed(5);
  spec.set_zero_stage(stage);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

// `world` ranks of ZeroCpuEngine (threads, Gloo over loopback) restore from `dir`; returns the
// params assembled from their snapshots and each rank's bytes read.
void ImportIntoEngines(const std::string& dir, int world, int stage,
                       std::vector<std::vector<float>>* params, std::vector<uint64_t>* read) {
  const weft::v1::JobSpec spec = Gpt2Job(stage);
  auto arch = ArchOf(spec.model());
  params->assign(arch->NumUnits(), {});
  for (int u = 0; u < arch->NumUnits(); ++u) (*params)[u].assign(arch->UnitSize(u), -99.0f);
  read->assign(world, 0);
  MemoryStore store;
  std::vector<std::thread> threads;
  std::mutex mu;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = comm::CreateGlooCommunicator(&store, rank, world, {});
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto engine = zero::ZeroCpuEngine::Create(spec, comm->get());
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto importer = HfImporter::Open(dir, spec.model());
      ASSERT_TRUE(importer.ok()) << importer.status();
      const absl::Status restored = (*engine)->Restore((*importer)->Reader(), 0);
      ASSERT_TRUE(restored.ok()) << restored;
      auto slices = (*engine)->Snapshot();
      ASSERT_TRUE(slices.ok()) << slices.status();
      // No rank drops its connections while a peer may still be setting up.
      ASSERT_TRUE((*comm)->Barrier()->Wait().ok());
      std::lock_guard<std::mutex> lock(mu);
      (*read)[rank] = (*importer)->checkpoint().bytes_read();
      for (const model_io::UnitSlice& s : *slices) {
        std::copy(s.params.begin(), s.params.end(), (*params)[s.unit].begin() + s.begin);
        EXPECT_EQ(s.m, model_io::HostFloats(s.m.size(), 0.0f));
        EXPECT_EQ(s.v, model_io::HostFloats(s.v.size(), 0.0f));
      }
    });
  }
  for (auto& t : threads) t.join();
}

class Gpt2EngineImportTest : public ::testing::TestWithParam<std::tuple<int, int>> {};

// GPT-2's Conv1D weights are transposed on the way in; the engine holds exactly the model at
// any world size and stage.
TEST_P(Gpt2EngineImportTest, EngineHoldsTheHfValues) {
  const auto [world, stage] = GetParam();
  weft::testing::TempDir tmp;
  const weft::v1::ModelSpec spec = TinyGpt2();
  auto arch = ArchOf(spec);
  const auto units = ExactUnits(*arch, 11);
  const std::string dir = tmp.File("hf");
  WriteHfDir(dir, spec, units, model_io::Dtype::kBF16, /*max_shard_bytes=*/4096);
  std::vector<std::vector<float>> params;
  std::vector<uint64_t> read;
  ImportIntoEngines(dir, world, stage, &params, &read);
  EXPECT_EQ(params, units);
  const uint64_t all = MappedBytes(*arch, model_io::Dtype::kBF16);
  for (int rank = 0; rank < world; ++rank) {
    if (stage == 0) {
      EXPECT_EQ(read[rank], all) << "rank " << rank << " keeps everything at stage 0";
    } else {
      // A transposed block costs up to a row of Weft's layout at each end of the range.
      EXPECT_LT(read[rank], all / world + all / 8) << "rank " << rank;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldsAndStages, Gpt2EngineImportTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Values(0, 3)));

// Import, then export the imported parameters: the same bytes (fp32 -> fp32, bf16 -> bf16).
TEST(HfRoundTripTest, ImportThenExportIsBitIdentical) {
  for (const model_io::Dtype dtype : {model_io::Dtype::kF32, model_io::Dtype::kBF16}) {
    for (const weft::v1::ModelSpec& spec : {TinyGpt2(), TinyLlama(false), TinyLlama(true)}) {
      weft::testing::TempDir tmp;
      auto arch = ArchOf(spec);
      const std::string in = tmp.File("in");
      const std::string out = tmp.File("out");
      WriteHfDir(in, spec, ExactUnits(*arch, 5), dtype, /*max_shard_bytes=*/5000);
      auto importer = HfImporter::Open(in, spec);
      ASSERT_TRUE(importer.ok()) << importer.status();
      std::vector<std::vector<float>> units;
      for (int u = 0; u < arch->NumUnits(); ++u) {
        units.emplace_back(arch->UnitSize(u));
        ASSERT_TRUE((*importer)->ReadParams(u, 0, arch->UnitSize(u), units.back().data()).ok());
      }
      HfExportOptions options;
      options.dtype = dtype;
      options.max_shard_bytes = 5000;
      ASSERT_TRUE(ExportHf(out, spec, units, options).ok());
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(in)) names.push_back(e.path().filename());
      ASSERT_GT(names.size(), 3u) << "sharded: config, index and several files";
      for (const std::string& name : names) {
        EXPECT_EQ(ReadFileBytes(in + "/" + name), ReadFileBytes(out + "/" + name))
            << name << " " << model_io::DtypeName(dtype) << " " << arch->name();
      }
    }
  }
}

// What an exported directory holds: transformers' names, shapes without vocabulary padding,
// the GPT-2 transposes, the index's total size; and the export is atomic.
TEST(HfExportTest, NamesShapesIndexAndAtomicity) {
  weft::testing::TempDir tmp;
  const weft::v1::ModelSpec spec = TinyGpt2();
  auto arch = ArchOf(spec);
  const auto units = ExactUnits(*arch, 2);
  const std::string dir = tmp.File("hf");
  WriteHfDir(dir, spec, units, model_io::Dtype::kF32, /*max_shard_bytes=*/6000);
  auto index = nlohmann::json::parse(ReadFileBytes(dir + "/" + kHfIndexFile));
  const auto& map = index["weight_map"];
  EXPECT_EQ(map.size(), 4u + 12u * 2u);
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(),
            MappedBytes(*arch, model_io::Dtype::kF32));
  auto checkpoint = HfCheckpoint::Open(dir);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  const auto wte = (*checkpoint)->Find("transformer.wte.weight");
  ASSERT_NE(wte.tensor, nullptr);
  EXPECT_EQ(wte.tensor->shape, (std::vector<int64_t>{61, 16}));
  const auto c_attn = (*checkpoint)->Find("transformer.h.1.attn.c_attn.weight");
  ASSERT_NE(c_attn.tensor, nullptr);
  EXPECT_EQ(c_attn.tensor->shape, (std::vector<int64_t>{16, 48}));
  // HF (i, j) is Weft's qkvw (j, i): element (2, 5) of the file is row 5, column 2.
  const engine::TensorInfo qkvw = arch->UnitTensors(2)[engine::kQkvw];
  float value = 0;
  ASSERT_TRUE(c_attn.file->Read(*c_attn.tensor, 2 * 48 + 5, 2 * 48 + 6, &value).ok());
  EXPECT_EQ(value, units[2][qkvw.offset + 5 * 16 + 2]);
  EXPECT_EQ(nlohmann::json::parse(ReadFileBytes(dir + "/config.json"))["torch_dtype"], "float32");

  // Not over a directory that holds something; nothing temporary is left behind.
  const absl::Status again = ExportHf(dir, spec, units, {});
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(again.message(), HasSubstr(dir));
  int entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) entries += e.path() != dir;
  EXPECT_EQ(entries, 0);
  const absl::Status bad_units = ExportHf(tmp.File("x"), spec, {units[0]}, {});
  EXPECT_EQ(bad_units.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(tmp.File("x")));
}

// Llama's fused tensors are Hugging Face's stacked: k_proj's row 0 is qkvw's row C, up_proj's
// row 0 is gate_up's row I.
TEST(HfMappingTest, LlamaFusedTensorsStackHfRows) {
  auto arch = ArchOf(TinyLlama(false));
  auto mapping = HfTensorMapping(*arch);
  ASSERT_TRUE(mapping.ok());
  const engine::TensorInfo qkvw = arch->UnitTensors(1)[engine::kLlamaQkvw];
  const engine::TensorInfo gate_up = arch->UnitTensors(1)[engine::kLlamaGateUp];
  int found = 0;
  for (const HfTensorMap& m : *mapping) {
    if (m.name == "model.layers.0.self_attn.k_proj.weight") {
      EXPECT_EQ(m.offset, qkvw.offset + 16 * 16);
      EXPECT_EQ(m.shape, (std::vector<int64_t>{8, 16}));
      ++found;
    }
    if (m.name == "model.layers.0.mlp.up_proj.weight") {
      EXPECT_EQ(m.offset, gate_up.offset + 24 * 16);
      EXPECT_EQ(m.shape, (std::vector<int64_t>{24, 16}));
      ++found;
    }
    EXPECT_NE(m.name, "lm_head.weight.missing");
  }
  EXPECT_EQ(found, 2);
  auto tied = HfTensorMapping(*ArchOf(TinyLlama(true)));
  ASSERT_TRUE(tied.ok());
  EXPECT_EQ(tied->size(), mapping->size() - 1) << "no lm_head.weight when tied";
}

// --- errors: each names the file and the tensor or key ---

// A GPT-2 directory written tensor by tensor, so that tests can break one thing.
class HfImportErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = TinyGpt2();
    arch_ = ArchOf(spec_);
    units_ = ExactUnits(*arch_, 9);
    auto mapping = HfTensorMapping(*arch_);
    ASSERT_TRUE(mapping.ok());
    for (const HfTensorMap& m : *mapping) tensors_.push_back(HfTensorFromUnits(m, units_));
    dir_ = tmp_.File("hf");
    fs::create_directory(dir_);
    std::ofstream(dir_ + "/config.json") << HfConfigJson(spec_, model_io::Dtype::kF32);
  }

  void WriteWeights(const std::string& file = kHfSingleFile) {
    ASSERT_TRUE(model_io::WriteSafetensors(dir_ + "/" + file, tensors_, {}).ok());
  }

  void ExpectImportError(absl::StatusCode code, const std::vector<std::string>& parts) {
    auto importer = HfImporter::Open(dir_, spec_);
    ASSERT_FALSE(importer.ok());
    EXPECT_EQ(importer.status().code(), code) << importer.status();
    for (const std::string& part : parts) {
      EXPECT_THAT(importer.status().message(), HasSubstr(part));
    }
  }

  weft::testing::TempDir tmp_;
  weft::v1::ModelSpec spec_;
  std::unique_ptr<const engine::ModelArch> arch_;
  std::vector<std::vector<float>> units_;
  std::vector<model_io::TensorData> tensors_;
  std::string dir_;
};

TEST_F(HfImportErrorTest, GoodDirectoryImports) {
  WriteWeights();
  EXPECT_TRUE(HfImporter::Open(dir_, spec_).ok());
}

TEST_F(HfImportErrorTest, MissingDirectoryConfigOrWeights) {
  auto missing = HfImporter::Open(tmp_.File("nope"), spec_);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(tmp_.File("nope")));
  ExpectImportError(absl::StatusCode::kNotFound, {dir_, "model.safetensors", "index.json"});
  fs::remove(dir_ + "/config.json");
  WriteWeights();
  ExpectImportError(absl::StatusCode::kNotFound, {dir_ + "/config.json"});
}

TEST_F(HfImportErrorTest, MissingTensor) {
  tensors_.erase(tensors_.begin() + 5);
  const std::string name = HfTensorMapping(*arch_)->at(5).name;
  WriteWeights();
  ExpectImportError(absl::StatusCode::kInvalidArgument, {dir_, name, "missing"});
}

TEST_F(HfImportErrorTest, MisShapedTensor) {
  model_io::TensorData& wpe = tensors_[1];
  ASSERT_EQ(wpe.name, "transformer.wpe.weight");
  wpe.shape = {16, 8};
  WriteWeights();
  ExpectImportError(absl::StatusCode::kInvalidArgument,
                    {"model.safetensors", "transformer.wpe.weight", "[16, 8]", "[8, 16]"});
}

TEST_F(HfImportErrorTest, TensorWeftDoesNotUse) {
  tensors_.push_back({"transformer.h.0.attn.q_bias", {16}, std::vector<float>(16, 1.0f)});
  // Buffers that carry no weights are fine.
  tensors_.push_back({"transformer.h.0.attn.bias", {1}, {1.0f}});
  WriteWeights();
  ExpectImportError(absl::StatusCode::kInvalidArgument,
                    {"transformer.h.0.attn.q_bias", "not part of Weft's gpt2 model"});
}

TEST_F(HfImportErrorTest, TruncatedFile) {
  WriteWeights();
  fs::resize_file(dir_ + "/model.safetensors", fs::file_size(dir_ + "/model.safetensors") - 3);
  ExpectImportError(absl::StatusCode::kDataLoss, {dir_ + "/model.safetensors"});
}

TEST_F(HfImportErrorTest, UnknownDtype) {
  WriteWeights();
  const std::string header = R"({"transformer.wte.weight":{"dtype":"I8","shape":[1],)"
                             R"("data_offsets":[0,1]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  std::ofstream(dir_ + "/model.safetensors", std::ios::binary) << bytes << header << 'x';
  ExpectImportError(absl::StatusCode::kUnimplemented,
                    {"model.safetensors", "transformer.wte.weight", "unsupported dtype I8"});
}

TEST_F(HfImportErrorTest, IndexNamesAMissingFile) {
  WriteWeights("model-00001-of-00002.safetensors");
  std::ofstream(dir_ + "/" + kHfIndexFile)
      << R"({"weight_map": {"transformer.wte.weight": "model-00001-of-00002.safetensors",)"
      << R"( "transformer.wpe.weight": "model-00002-of-00002.safetensors"}})";
  ExpectImportError(absl::StatusCode::kNotFound,
                    {"model-00002-of-00002.safetensors", "transformer.wpe.weight"});
}

TEST_F(HfImportErrorTest, IndexPlacesATensorInTheWrongFile) {
  tensors_.erase(tensors_.begin() + 1);  // wpe
  WriteWeights("model-00001-of-00001.safetensors");
  std::ofstream(dir_ + "/" + kHfIndexFile)
      << R"({"weight_map": {"transformer.wpe.weight": "model-00001-of-00001.safetensors"}})";
  ExpectImportError(absl::StatusCode::kDataLoss,
                    {"model-00001-of-00001.safetensors", "has no tensor \"transformer.wpe.weight\"",
                     kHfIndexFile});
  std::ofstream(dir_ + "/" + kHfIndexFile) << R"({"weights": {}})";
  ExpectImportError(absl::StatusCode::kDataLoss, {kHfIndexFile, "weight_map"});
}

TEST_F(HfImportErrorTest, ConfigThatDoesNotMatchTheSpec) {
  WriteWeights();
  spec_.set_num_layers(3);
  ExpectImportError(absl::StatusCode::kInvalidArgument,
                    {dir_ + "/config.json", "model.num_layers is 3 but config.json n_layer is 2"});
}

TEST_F(HfImportErrorTest, NamesWithoutTheTransformerPrefix) {
  for (model_io::TensorData& t : tensors_) t.name = HfAlternateName(t.name);
  WriteWeights();
  auto importer = HfImporter::Open(dir_, spec_);
  ASSERT_TRUE(importer.ok()) << importer.status();
  std::vector<float> head(arch_->UnitSize(0));
  ASSERT_TRUE((*importer)->ReadParams(0, 0, head.size(), head.data()).ok());
  EXPECT_EQ(head, units_[0]);
}

}  // namespace
}  // namespace weft::hf
