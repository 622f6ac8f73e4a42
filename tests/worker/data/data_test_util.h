// Shared by the tests of worker/data: token files made in memory, and a fixture whose tests
// write their input files into a fresh temporary folder.
#ifndef WEFT_TESTS_WORKER_DATA_DATA_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_DATA_DATA_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "weft/v1/job.pb.h"

namespace weft::data::testing {

// Appends `v` as 4 little-endian bytes.
inline void PutLe32(std::string* out, int32_t v) {
  for (int i = 0; i < 4; ++i) {
    out->push_back(static_cast<char>((static_cast<uint32_t>(v) >> (8 * i)) & 0xFF));
  }
}

// An llm.c token file of `Token`-wide tokens; header fields are parameters so tests can corrupt
// them.
template <typename Token>
std::string BinFileOf(const std::vector<Token>& tokens, int32_t magic, int32_t version,
                      int64_t count_override) {
  std::string out;
  PutLe32(&out, magic);
  PutLe32(&out, version);
  PutLe32(&out, static_cast<int32_t>(count_override >= 0 ? count_override : tokens.size()));
  for (int i = 3; i < 256; ++i) PutLe32(&out, 0);
  for (Token t : tokens) {
    for (size_t i = 0; i < sizeof(Token); ++i) {
      out.push_back(static_cast<char>((t >> (8 * i)) & 0xFF));
    }
  }
  return out;
}

inline std::string BinFile(const std::vector<uint16_t>& tokens, int32_t magic = 20240520,
                           int32_t version = 1, int64_t count_override = -1) {
  return BinFileOf(tokens, magic, version, count_override);
}

inline std::string Bin32File(const std::vector<uint32_t>& tokens, int32_t magic = 20240801,
                             int32_t version = 7, int64_t count_override = -1) {
  return BinFileOf(tokens, magic, version, count_override);
}

// Tokens from, from + 1, ..., from + n - 1: every token names its own position, so a sequence's
// first input is its start and tests can see exactly which region a sample came from.
inline std::vector<uint16_t> Iota(int n, int from = 0) {
  std::vector<uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(from + i);
  return v;
}

inline weft::v1::DataSpec Spec(const std::string& train, weft::v1::DataFormat format,
                               const std::string& val = "", double val_fraction = 0.0) {
  weft::v1::DataSpec spec;
  spec.set_train_path(train);
  spec.set_val_path(val);
  spec.set_format(format);
  spec.set_val_fraction(val_fraction);
  return spec;
}

class TempFilesTest : public ::testing::Test {
 protected:
  // Writes `contents` to the file `name` of the folder; returns its path.
  std::string Write(const std::string& name, const std::string& contents) {
    const std::string path = dir_.File(name);
    weft::testing::WriteFile(path, contents);
    return path;
  }

  weft::testing::TempDir dir_;
};

}  // namespace weft::data::testing

#endif  // WEFT_TESTS_WORKER_DATA_DATA_TEST_UTIL_H_
