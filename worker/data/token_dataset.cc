#include "worker/data/token_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/data/random.h"

namespace weft::data {
namespace {

// llm.c's token file header: 256 int32 (1 KiB) so the tokens start aligned.
constexpr int64_t kBinHeaderInts = 256;
constexpr int64_t kBinHeaderBytes = kBinHeaderInts * 4;
constexpr double kDefaultValFraction = 0.1;
constexpr double kMaxValFraction = 0.5;

// The two llm.c token files differ only in these; the magic tells them apart, so a file opened
// with the other format's DataFormat is named as such rather than called corrupt.
struct BinFormat {
  const char* name;  // for messages: "uint16", "uint32"
  weft::v1::DataFormat format;
  int32_t magic;
  int32_t version;
  int token_bytes;
};
constexpr BinFormat kUint16Bin{"uint16", weft::v1::DATA_FORMAT_UINT16_BIN, 20240520, 1, 2};
constexpr BinFormat kUint32Bin{"uint32", weft::v1::DATA_FORMAT_UINT32_BIN, 20240801, 7, 4};

// Little-endian reads: one plain load on little-endian hosts (so the scans below vectorise),
// byte by byte elsewhere.
template <typename T>
inline T LoadLe(const unsigned char* p) {
  if constexpr (std::endian::native == std::endian::little) {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return v;
  } else {
    T v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(static_cast<T>(p[i]) << (8 * i));
    return v;
  }
}
inline int32_t LoadLe32(const unsigned char* p) {
  return static_cast<int32_t>(LoadLe<uint32_t>(p));
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

// Validates an llm.c header of `format`; on success sets the count of tokens after it.
absl::Status ParseBinHeader(const std::string& path, const Mapping& mapping,
                            const BinFormat& format, int64_t* count) {
  const auto* bytes = static_cast<const unsigned char*>(mapping.base);
  const int64_t size = static_cast<int64_t>(mapping.size);
  const std::string what = absl::StrCat(format.name, " token file (",
                                        weft::v1::DataFormat_Name(format.format), ")");
  if (size < kBinHeaderBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": truncated ", what, ": ", size, " bytes, but the header alone is ",
        kBinHeaderBytes, " bytes (256 x int32)"));
  }
  const int32_t magic = LoadLe32(bytes);
  if (magic != format.magic) {
    const BinFormat& other = format.magic == kUint16Bin.magic ? kUint32Bin : kUint16Bin;
    if (magic == other.magic) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, ": magic number ", magic, " marks a ", other.name,
          " token file, but data.format is ",
          weft::v1::DataFormat_Name(format.format), " (magic ", format.magic,
          "); set data.format to ", weft::v1::DataFormat_Name(other.format)));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": bad magic number ", magic, " in ", what, " header (expected ", format.magic,
        "); is this an llm.c .bin token file?"));
  }
  const int32_t version = LoadLe32(bytes + 4);
  if (version != format.version) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": unsupported ", what, " version ",
                                                      version, " (expected ", format.version,
                                                      ")"));
  }
  const int32_t header_count = LoadLe32(bytes + 8);
  const int64_t data_bytes = size - kBinHeaderBytes;
  const int64_t header_bytes = static_cast<int64_t>(format.token_bytes) * header_count;
  if (header_count < 0 || data_bytes != header_bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": size mismatch: header says ", header_count, " tokens (", header_bytes,
        " bytes after the header at ", format.token_bytes, " bytes a token) but the file has ",
        data_bytes, " bytes after the header; the file is truncated or corrupt"));
  }
  *count = header_count;
  return absl::OkStatus();
}

// Finds the first token >= vocab_size, so the error names a value and a place a person can
// look at (e.g. with `od`), rather than surfacing later as an out-of-range embedding row.
// Files run to many GB: each fixed-size block is reduced to its maximum (a loop the compiler
// vectorises) and only a block holding a bad token is searched again, element by element.
// `first_index` is the index in the file of tokens[0], for the message.
template <typename T>
absl::Status CheckTokens(const std::string& path, const unsigned char* tokens, int64_t count,
                         int64_t first_index, int vocab_size) {
  if (static_cast<uint64_t>(vocab_size) > std::numeric_limits<T>::max()) {
    return absl::OkStatus();  // every value the format can hold is a valid token
  }
  const auto limit = static_cast<T>(vocab_size);
  constexpr int64_t kBlock = 4096;
  const auto block_max = [&](int64_t begin, int64_t n) {
    T m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, LoadLe<T>(tokens + (begin + i) * sizeof(T)));
    return m;
  };
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    // A constant trip count for whole blocks, so the reduction needs no scalar epilogue.
    const T m =
        count - begin >= kBlock ? block_max(begin, kBlock) : block_max(begin, count - begin);
    if (m < limit) continue;
    for (int64_t i = begin;; ++i) {
      const T value = LoadLe<T>(tokens + i * sizeof(T));
      if (value >= limit) {
        return absl::FailedPreconditionError(absl::StrCat(
            path, ": token ", static_cast<uint32_t>(value), " at token index ", first_index + i,
            " is out of range: model.vocab_size is ", vocab_size,
            " (token ids must be < model.vocab_size)"));
      }
    }
  }
  return absl::OkStatus();
}

// Checks file tokens [first_index, first_index + count) of a file whose tokens start at
// `file_tokens`.
absl::Status CheckTokens(const std::string& path, const unsigned char* file_tokens,
                         int token_bytes, int64_t first_index, int64_t count, int vocab_size) {
  const unsigned char* tokens = file_tokens + first_index * token_bytes;
  switch (token_bytes) {
    case 1: return CheckTokens<uint8_t>(path, tokens, count, first_index, vocab_size);
    case 2: return CheckTokens<uint16_t>(path, tokens, count, first_index, vocab_size);
    default: return CheckTokens<uint32_t>(path, tokens, count, first_index, vocab_size);
  }
}

// One sequence and its targets, shifted by one: inputs[t] = p[t], targets[t] = p[t + 1].
template <typename T>
void CopySequence(const unsigned char* p, int64_t t_len, int32_t* inputs, int32_t* targets) {
  for (int64_t t = 0; t < t_len; ++t) {
    inputs[t] = static_cast<int32_t>(LoadLe<T>(p + t * sizeof(T)));
    targets[t] = static_cast<int32_t>(LoadLe<T>(p + (t + 1) * sizeof(T)));
  }
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
  const BinFormat* bin_format = nullptr;
  switch (spec.format()) {
    case weft::v1::DATA_FORMAT_TEXT_BYTES: break;
    case weft::v1::DATA_FORMAT_UINT16_BIN: bin_format = &kUint16Bin; break;
    case weft::v1::DATA_FORMAT_UINT32_BIN: bin_format = &kUint32Bin; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "data.format must be DATA_FORMAT_TEXT_BYTES, DATA_FORMAT_UINT16_BIN or "
          "DATA_FORMAT_UINT32_BIN, got ",
          weft::v1::DataFormat_Name(spec.format()).empty()
              ? absl::StrCat(static_cast<int>(spec.format()))
              : weft::v1::DataFormat_Name(spec.format())));
  }
  const int token_bytes = bin_format == nullptr ? 1 : bin_format->token_bytes;
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
  if (bin_format == nullptr) {
    file_tokens = static_cast<int64_t>(mapping.size);
  } else {
    WEFT_RETURN_IF_ERROR(ParseBinHeader(path, mapping, *bin_format, &file_tokens));
    tokens = bytes + kBinHeaderBytes;
  }

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
  // The train split checks the whole file, its held-out tail included, so a bad validation
  // token fails the job at start; a held-out validation split then checks only its own tail, so
  // a worker opening both scans a (possibly many-GB) file once.
  const bool whole_file = split == Split::kTrain || !held_out;
  WEFT_RETURN_IF_ERROR(CheckTokens(path, tokens, token_bytes, whole_file ? 0 : first,
                                   whole_file ? file_tokens : count, vocab_size));

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
  switch (token_bytes_) {
    case 1: return tokens_[i];
    case 2: return LoadLe<uint16_t>(tokens_ + 2 * i);
    default: return static_cast<int32_t>(LoadLe<uint32_t>(tokens_ + 4 * i));
  }
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
    const unsigned char* p = tokens_ + token_bytes_ * start;
    // Specialized per width so the inner loops are branch-free copies.
    switch (token_bytes_) {
      case 1: CopySequence<uint8_t>(p, t_len, in, out); break;
      case 2: CopySequence<uint16_t>(p, t_len, in, out); break;
      default: CopySequence<uint32_t>(p, t_len, in, out); break;
    }
  }
}

}  // namespace weft::data
