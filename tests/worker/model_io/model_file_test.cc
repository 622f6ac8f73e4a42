// The trained-model file and sampling for Llama: a saved model loads back bit for bit under
// its architecture, samples deterministically (greedy sampling follows the model's own argmax),
// and a file that lacks a tensor its spec needs is refused naming it.
//
// And the tokenizer it records: the job's tokenizer is read from its spec (manifest,
// data.tokenizer_path, bytes, none) with every bad input named, a SentencePiece tokenizer
// survives SaveModel/LoadModel with its fingerprint, sampling encodes the prompt and decodes the
// output with it, and a model file whose tokenizer entry is corrupt is refused naming the file.
#include "worker/model_io/model_file.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "worker/data/manifest.h"
#include "worker/model_io/safetensors.h"
#include "worker/data/tokenizer.h"
#include "worker/engine/cpu/model.h"

namespace weft::model_io {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

weft::v1::JobSpec TinyLlamaSpec(bool tied) {
  weft::v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_intermediate_size(24);
  m->set_vocab_size(50);
  m->set_context_length(8);
  m->set_tie_word_embeddings(tied);
  return spec;
}

std::vector<std::vector<float>> InitialUnits(const engine::ModelArch& arch, uint64_t seed) {
  std::vector<std::vector<float>> units(arch.NumUnits());
  for (int u = 0; u < arch.NumUnits(); ++u) {
    units[u].resize(arch.UnitSize(u));
    arch.InitUnit(u, seed, units[u].data());
  }
  return units;
}

// The most likely next token of `tokens`: the last position's argmax over ids [0, vocab) (-1:
// the model's whole real vocabulary).
int32_t Argmax(const LoadedModel& model, const std::vector<int32_t>& tokens, int vocab = -1) {
  const engine::ModelArch& arch = *model.arch;
  const int t = static_cast<int>(tokens.size());
  auto cpu = *engine::cpu::CreateCpuModel(arch, 1, t, engine::Checkpointing::kNone);
  cpu->SetShape(1, t);
  cpu->EncoderForward(model.units[0].data(), tokens.data());
  for (int l = 0; l < arch.num_layers(); ++l) cpu->BlockForward(l, model.units[1 + l].data());
  cpu->ClassifierForward(model.units[0].data(), nullptr, 0.0f);
  const float* row = cpu->Logits() + static_cast<size_t>(t - 1) * arch.padded_vocab_size();
  const int n = vocab < 0 ? arch.vocab_size() : vocab;
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

TEST(ModelIoTest, LlamaSavesLoadsAndSamples) {
  weft::testing::TempDir dir;
  for (bool tied : {false, true}) {
    const weft::v1::JobSpec spec = TinyLlamaSpec(tied);
    auto arch = engine::MakeModelArch(spec.model());
    ASSERT_TRUE(arch.ok()) << arch.status();
    const std::vector<std::vector<float>> units = InitialUnits(**arch, 5);
    const std::string path = dir.File(tied ? "tied.safetensors" : "untied.safetensors");
    ASSERT_TRUE(SaveModel(path, spec, units).ok());

    auto loaded = LoadModel(path);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->arch->name(), "llama");
    EXPECT_EQ(loaded->units, units);
    EXPECT_EQ(loaded->arch->UnitTensors(0).size(), tied ? 2u : 3u);

    SampleOptions options;
    options.tokens = 12;  // past the context of 8: the window slides
    auto a = GenerateText(*loaded, "3 14 15", options);
    auto b = GenerateText(*loaded, "3 14 15", options);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(*a, *b);
    const std::vector<std::string> ids = absl::StrSplit(*a, ' ');
    ASSERT_EQ(ids.size(), 12u);
    for (const std::string& id : ids) {
      int v = -1;
      ASSERT_TRUE(absl::SimpleAtoi(id, &v)) << id;
      EXPECT_GE(v, 0);
      EXPECT_LT(v, 50);
    }

    options.temperature = 0;  // greedy
    options.tokens = 1;
    auto greedy = GenerateText(*loaded, "3 14 15", options);
    ASSERT_TRUE(greedy.ok());
    EXPECT_EQ(*greedy, std::to_string(Argmax(*loaded, {3, 14, 15})));

    EXPECT_THAT(GenerateText(*loaded, "3 50", options).status().message(),
                HasSubstr("token ids in [0, 50)"));
  }
}

TEST(ModelIoTest, LlamaFileWithoutItsLmHeadIsRefusedNamingIt) {
  weft::testing::TempDir dir;
  // The tensors of a tied model under a spec that says untied.
  const weft::v1::JobSpec tied = TinyLlamaSpec(true);
  auto arch = engine::MakeModelArch(tied.model());
  ASSERT_TRUE(arch.ok());
  const std::vector<std::vector<float>> units = InitialUnits(**arch, 6);
  std::vector<TensorData> tensors;
  for (int u = 0; u < (*arch)->NumUnits(); ++u) {
    for (const engine::TensorInfo& t : (*arch)->UnitTensors(u)) {
      tensors.push_back(
          {t.name, t.shape,
           std::vector<float>(units[u].begin() + t.offset, units[u].begin() + t.offset + t.size)});
    }
  }
  std::string untied_text;
  google::protobuf::TextFormat::PrintToString(TinyLlamaSpec(false), &untied_text);
  const std::string path = dir.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, {{"weft.job_spec", untied_text}}).ok());
  auto loaded = LoadModel(path);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("tensor lm_head missing"));
}

// The streamed file, written a unit at a time, is SaveModel's file byte for byte, and appears
// under its name only once committed.
TEST(ModelFileWriterTest, StreamsSaveModelsBytesAndAppearsOnlyOnCommit) {
  weft::testing::TempDir dir;
  weft::v1::JobSpec gpt2;
  gpt2.mutable_model()->set_num_layers(3);
  gpt2.mutable_model()->set_hidden_size(8);
  gpt2.mutable_model()->set_num_heads(2);
  gpt2.mutable_model()->set_vocab_size(11);
  gpt2.mutable_model()->set_context_length(6);
  for (const weft::v1::JobSpec& spec : {TinyLlamaSpec(false), TinyLlamaSpec(true), gpt2}) {
    auto arch = engine::MakeModelArch(spec.model());
    ASSERT_TRUE(arch.ok()) << arch.status();
    const std::vector<std::vector<float>> units = InitialUnits(**arch, 8);
    const std::string whole = dir.File("whole.safetensors");
    ASSERT_TRUE(SaveModel(whole, spec, units).ok());

    const std::string streamed = dir.File("streamed.safetensors");
    auto writer = ModelFileWriter::Begin(streamed, spec);
    ASSERT_TRUE(writer.ok()) << writer.status();
    for (int u = 0; u < (*arch)->NumUnits(); ++u) {
      ASSERT_TRUE((*writer)->WriteUnit(u, units[u]).ok());
      EXPECT_FALSE(std::filesystem::exists(streamed)) << "visible before commit";
    }
    ASSERT_TRUE((*writer)->Commit().ok());
    EXPECT_EQ(weft::testing::ReadFile(streamed), weft::testing::ReadFile(whole));
    // No temporary file is left beside them.
    EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 2);
    std::filesystem::remove(whole);
    std::filesystem::remove(streamed);
  }
}

TEST(ModelFileWriterTest, RefusesUnitsOutOfOrderOrMisSizedAndAnEarlyCommit) {
  weft::testing::TempDir dir;
  const weft::v1::JobSpec spec = TinyLlamaSpec(false);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  const std::vector<std::vector<float>> units = InitialUnits(**arch, 2);
  const std::string path = dir.File("model.safetensors");
  {
    auto writer = ModelFileWriter::Begin(path, spec);
    ASSERT_TRUE(writer.ok()) << writer.status();
    absl::Status s = (*writer)->WriteUnit(1, units[1]);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("unit 1 written out of order (next is 0 of 3)"));
    s = (*writer)->WriteUnit(0, units[1]);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("the model needs"));
    ASSERT_TRUE((*writer)->WriteUnit(0, units[0]).ok());
    s = (*writer)->Commit();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("commit after 1 of 3 units")));
  }
  // Dropped uncommitted: nothing is left, not even the temporary file.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));

  auto clash = ModelFileWriter::Begin(path, spec, {{"weft.job_spec", "x"}});
  EXPECT_EQ(clash.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(clash.status().message(), HasSubstr("weft.job_spec"));
  weft::v1::JobSpec bad = spec;
  bad.mutable_model()->set_num_kv_heads(3);
  EXPECT_EQ(ModelFileWriter::Begin(path, bad).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelFileWriter::Begin(dir.File("no/such/dir/m.safetensors"), spec).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

// Extra metadata goes in next to the spec, and the file loads like SaveModel's.
TEST(ModelFileWriterTest, ExtraMetadataIsWrittenAndTheFileLoads) {
  weft::testing::TempDir dir;
  const weft::v1::JobSpec spec = TinyLlamaSpec(true);
  auto arch = engine::MakeModelArch(spec.model());
  ASSERT_TRUE(arch.ok());
  const std::vector<std::vector<float>> units = InitialUnits(**arch, 4);
  const std::string path = dir.File("model.safetensors");
  auto writer = ModelFileWriter::Begin(path, spec, {{"weft.note", "streamed"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  for (int u = 0; u < (*arch)->NumUnits(); ++u) ASSERT_TRUE((*writer)->WriteUnit(u, units[u]).ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("weft.note"), "streamed");
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->units, units);
}

// ---------------------------------------------------------------------------------------
// The tokenizer a model records.

constexpr int kTokenizerVocab = 300;
// Larger than the tokenizer's, as a model declared with padding is: sampling must stay below
// the tokenizer's vocabulary.
constexpr int kModelVocab = 320;

std::string TrainTinyTokenizer() {
  data::SentencePieceTrainOptions options;
  options.vocab_size = kTokenizerVocab;
  const std::vector<std::string> lines = {
      "the cat sat on the mat and the dog sat on the log",
      "a fortune cookie says: you will write many tests today",
      "naïve café, déjà vu — Grüße aus Köln",
      "she sells sea shells by the sea shore",
  };
  for (int i = 0; i < 30; ++i) {
    std::string doc;
    for (size_t j = 0; j < lines.size(); ++j) absl::StrAppend(&doc, lines[(i + j) % 4], "\n");
    options.documents.push_back(doc);
  }
  absl::StatusOr<std::string> bytes = data::TrainSentencePiece(options);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *bytes : "";
}

weft::v1::JobSpec TinyGptSpec(int vocab) {
  weft::v1::JobSpec spec;
  google::protobuf::TextFormat::ParseFromString(
      absl::StrCat("model { num_layers: 1 hidden_size: 16 num_heads: 2 context_length: 16 "
                   "vocab_size: ", vocab, " }"),
      &spec);
  return spec;
}

// The spec's model with its initial parameters.
std::vector<std::vector<float>> InitialUnits(const weft::v1::JobSpec& spec) {
  auto arch = engine::MakeModelArch(spec.model());
  EXPECT_TRUE(arch.ok()) << arch.status();
  return InitialUnits(**arch, 7);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

class ModelTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_bytes_ = new std::string(TrainTinyTokenizer()); }
  static void TearDownTestSuite() { delete model_bytes_; }

  std::shared_ptr<const data::Tokenizer> Tokenizer() {
    auto tok = data::LoadSentencePieceFromBytes(*model_bytes_, "tiny");
    EXPECT_TRUE(tok.ok()) << tok.status();
    return std::move(*tok);
  }

  // A model saved with the tiny SentencePiece tokenizer, and its path.
  std::string SaveTinyModel() {
    const weft::v1::JobSpec spec = TinyGptSpec(kModelVocab);
    const std::string path = dir_.File("model.safetensors");
    EXPECT_TRUE(SaveModel(path, spec, InitialUnits(spec), Tokenizer().get()).ok());
    return path;
  }

  // The saved model's file with metadata `key` set to `value` ("" removes it).
  std::string RewriteMetadata(const std::string& key, const std::string& value) {
    auto file = ReadSafetensors(SaveTinyModel());
    EXPECT_TRUE(file.ok()) << file.status();
    if (value.empty()) {
      file->metadata.erase(key);
    } else {
      file->metadata[key] = value;
    }
    const std::string path = dir_.File("edited.safetensors");
    EXPECT_TRUE(WriteSafetensors(path, file->tensors, file->metadata).ok());
    return path;
  }

  static std::string* model_bytes_;
  weft::testing::TempDir dir_;
};
std::string* ModelTokenizerTest::model_bytes_ = nullptr;

TEST_F(ModelTokenizerTest, SentencePieceRoundTripsThroughTheModelFile) {
  const std::string path = SaveTinyModel();
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE(loaded->tokenizer, nullptr);
  EXPECT_EQ(loaded->tokenizer->kind(), "sentencepiece");
  EXPECT_EQ(loaded->tokenizer->fingerprint(), Tokenizer()->fingerprint());
  EXPECT_EQ(loaded->tokenizer->model_bytes(), *model_bytes_);
  EXPECT_EQ(loaded->tokenizer->vocab_size(), kTokenizerVocab);

  // The tokenizer is metadata, not a tensor: the file's tensors are the model's parameters.
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("weft.tokenizer.kind"), "sentencepiece");
  EXPECT_EQ(file->metadata.at("weft.tokenizer.crc32c"),
            data::FormatCrc32c(Tokenizer()->fingerprint()));
  for (const TensorData& t : file->tensors) EXPECT_THAT(t.name, Not(HasSubstr("tokenizer")));
}

// A Hugging Face tokenizer.json (tests/fixtures/tokenizers) is recorded as its own bytes
// and comes back as the same tokenizer, giving the same ids.
TEST_F(ModelTokenizerTest, TokenizerJsonRoundTripsThroughTheModelFile) {
  auto json = data::LoadTokenizerFromBytes(
      "tokenizer.json",
      weft::testing::ReadFile(std::string(WEFT_SOURCE_DIR) +
                              "/tests/fixtures/tokenizers/llama3.tokenizer.json"),
      "llama3", /*bos_id=*/0, /*eos_id=*/1);
  ASSERT_TRUE(json.ok()) << json.status();
  const weft::v1::JobSpec spec = TinyGptSpec((*json)->vocab_size() + 4);
  const std::string path = dir_.File("json.safetensors");
  ASSERT_TRUE(SaveModel(path, spec, InitialUnits(spec), json->get()).ok());
  auto loaded = LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE(loaded->tokenizer, nullptr);
  EXPECT_EQ(loaded->tokenizer->kind(), "tokenizer.json");
  EXPECT_EQ(loaded->tokenizer->model_bytes(), (*json)->model_bytes());
  // Its BOS and EOS, which the bytes do not hold, come back from the metadata.
  EXPECT_EQ(loaded->tokenizer->bos_id(), 0);
  EXPECT_EQ(loaded->tokenizer->eos_id(), 1);
  const char* text = "naïve café — <|eot_id|> 12345";
  EXPECT_EQ(loaded->tokenizer->Encode(text).value(), (*json)->Encode(text).value());

  // Its BOS and EOS entries, when corrupt, are refused naming the file and the key.
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& [key, value, says] :
       {std::tuple{"weft.tokenizer.eos_id", "one", "weft.tokenizer.eos_id is not an integer"},
        std::tuple{"weft.tokenizer.bos_id", "99999", "outside the vocabulary"}}) {
    auto edited = *file;
    edited.metadata[key] = value;
    const std::string bad = dir_.File("json-bad.safetensors");
    ASSERT_TRUE(WriteSafetensors(bad, edited.tensors, edited.metadata).ok());
    auto refused = LoadModel(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss) << key;
    EXPECT_THAT(refused.status().message(),
                AllOf(HasSubstr(bad), HasSubstr(says), HasSubstr("tokenizer entry is corrupt")))
        << key;
  }
}

TEST_F(ModelTokenizerTest, BytesAndNoTokenizerRoundTrip) {
  const weft::v1::JobSpec bytes_spec = TinyGptSpec(256);
  const std::string bytes_path = dir_.File("bytes.safetensors");
  ASSERT_TRUE(
      SaveModel(bytes_path, bytes_spec, InitialUnits(bytes_spec), data::MakeByteTokenizer().get())
          .ok());
  auto bytes = LoadModel(bytes_path);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_NE(bytes->tokenizer, nullptr);
  EXPECT_EQ(bytes->tokenizer->kind(), "bytes");

  const weft::v1::JobSpec ids_spec = TinyGptSpec(50);
  const std::string ids_path = dir_.File("ids.safetensors");
  ASSERT_TRUE(SaveModel(ids_path, ids_spec, InitialUnits(ids_spec)).ok());
  auto ids = LoadModel(ids_path);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->tokenizer, nullptr);

  // A model of 256 ids written before tokenizers were recorded reads and writes bytes.
  const std::string legacy_path = dir_.File("legacy.safetensors");
  ASSERT_TRUE(SaveModel(legacy_path, bytes_spec, InitialUnits(bytes_spec)).ok());
  auto legacy = LoadModel(legacy_path);
  ASSERT_TRUE(legacy.ok()) << legacy.status();
  ASSERT_NE(legacy->tokenizer, nullptr);
  EXPECT_EQ(legacy->tokenizer->kind(), "bytes");
}

TEST_F(ModelTokenizerTest, GenerateTextEncodesThePromptAndDecodesValidText) {
  auto loaded = LoadModel(SaveTinyModel());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const data::Tokenizer& tok = *loaded->tokenizer;
  const std::string prompt = "the café sat";
  const std::vector<int32_t> prompt_ids = *tok.Encode(prompt);
  ASSERT_GT(prompt_ids.size(), 1u);

  // Greedy, one token: the model's argmax after the tokenizer's own encoding of the prompt,
  // taken among the tokenizer's ids only; its text is what it adds to the prompt's (a leading
  // space kept, which SentencePiece drops from a text's first piece).
  SampleOptions greedy;
  greedy.temperature = 0;
  greedy.tokens = 1;
  auto one = GenerateText(*loaded, prompt, greedy);
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<int32_t> with_next = prompt_ids;
  with_next.push_back(Argmax(*loaded, prompt_ids, kTokenizerVocab));
  EXPECT_EQ(prompt + *one, tok.Decode(with_next));

  SampleOptions options;
  options.tokens = 40;  // past the context of 16: the window slides
  options.temperature = 1.0f;
  options.top_k = 0;
  auto text = GenerateText(*loaded, prompt, options);
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(data::FindInvalidUtf8(*text), std::nullopt) << *text;
  EXPECT_EQ(*GenerateText(*loaded, prompt, options), *text);  // deterministic for a seed
  EXPECT_FALSE(text->empty());
  // An empty prompt starts where documents start, after an EOS.
  auto empty = GenerateText(*loaded, "", options);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(data::FindInvalidUtf8(*empty), std::nullopt);

  auto bad = GenerateText(*loaded, "caf\xc3", options);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("--prompt"), HasSubstr("invalid UTF-8")));
}

TEST_F(ModelTokenizerTest, CorruptTokenizerEntryIsRefusedNamingTheFile) {
  const std::string good_b64 = absl::Base64Escape(*model_bytes_);
  const struct {
    std::string key, value, says;
  } cases[] = {
      {"weft.tokenizer.kind", "wordpiece", "weft.tokenizer.kind is \"wordpiece\""},
      {"weft.tokenizer.model", "", "weft.tokenizer.model is missing"},
      {"weft.tokenizer.model", "not base64 at all!", "weft.tokenizer.model is not base64"},
      {"weft.tokenizer.model", absl::Base64Escape("not a sentencepiece model"),
       "weft.tokenizer.model"},
      {"weft.tokenizer.model", good_b64.substr(0, good_b64.size() / 2 / 4 * 4),
       "weft.tokenizer.model"},
      {"weft.tokenizer.crc32c", "0x00000000", "but weft.tokenizer.crc32c says 0x00000000"},
      {"weft.tokenizer.crc32c", "", "weft.tokenizer.crc32c is missing"},
  };
  for (const auto& c : cases) {
    const std::string path = RewriteMetadata(c.key, c.value);
    auto loaded = LoadModel(path);
    ASSERT_FALSE(loaded.ok()) << c.key << " = " << c.value;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(loaded.status().message(),
                AllOf(HasSubstr(path), HasSubstr(c.says), HasSubstr("tokenizer entry is corrupt")))
        << c.key << " = " << c.value;
  }
}

TEST_F(ModelTokenizerTest, TokenizerLargerThanTheModelIsRefused) {
  const weft::v1::JobSpec spec = TinyGptSpec(kTokenizerVocab - 1);
  const absl::Status s =
      SaveModel(dir_.File("small.safetensors"), spec, InitialUnits(spec), Tokenizer().get());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("more than the model's vocabulary 299"));
}

TEST_F(ModelTokenizerTest, JobTokenizerFromTokenizerPath) {
  const std::string file = dir_.File("tok.model");
  WriteFile(file, *model_bytes_);
  weft::v1::JobSpec spec = TinyGptSpec(kModelVocab);
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_UINT16_BIN);
  spec.mutable_data()->set_tokenizer_path(file);
  auto tok = LoadJobTokenizer(spec);
  ASSERT_TRUE(tok.ok()) << tok.status();
  ASSERT_NE(*tok, nullptr);
  EXPECT_EQ((*tok)->fingerprint(), Tokenizer()->fingerprint());

  spec.mutable_model()->set_vocab_size(kTokenizerVocab - 1);
  auto small = LoadJobTokenizer(spec);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(small.status().message(),
              AllOf(HasSubstr("data.tokenizer_path"), HasSubstr(file),
                    HasSubstr("more than model.vocab_size 299")));

  spec.mutable_model()->set_vocab_size(kModelVocab);
  spec.mutable_data()->set_tokenizer_path(dir_.File("absent.model"));
  auto absent = LoadJobTokenizer(spec);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(),
              AllOf(HasSubstr("data.tokenizer_path"), HasSubstr(dir_.File("absent.model"))));

  const std::string garbage = dir_.File("garbage.model");
  WriteFile(garbage, "this is not a model");
  spec.mutable_data()->set_tokenizer_path(garbage);
  auto bad = LoadJobTokenizer(spec);
  EXPECT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), AllOf(HasSubstr("data.tokenizer_path"), HasSubstr(garbage)));

  spec.mutable_data()->set_tokenizer_path(file);
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_TEXT_BYTES);
  auto text_bytes = LoadJobTokenizer(spec);
  EXPECT_EQ(text_bytes.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(text_bytes.status().message(), HasSubstr("DATA_FORMAT_TEXT_BYTES"));
}

TEST_F(ModelTokenizerTest, JobTokenizerWithoutAFile) {
  weft::v1::JobSpec spec = TinyGptSpec(260);
  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_TEXT_BYTES);
  auto bytes = LoadJobTokenizer(spec);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_NE(*bytes, nullptr);
  EXPECT_EQ((*bytes)->kind(), "bytes");

  spec.mutable_data()->set_format(weft::v1::DATA_FORMAT_UINT16_BIN);
  auto none = LoadJobTokenizer(spec);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(*none, nullptr);

  spec.mutable_model()->set_vocab_size(256);
  auto bytes256 = LoadJobTokenizer(spec);
  ASSERT_TRUE(bytes256.ok()) << bytes256.status();
  ASSERT_NE(*bytes256, nullptr);
  EXPECT_EQ((*bytes256)->kind(), "bytes");
}

TEST_F(ModelTokenizerTest, JobTokenizerFromManifest) {
  const std::shared_ptr<const data::Tokenizer> tok = Tokenizer();
  WriteFile(dir_.File("tokenizer.model"), *model_bytes_);
  data::DatasetManifest m;
  m.token_format = weft::v1::DATA_FORMAT_UINT16_BIN;
  m.tokenizer = {"sentencepiece", "tokenizer.model", tok->fingerprint(), tok->vocab_size(),
                 tok->bos_id(), tok->eos_id()};
  m.document_separator = "eos";
  m.train = {{"train-00000.bin", 100, 1024 + 200, 0xdeadbeef}};  // never opened here
  m.train_documents = 1;
  m.sources = {{"/data/a.txt", 10, 1}};
  ASSERT_TRUE(data::WriteManifest(m, dir_.path()).ok());
  weft::v1::JobSpec spec = TinyGptSpec(kModelVocab);
  spec.mutable_data()->set_manifest_path(dir_.path());
  auto loaded = LoadJobTokenizer(spec);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_NE(*loaded, nullptr);
  EXPECT_EQ((*loaded)->fingerprint(), tok->fingerprint());

  // Replaced after the manifest was written: another valid model.
  data::SentencePieceTrainOptions other;
  other.vocab_size = kTokenizerVocab;
  other.documents = {std::string(2000, 'x') + "\nyet another corpus, quite unlike the first\n" +
                     "with its own words: zebra, quokka, narwhal, axolotl, pangolin\n"};
  auto other_bytes = data::TrainSentencePiece(other);
  ASSERT_TRUE(other_bytes.ok()) << other_bytes.status();
  WriteFile(dir_.File("tokenizer.model"), *other_bytes);
  auto changed = LoadJobTokenizer(spec);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(changed.status().message(),
              AllOf(HasSubstr("data.manifest_path"), HasSubstr(dir_.File("tokenizer.model")),
                    HasSubstr("changed after its manifest was written")));

  std::remove(dir_.File("tokenizer.model").c_str());
  auto missing = LoadJobTokenizer(spec);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_.File("tokenizer.model")));
}

}  // namespace
}  // namespace weft::model_io
