#include "worker/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/random.h"

namespace weft::data {
namespace {

// llm.c's token file header: 256 int32 (1 KiB) so the tokens start aligned.
constexpr int64_t kBinHeaderInts = 256;
constexpr int64_t kBinHeaderBytes = kBinHeaderInts * 4;
constexpr int32_t kBinMagic = 20240520;
constexpr int32_t kBinVersion = 1;
constexpr double kDefaultValFraction = 0.1;
constexpr double kMaxValFraction = 0.5;

// Byte-wise little-endian reads: correct on any host, and compilers turn them into one load on
// little-endian machines.
inline uint16_t LoadLe16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline int32_t LoadLe32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                              (static_cast<uint32_t>(p[2]) << 16) |
                              (static_cast<uint32_t>(p[3]) << 24));
}

// A read-only private mapping of a whole file; unmapped on destruction unless released.
struct Mapping {
  void* base = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (base != nullptr) munmap(base, size);
  }
};

absl::Status MapFile(const std::string& path, Mapping* mapping) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": token file does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot open token file: ", std::strerror(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot stat token file: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": not a regular file (", S_ISDIR(st.st_mode) ? "a directory" : "a special file",
        "); a token file must be a regular file"));
  }
  if (st.st_size == 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": token file is empty"));
  }
  void* base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  // The mapping keeps the file referenced; the descriptor is no longer needed.
  close(fd);
  if (base == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot memory-map token file: ", std::strerror(err)));
  }
  mapping->base = base;
  mapping->size = static_cast<size_t>(st.st_size);
  return absl::OkStatus();
}

// Validates an llm.c header; on success sets the count of tokens after it.
absl::Status ParseBinHeader(const std::string& path, const Mapping& mapping, int64_t* count) {
  const auto* bytes = static_cast<const unsigned char*>(mapping.base);
  const int64_t size = static_cast<int64_t>(mapping.size);
  if (size < kBinHeaderBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": truncated uint16 token file: ", size, " bytes, but the header alone is ",
        kBinHeaderBytes, " bytes (256 x int32)"));
  }
  const int32_t magic = LoadLe32(bytes);
  if (magic != kBinMagic) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": bad magic number ", magic, " in uint16 token file header (expected ", kBinMagic,
        "); is this an llm.c .bin token file?"));
  }
  const int32_t version = LoadLe32(bytes + 4);
  if (version != kBinVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": unsupported uint16 token file version ", version, " (expected ",
                     kBinVersion, ")"));
  }
  const int32_t header_count = LoadLe32(bytes + 8);
  const int64_t data_bytes = size - kBinHeaderBytes;
  if (header_count < 0 || data_bytes != 2 * static_cast<int64_t>(header_count)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": size mismatch: header says ", header_count, " tokens (", 2LL * header_count,
        " bytes after the header) but the file has ", data_bytes,
        " bytes after the header; the file is truncated or corrupt"));
  }
  *count = header_count;
  return absl::OkStatus();
}

// Finds the first token >= vocab_size, so the error names a value and a place a person can
// look at (e.g. with `od`), rather than surfacing later as an out-of-range embedding row.
absl::Status CheckTokens(const std::string& path, const unsigned char* tokens, int token_bytes,
                         int64_t count, int vocab_size) {
  const int64_t max_storable = token_bytes == 1 ? 0xFF : 0xFFFF;
  if (vocab_size > max_storable) return absl::OkStatus();
  const auto limit = static_cast<uint32_t>(vocab_size);
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t value = token_bytes == 1 ? tokens[i] : LoadLe16(tokens + 2 * i);
    if (value >= limit) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": token ", value, " at token index ", i, " is out of range: vocab_size is ",
          vocab_size, " (tokens must be < vocab_size)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* SplitName(Split split) { return split == Split::kTrain ? "train" : "validation"; }

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const weft::v1::DataSpec& spec,
                                                                 int vocab_size, int seq_len,
                                                                 Split split) {
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sequence length must be >= 1, got ", seq_len));
  }
  if (vocab_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("vocab_size must be >= 1, got ", vocab_size));
  }
  int token_bytes = 0;
  switch (spec.format()) {
    case weft::v1::DATA_FORMAT_TEXT_BYTES: token_bytes = 1; break;
    case weft::v1::DATA_FORMAT_UINT16_BIN: token_bytes = 2; break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("data.format must be DATA_FORMAT_TEXT_BYTES or DATA_FORMAT_UINT16_BIN, got ",
                       weft::v1::DataFormat_Name(spec.format()).empty()
                           ? absl::StrCat(static_cast<int>(spec.format()))
                           : weft::v1::DataFormat_Name(spec.format())));
  }
  if (spec.train_path().empty()) {
    return absl::InvalidArgumentError("data.train_path is empty");
  }
  const bool held_out = spec.val_path().empty();
  double val_fraction = spec.val_fraction();
  if (held_out) {
    if (val_fraction == 0.0) val_fraction = kDefaultValFraction;
    // The negated comparison also rejects NaN.
    if (!(val_fraction >= 0.0 && val_fraction <= kMaxValFraction)) {
      return absl::InvalidArgumentError(absl::StrCat("data.val_fraction must be in [0, ",
                                                     kMaxValFraction, "], got ", val_fraction));
    }
  }

  auto dataset = std::unique_ptr<TokenDataset>(new TokenDataset());
  dataset->path_ = (split == Split::kVal && !held_out) ? spec.val_path() : spec.train_path();
  dataset->split_ = split;
  dataset->seq_len_ = seq_len;
  dataset->token_bytes_ = token_bytes;
  const std::string& path = dataset->path_;

  Mapping mapping;
  WEFT_RETURN_IF_ERROR(MapFile(path, &mapping));
  const auto* bytes = static_cast<const unsigned char*>(mapping.base);
  int64_t file_tokens = 0;
  const unsigned char* tokens = bytes;
  if (token_bytes == 1) {
    file_tokens = static_cast<int64_t>(mapping.size);
  } else {
    WEFT_RETURN_IF_ERROR(ParseBinHeader(path, mapping, &file_tokens));
    tokens = bytes + kBinHeaderBytes;
  }
  WEFT_RETURN_IF_ERROR(CheckTokens(path, tokens, token_bytes, file_tokens, vocab_size));

  int64_t first = 0;
  int64_t count = file_tokens;
  std::string what = "the file";
  if (held_out) {
    // Floor, so the held-out tail never exceeds the requested fraction.
    const auto val_tokens =
        static_cast<int64_t>(std::floor(static_cast<double>(file_tokens) * val_fraction));
    if (split == Split::kTrain) {
      count = file_tokens - val_tokens;
      what = absl::StrCat("the train split (the first ", 100.0 * (1.0 - val_fraction), "% of the ",
                          file_tokens, " tokens)");
    } else {
      first = file_tokens - val_tokens;
      count = val_tokens;
      what = absl::StrCat("the validation split (the last ", 100.0 * val_fraction, "% of the ",
                          file_tokens, " tokens)");
    }
  }
  if (count < static_cast<int64_t>(seq_len) + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": too short: ", what, " has ", count, " tokens, but one sequence of seq_len ",
        seq_len, " needs ", static_cast<int64_t>(seq_len) + 1, " (seq_len + 1 for the targets)"));
  }

  dataset->map_base_ = std::exchange(mapping.base, nullptr);
  dataset->map_size_ = mapping.size;
  dataset->tokens_ = tokens + first * token_bytes;
  dataset->num_tokens_ = count;
  dataset->first_token_index_ = first;
  return dataset;
}

TokenDataset::~TokenDataset() {
  if (map_base_ != nullptr) munmap(map_base_, map_size_);
}

int32_t TokenDataset::Token(int64_t i) const {
  assert(i >= 0 && i < num_tokens_);
  return token_bytes_ == 1 ? tokens_[i] : LoadLe16(tokens_ + 2 * i);
}

int64_t TokenDataset::SequenceStart(uint64_t seed, int64_t step, int micro_step,
                                    int64_t global_index) const {
  uint64_t h = Mix64(seed);
  h = HashCombine(h, static_cast<uint64_t>(step));
  h = HashCombine(h, static_cast<uint64_t>(micro_step));
  h = HashCombine(h, static_cast<uint64_t>(global_index));
  // Modulo bias is at most range / 2^64: immeasurable for any real file.
  const auto range = static_cast<uint64_t>(num_tokens_ - seq_len_);
  return static_cast<int64_t>(h % range);
}

void TokenDataset::Batch(uint64_t seed, int64_t step, int micro_step, int rank, int world_size,
                         int batch_size, int32_t* inputs, int32_t* targets) const {
  assert(world_size >= 1 && rank >= 0 && rank < world_size);
  assert(batch_size >= 1 && step >= 0 && micro_step >= 0);
  const int64_t t_len = seq_len_;
  for (int b = 0; b < batch_size; ++b) {
    const int64_t global_index = static_cast<int64_t>(rank) * batch_size + b;
    const int64_t start = SequenceStart(seed, step, micro_step, global_index);
    int32_t* in = inputs + b * t_len;
    int32_t* out = targets + b * t_len;
    // Specialized per width so the inner loops are branch-free copies.
    if (token_bytes_ == 1) {
      const unsigned char* p = tokens_ + start;
      for (int64_t t = 0; t < t_len; ++t) {
        in[t] = p[t];
        out[t] = p[t + 1];
      }
    } else {
      const unsigned char* p = tokens_ + 2 * start;
      for (int64_t t = 0; t < t_len; ++t) {
        in[t] = LoadLe16(p + 2 * t);
        out[t] = LoadLe16(p + 2 * t + 2);
      }
    }
  }
}

}  // namespace weft::data
