#include "worker/model_io/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/data/data_test_util.h"

namespace weft::model_io {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Le64(uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
  return out;
}

// Little-endian bytes of floats, spelled out independently of the writer.
std::string F32Bytes(const std::vector<float>& values) {
  std::string out;
  for (float f : values) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  }
  return out;
}

// A safetensors file from a literal header and data section (header length = header.size()).
std::string RawFile(const std::string& header, const std::string& data) {
  return Le64(header.size()) + header + data;
}

std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

class SafetensorsTest : public data::testing::TempFilesTest {
 protected:
  // Reads `contents` as a file and expects `code` with a message naming the file and `what`.
  void ExpectError(const std::string& contents, absl::StatusCode code, const std::string& what) {
    const std::string path = Write("bad.safetensors", contents);
    auto file = ReadSafetensors(path);
    EXPECT_EQ(file.status().code(), code) << file.status();
    EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr(what)));
  }
};

TEST_F(SafetensorsTest, ExactBytesOfOneSmallTensor) {
  const std::string path = dir_.File("one.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", {2}, {1.0f, -2.0f}}}, {{"k", "v"}}).ok());
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"k":"v"}})";
  ASSERT_EQ(header.size(), 79u);
  // 79 -> padded with one space to 80; 1.0f = 0x3F800000, -2.0f = 0xC0000000.
  const std::string expected = Le64(80) + header + " " +
                               std::string("\x00\x00\x80\x3F\x00\x00\x00\xC0", 8);
  EXPECT_EQ(weft::testing::ReadFile(path), expected);
}

TEST_F(SafetensorsTest, RoundTrip) {
  std::vector<TensorData> tensors = {
      {"wte", {4, 3}, {}},
      {"scalar", {}, {3.25f}},
      {"empty", {0, 5}, {}},
      {"h.0.ln_1.bias", {5}, {-0.0f, 1e-38f, std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::infinity(), -1.5f}},
  };
  for (int i = 0; i < 12; ++i) tensors[0].data.push_back(0.1f * static_cast<float>(i) - 0.5f);
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"}, {"weft.step", "1200"}, {"spec", "{\"quoted\": \"json\"}\nline2"}};
  const std::string path = dir_.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  // The data section starts 8-byte aligned.
  const std::string bytes = weft::testing::ReadFile(path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  EXPECT_EQ(n % 8, 0u);

  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata, metadata);
  ASSERT_EQ(file->tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file->tensors[i].name, tensors[i].name);
    EXPECT_EQ(file->tensors[i].shape, tensors[i].shape);
    ASSERT_EQ(file->tensors[i].data.size(), tensors[i].data.size());
    // Bit-exact, -0.0 included.
    EXPECT_EQ(std::memcmp(file->tensors[i].data.data(), tensors[i].data.data(),
                          tensors[i].data.size() * sizeof(float)),
              0)
        << tensors[i].name;
  }
}

TEST_F(SafetensorsTest, NoMetadataAndNoTensors) {
  const std::string path = dir_.File("empty.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {}, {}).ok());
  EXPECT_EQ(weft::testing::ReadFile(path), Le64(8) + "{}      ");
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE(file->tensors.empty());
  EXPECT_TRUE(file->metadata.empty());
}

TEST_F(SafetensorsTest, ReadsForeignKeyOrderAndReturnsLayoutOrder) {
  // Metadata first, keys not in data order, extra whitespace: as other writers produce.
  const std::string header =
      R"({"__metadata__": {"format": "pt"}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},)"
      R"( "a": {"shape": [1], "data_offsets": [0, 4], "dtype": "F32"}}   )";
  const std::string path = Write("foreign.safetensors", RawFile(header, F32Bytes({1.0f, 2.0f})));
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 2u);
  EXPECT_EQ(file->tensors[0].name, "a");
  EXPECT_THAT(file->tensors[0].data, ElementsAre(1.0f));
  EXPECT_EQ(file->tensors[1].name, "b");
  EXPECT_THAT(file->tensors[1].data, ElementsAre(2.0f));
  EXPECT_EQ(file->metadata.at("format"), "pt");
}

TEST_F(SafetensorsTest, OverwriteIsAtomicAndLeavesNoTemporaryFiles) {
  const std::string path = dir_.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", {1}, {1.0f}}}, {}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"y", {2}, {2.0f, 3.0f}}}, {}).ok());
  auto file = ReadSafetensors(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors.size(), 1u);
  EXPECT_EQ(file->tensors[0].name, "y");
  EXPECT_THAT(DirEntries(dir_.path()), ElementsAre("model.safetensors"));
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                std::filesystem::perms::group_read | std::filesystem::perms::others_read);
}

// ---- Write errors: nothing is created, an existing file is kept. ----

TEST_F(SafetensorsTest, WriteRejectsBadTensors) {
  const std::string path = dir_.File("out.safetensors");
  auto expect = [&](const std::vector<TensorData>& tensors, const std::string& what) {
    const absl::Status s = WriteSafetensors(path, tensors, {});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << what;
    EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr(what)));
  };
  expect({{"w", {2, 3}, {1, 2, 3, 4, 5}}}, "shape [2, 3] has 6 elements but data has 5");
  expect({{"w", {-1}, {}}}, "negative dimension -1");
  expect({{"", {1}, {1}}}, "empty name");
  expect({{"w", {1}, {1}}, {"w", {1}, {2}}}, "duplicate tensor name \"w\"");
  expect({{"__metadata__", {1}, {1}}}, "reserved");
  expect({{"bad\xFF", {1}, {1}}}, "not valid UTF-8");
  EXPECT_TRUE(DirEntries(dir_.path()).empty());
}

TEST_F(SafetensorsTest, FailedWriteKeepsTheOldFile) {
  const std::string path = dir_.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"x", {1}, {1.0f}}}, {}).ok());
  const std::string before = weft::testing::ReadFile(path);
  EXPECT_FALSE(WriteSafetensors(path, {{"x", {2}, {1.0f}}}, {}).ok());
  EXPECT_EQ(weft::testing::ReadFile(path), before);
  EXPECT_THAT(DirEntries(dir_.path()), ElementsAre("model.safetensors"));
}

TEST_F(SafetensorsTest, WriteIntoMissingDirectory) {
  const std::string path = dir_.File("no/such/dir/model.safetensors");
  const absl::Status s = WriteSafetensors(path, {{"x", {1}, {1.0f}}}, {});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(s.message(), HasSubstr(path));
}

// ---- Read errors: every corruption is named. ----

TEST_F(SafetensorsTest, MissingFile) {
  const std::string path = dir_.File("nope.safetensors");
  auto file = ReadSafetensors(path);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), AllOf(HasSubstr(path), HasSubstr("does not exist")));
}

TEST_F(SafetensorsTest, Directory) {
  auto file = ReadSafetensors(dir_.path());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(file.status().message(), HasSubstr("not a regular file"));
}

TEST_F(SafetensorsTest, TruncatedLength) {
  ExpectError("", absl::StatusCode::kDataLoss, "truncated: 0 bytes");
  ExpectError(std::string("\x10\x00\x00", 3), absl::StatusCode::kDataLoss,
              "less than the 8-byte header length");
}

TEST_F(SafetensorsTest, TruncatedHeader) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  ExpectError(Le64(header.size()) + header.substr(0, 20), absl::StatusCode::kDataLoss,
              "header length is 54 bytes but only 20 bytes follow");
}

TEST_F(SafetensorsTest, HugeHeaderLength) {
  ExpectError(Le64(1ull << 62) + "{}", absl::StatusCode::kDataLoss, "truncated: header length");
}

TEST_F(SafetensorsTest, TruncatedData) {
  const std::string path = dir_.File("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"a", {4}, {1, 2, 3, 4}}}, {}).ok());
  const std::string full = weft::testing::ReadFile(path);
  ExpectError(full.substr(0, full.size() - 3), absl::StatusCode::kDataLoss,
              "tensor \"a\": data_offsets [0, 16] out of range: the data section has 13 bytes");
}

TEST_F(SafetensorsTest, BadHeaderJson) {
  ExpectError(RawFile(R"({"a": {"dtype": )", ""), absl::StatusCode::kDataLoss,
              "header is not valid JSON");
  ExpectError(RawFile("[1, 2]", ""), absl::StatusCode::kDataLoss, "header JSON is not an object");
}

TEST_F(SafetensorsTest, MalformedEntries) {
  ExpectError(RawFile(R"({"a": 5})", ""), absl::StatusCode::kDataLoss,
              "tensor \"a\": header entry is not a JSON object");
  ExpectError(RawFile(R"({"a": {"shape": [1], "data_offsets": [0, 4]}})", F32Bytes({1})),
              absl::StatusCode::kDataLoss, "missing or non-string \"dtype\"");
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "data_offsets": [0, 4]}})", F32Bytes({1})),
              absl::StatusCode::kDataLoss, "missing or non-array \"shape\"");
  ExpectError(
      RawFile(R"({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}})", F32Bytes({1})),
      absl::StatusCode::kDataLoss, "\"shape\" must hold non-negative integers");
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0]}})",
                      F32Bytes({1})),
              absl::StatusCode::kDataLoss, "\"data_offsets\" must be [begin, end]");
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [0], "data_offsets": [4, 0]}})",
                      F32Bytes({1})),
              absl::StatusCode::kDataLoss, "end before they begin");
  ExpectError(RawFile(R"({"__metadata__": {"step": 5}})", ""), absl::StatusCode::kDataLoss,
              "__metadata__ value of \"step\" is not a string");
  ExpectError(RawFile(R"({"__metadata__": [1]})", ""), absl::StatusCode::kDataLoss,
              "\"__metadata__\" is not a JSON object");
}

TEST_F(SafetensorsTest, UnsupportedDtype) {
  ExpectError(RawFile(R"({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}})",
                      std::string(4, '\0')),
              absl::StatusCode::kUnimplemented,
              "tensor \"a\": unsupported dtype BF16; only F32 is supported");
}

TEST_F(SafetensorsTest, ShapeSizeMismatch) {
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}})",
                      F32Bytes({1, 2, 3})),
              absl::StatusCode::kDataLoss,
              "tensor \"a\": shape/size mismatch: shape [2, 2] of F32 needs 16 bytes, but "
              "data_offsets [0, 12] span 12");
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                      F32Bytes({1, 2})),
              absl::StatusCode::kDataLoss, "data_offsets [8, 12] out of range");
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                      R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
                      F32Bytes({1, 2, 3})),
              absl::StatusCode::kDataLoss, "tensors \"a\" and \"b\" overlap");
}

TEST_F(SafetensorsTest, GapBetweenTensors) {
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
                      R"( "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})",
                      F32Bytes({1, 2, 3})),
              absl::StatusCode::kDataLoss, "gap in the data section: bytes [4, 8)");
}

TEST_F(SafetensorsTest, TrailingBytes) {
  ExpectError(RawFile(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",
                      F32Bytes({1, 2})),
              absl::StatusCode::kDataLoss, "the data section has 8 bytes but the tensors cover only 4");
}

// --- SafetensorsReader (memory-mapped, element ranges) and the BF16 / F16 writer ---

// Little-endian bytes of 16-bit patterns.
std::string U16Bytes(const std::vector<uint16_t>& values) {
  std::string out;
  for (uint16_t v : values) {
    out.push_back(static_cast<char>(v & 0xFF));
    out.push_back(static_cast<char>(v >> 8));
  }
  return out;
}

TEST_F(SafetensorsTest, ReaderConvertsEachDtypeAndReadsOnlyTheRange) {
  // bf16 0x3F80 = 1, 0xC000 = -2, 0x3EAB ~ 0.333984375; f16 0x3C00 = 1, 0xC000 = -2,
  // 0x0001 = 2^-24 (the smallest subnormal), 0x7C00 = inf.
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 12]},)"
      R"( "b": {"dtype": "BF16", "shape": [3], "data_offsets": [12, 18]},)"
      R"( "c": {"dtype": "F16", "shape": [2, 2], "data_offsets": [18, 26]}})";
  const std::string path =
      Write("m.safetensors", RawFile(header, F32Bytes({1.5f, -0.25f, 7}) +
                                                 U16Bytes({0x3F80, 0xC000, 0x3EAB}) +
                                                 U16Bytes({0x3C00, 0xC000, 0x0001, 0x7C00})));
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const SafetensorsReader& r = **reader;
  ASSERT_EQ(r.tensors().size(), 3u);
  EXPECT_EQ(r.bytes_read(), 0u);
  const SafetensorsReader::Tensor* c = r.Find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, Dtype::kF16);
  EXPECT_THAT(c->shape, ElementsAre(2, 2));
  EXPECT_EQ(r.Find("nope"), nullptr);

  float out[4] = {};
  ASSERT_TRUE(r.Read(*r.Find("a"), 1, 3, out).ok());
  EXPECT_THAT(std::vector<float>(out, out + 2), ElementsAre(-0.25f, 7.0f));
  EXPECT_EQ(r.bytes_read(), 8u);
  ASSERT_TRUE(r.Read(*r.Find("b"), 0, 3, out).ok());
  EXPECT_THAT(std::vector<float>(out, out + 3), ElementsAre(1.0f, -2.0f, 0.333984375f));
  EXPECT_EQ(r.bytes_read(), 14u);
  ASSERT_TRUE(r.Read(*c, 1, 4, out).ok());
  EXPECT_EQ(out[0], -2.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(out[2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(r.bytes_read(), 20u);

  const absl::Status bad = r.Read(*c, 2, 5, out);
  EXPECT_EQ(bad.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(bad.message(), AllOf(HasSubstr(path), HasSubstr("tensor \"c\"")));
}

TEST_F(SafetensorsTest, ReaderAppliesTheSameStrictChecks) {
  const std::string truncated = Write(
      "t.safetensors",
      RawFile(R"({"a": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]}})", U16Bytes({1})));
  auto r = SafetensorsReader::Open(truncated);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr(truncated), HasSubstr("out of range")));

  const std::string mismatch = Write(
      "s.safetensors",
      RawFile(R"({"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 4]}})", U16Bytes({1, 2})));
  r = SafetensorsReader::Open(mismatch);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr("shape [3] of F16 needs 6 bytes"));

  const std::string i64 = Write(
      "i.safetensors",
      RawFile(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", Le64(3)));
  r = SafetensorsReader::Open(i64);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr(i64), HasSubstr("tensor \"a\": unsupported dtype I64")));

  r = SafetensorsReader::Open(dir_.File("missing.safetensors"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SafetensorsTest, WritesBf16AndF16RoundingToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1). 1 + 3 * 2^-8 is halfway
  // between 1 + 2^-7 and 1 + 2^-6: ties to even (1 + 2^-6). 1 + 2^-8 + 2^-20 rounds up.
  const std::vector<float> values = {1.0f + std::ldexp(1.0f, -8), 1.0f + 3 * std::ldexp(1.0f, -8),
                                     1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20), -3.0f,
                                     std::numeric_limits<float>::quiet_NaN()};
  const std::string bf16 = dir_.File("b.safetensors");
  ASSERT_TRUE(WriteSafetensors(bf16, {{"x", {5}, values}}, {}, Dtype::kBF16).ok());
  auto r = SafetensorsReader::Open(bf16);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->tensors()[0].dtype, Dtype::kBF16);
  std::vector<float> out(5);
  ASSERT_TRUE((*r)->Read((*r)->tensors()[0], 0, 5, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(out[2], 1.0f + std::ldexp(1.0f, -7));
  EXPECT_EQ(out[3], -3.0f);
  EXPECT_TRUE(std::isnan(out[4]));

  // f16 has 10 mantissa bits: 1 + 2^-11 ties to 1; 65520 overflows to infinity.
  const std::string f16 = dir_.File("h.safetensors");
  ASSERT_TRUE(WriteSafetensors(f16, {{"y", {3}, {1.0f + std::ldexp(1.0f, -11), 65520.0f, 0.5f}}},
                               {{"format", "pt"}}, Dtype::kF16)
                  .ok());
  r = SafetensorsReader::Open(f16);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->metadata().at("format"), "pt");
  ASSERT_TRUE((*r)->Read((*r)->tensors()[0], 0, 3, out.data()).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[2], 0.5f);
  // The whole-file F32 reader keeps refusing other dtypes.
  EXPECT_EQ(ReadSafetensors(f16).status().code(), absl::StatusCode::kUnimplemented);
}

// ---- The streaming writer ----

// Data fed in pieces that end mid-tensor and span tensors gives WriteSafetensors' bytes, in
// every dtype; until Commit only a temporary file exists.
TEST_F(SafetensorsTest, StreamedPiecesGiveWriteSafetensorsBytes) {
  const std::vector<TensorData> tensors = {
      {"a", {2, 3}, {1, 2, 3, 4, 5, 6}},
      {"b", {}, {7}},
      {"c", {0}, {}},
      {"d", {4}, {8, 9, 10, 11}}};
  std::vector<TensorHeader> headers;
  std::vector<float> data;
  for (const TensorData& t : tensors) {
    headers.push_back({t.name, t.shape});
    data.insert(data.end(), t.data.begin(), t.data.end());
  }
  for (Dtype dtype : {Dtype::kF32, Dtype::kBF16, Dtype::kF16}) {
    const std::string whole = dir_.File("whole.safetensors");
    ASSERT_TRUE(WriteSafetensors(whole, tensors, {{"k", "v"}}, dtype).ok());
    const std::string path = dir_.File("streamed.safetensors");
    auto writer = SafetensorsWriter::Begin(path, headers, {{"k", "v"}}, dtype);
    ASSERT_TRUE(writer.ok()) << writer.status();
    const size_t cuts[] = {0, 4, 5, 9, data.size()};  // [5, 9) spans the end of a, b, c and d
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE((*writer)->Append(data.data() + cuts[i], cuts[i + 1] - cuts[i]).ok());
    }
    EXPECT_FALSE(std::filesystem::exists(path));
    ASSERT_EQ(DirEntries(dir_.path()).size(), 2u);  // whole and the temporary file
    ASSERT_TRUE((*writer)->Commit().ok());
    EXPECT_EQ(weft::testing::ReadFile(path), weft::testing::ReadFile(whole));
    EXPECT_THAT(DirEntries(dir_.path()),
                ElementsAre("streamed.safetensors", "whole.safetensors"));
    EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
    std::filesystem::remove(whole);
    std::filesystem::remove(path);
  }
}

TEST_F(SafetensorsTest, StreamedWriteRefusesTooMuchOrTooLittleDataAndLeavesNothing) {
  const std::string path = dir_.File("out.safetensors");
  const std::vector<float> five = {1, 2, 3, 4, 5};
  {
    auto writer = SafetensorsWriter::Begin(path, {{"x", {2, 2}}}, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    absl::Status s = (*writer)->Append(five.data(), 5);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("announced only 4 more")));
    ASSERT_TRUE((*writer)->Append(five.data(), 3).ok());
    s = (*writer)->Commit();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.message(), HasSubstr("1 elements the header announced still unwritten"));
  }
  // Destroyed without a commit: the temporary file is gone too.
  EXPECT_TRUE(DirEntries(dir_.path()).empty());
  auto bad = SafetensorsWriter::Begin(path, {{"x", {1}}, {"x", {1}}}, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("duplicate tensor name \"x\""));
  bad = SafetensorsWriter::Begin(dir_.File("no/such/dir/x.safetensors"), {{"x", {1}}}, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(DirEntries(dir_.path()).empty());
}

}  // namespace
}  // namespace weft::model_io
