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
#include "common/crc32c.h"
#include "common/status.h"
#include "worker/data/manifest.h"
#include "worker/data/random.h"
#include "worker/data/token_files.h"
#include "worker/data/token_flags.h"

namespace weft::data {
namespace {

// llm.c's token file header: 256 int32 (1 KiB) so the tokens start aligned.
constexpr int64_t kBinHeaderInts = 256;
constexpr int64_t kBinHeaderBytes = kBinHeaderInts * 4;
constexpr double kDefaultValFraction = 0.1;
constexpr double kMaxValFraction = 0.5;
// Keys SEQUENTIAL's permutations apart from RANDOM_WINDOWS' hashes of the same seed.
constexpr uint64_t kSequentialDomain = 0x5E9A'E17A'1D0C'0001ULL;

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
  Mapping() = default;
  Mapping(Mapping&& other) noexcept
      : base(std::exchange(other.base, nullptr)), size(other.size) {}
  Mapping& operator=(Mapping&&) = delete;
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

// Where a split's files come from and what they must be.
struct Source {
  std::string name;                // what path() reports
  std::vector<std::string> files;  // in stream order
  // With a manifest: what it says of each file (parallel to `files`), its field for messages
  // ("splits.train") and the manifest's path; empty otherwise.
  std::vector<ManifestShard> expected;
  std::string split_field;
  const BinFormat* format = nullptr;  // null for DATA_FORMAT_TEXT_BYTES
  // Where the format came from, and what to tell a person who named the other width.
  std::string format_origin;
  bool held_out = false;  // kVal/kTrain share one stream split at val_fraction
  double val_fraction = 0.0;
  // Documents: the token after each eos_id begins one (-1: no separator); with flags, the
  // shards' token flags files (parallel to `files`) say instead.
  int32_t eos_id = -1;
  std::vector<std::string> flag_files;
};

// Validates an llm.c header of `source.format`; on success sets the count of tokens after it.
absl::Status ParseBinHeader(const std::string& path, const Mapping& mapping,
                            const Source& source, int64_t* count) {
  const BinFormat& format = *source.format;
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
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": magic number ", magic, " marks a ", other.name,
                       " token file, but ", source.format_origin, " is ",
                       weft::v1::DataFormat_Name(format.format), " (magic ", format.magic, ")",
                       source.expected.empty()
                           ? absl::StrCat("; set data.format to ",
                                          weft::v1::DataFormat_Name(other.format))
                           : std::string("; the shard does not belong to this dataset")));
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
// look at (e.g. with `od`), rather than surfacing later as an out-of-range embedding row; with
// `crc` non-null, also folds the tokens into *crc in the same pass, so a large shard is read
// once. Files run to many GB: each fixed-size block is reduced to its maximum (a loop the
// compiler vectorises) and only a block holding a bad token is searched again, element by
// element. `first_index` is the index in the file of tokens[0], for the message.
template <typename T>
absl::Status ScanTokens(const std::string& path, const unsigned char* tokens, int64_t count,
                        int64_t first_index, int vocab_size, uint32_t* crc) {
  // Otherwise every value the format can hold is a valid token.
  const bool check = static_cast<uint64_t>(vocab_size) <= std::numeric_limits<T>::max();
  if (!check && crc == nullptr) return absl::OkStatus();
  const auto limit = static_cast<T>(check ? vocab_size : 0);
  constexpr int64_t kBlock = 4096;
  const auto block_max = [&](int64_t begin, int64_t n) {
    T m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, LoadLe<T>(tokens + (begin + i) * sizeof(T)));
    return m;
  };
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    const int64_t n = std::min(kBlock, count - begin);
    if (crc != nullptr) {
      *crc = Crc32c(tokens + begin * sizeof(T), static_cast<size_t>(n) * sizeof(T), *crc);
    }
    if (!check) continue;
    // A constant trip count for whole blocks, so the reduction needs no scalar epilogue.
    const T m = n == kBlock ? block_max(begin, kBlock) : block_max(begin, n);
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

// One file of a split, mapped and its header checked.
struct OpenFile {
  std::string path;
  Mapping mapping;
  const unsigned char* tokens = nullptr;  // the file's first token
  int64_t count = 0;                      // the file's tokens
};

// A shard differs from its manifest entry: someone rewrote, truncated or replaced it.
absl::Status ShardChanged(const std::string& path, const std::string& field, const char* what,
                          const std::string& actual, const std::string& expected) {
  return absl::FailedPreconditionError(
      absl::StrCat(path, ": shard changed after its manifest was written: ", what, " ", actual,
                   ", but the manifest says ", expected, " (", field, ")"));
}

absl::StatusOr<OpenFile> OpenTokenFile(const Source& source, size_t i) {
  OpenFile file;
  file.path = source.files[i];
  const bool manifest = !source.expected.empty();
  const std::string field = absl::StrCat(source.split_field, "[", i, "]");
  const absl::Status mapped = MapFile(file.path, &file.mapping);
  if (manifest && absl::IsNotFound(mapped)) {
    return absl::FailedPreconditionError(absl::StrCat(
        file.path, ": shard is missing: the dataset manifest ", source.name, " lists it (",
        field, ")"));
  }
  WEFT_RETURN_IF_ERROR(mapped);
  if (manifest && static_cast<int64_t>(file.mapping.size) != source.expected[i].bytes) {
    return ShardChanged(file.path, field, "size", absl::StrCat(file.mapping.size, " bytes"),
                        absl::StrCat(source.expected[i].bytes, " bytes"));
  }
  file.tokens = static_cast<const unsigned char*>(file.mapping.base);
  if (source.format == nullptr) {
    file.count = static_cast<int64_t>(file.mapping.size);
    return file;
  }
  WEFT_RETURN_IF_ERROR(ParseBinHeader(file.path, file.mapping, source, &file.count));
  file.tokens += kBinHeaderBytes;
  if (manifest && file.count != source.expected[i].tokens) {
    return ShardChanged(file.path, field, "header token count", absl::StrCat(file.count),
                        absl::StrCat(source.expected[i].tokens));
  }
  return file;
}

// Checks the file's tokens [first, first + count) against the vocabulary and, for a manifest
// shard (always read whole), its crc32c against the manifest's.
absl::Status ScanFile(const Source& source, size_t i, const OpenFile& file, int64_t first,
                      int64_t count, int vocab_size) {
  const bool manifest = !source.expected.empty();
  uint32_t crc = 0;
  if (manifest) crc = Crc32c(file.mapping.base, file.tokens - static_cast<const unsigned char*>(
                                                                  file.mapping.base));
  uint32_t* crc_out = manifest ? &crc : nullptr;
  const int width = source.format == nullptr ? 1 : source.format->token_bytes;
  const unsigned char* tokens = file.tokens + first * width;
  absl::Status scanned;
  switch (width) {
    case 1: scanned = ScanTokens<uint8_t>(file.path, tokens, count, first, vocab_size, crc_out);
      break;
    case 2: scanned = ScanTokens<uint16_t>(file.path, tokens, count, first, vocab_size, crc_out);
      break;
    default:
      scanned = ScanTokens<uint32_t>(file.path, tokens, count, first, vocab_size, crc_out);
  }
  WEFT_RETURN_IF_ERROR(scanned);
  if (manifest && crc != source.expected[i].crc32c) {
    return ShardChanged(file.path, absl::StrCat(source.split_field, "[", i, "]"), "crc32c",
                        FormatCrc32c(crc), FormatCrc32c(source.expected[i].crc32c));
  }
  return absl::OkStatus();
}

// The token flags file of manifest shard `i` (`count` tokens), mapped and checked: the size
// and crc32c its manifest entry records, then the header and the flags themselves.
absl::StatusOr<Mapping> OpenFlagsFile(const Source& source, size_t i, int64_t count) {
  const std::string& path = source.flag_files[i];
  const std::string field = absl::StrCat(source.split_field, "[", i, "].flags");
  Mapping mapping;
  const absl::Status mapped = MapFile(path, &mapping);
  if (absl::IsNotFound(mapped)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": token flags file is missing: the dataset manifest ", source.name,
                     " lists it (", field, ")"));
  }
  WEFT_RETURN_IF_ERROR(mapped);
  if (static_cast<int64_t>(mapping.size) != source.expected[i].flags_bytes) {
    return ShardChanged(path, field, "size", absl::StrCat(mapping.size, " bytes"),
                        absl::StrCat(source.expected[i].flags_bytes, " bytes"));
  }
  const uint32_t crc = Crc32c(mapping.base, mapping.size);
  if (crc != source.expected[i].flags_crc32c) {
    return ShardChanged(path, field, "crc32c", FormatCrc32c(crc),
                        FormatCrc32c(source.expected[i].flags_crc32c));
  }
  WEFT_RETURN_IF_ERROR(
      CheckTokenFlags(static_cast<const unsigned char*>(mapping.base), mapping.size, count, path));
  return mapping;
}

absl::StatusOr<const BinFormat*> BinFormatOf(weft::v1::DataFormat format) {
  switch (format) {
    case weft::v1::DATA_FORMAT_TEXT_BYTES: return nullptr;
    case weft::v1::DATA_FORMAT_UINT16_BIN: return &kUint16Bin;
    case weft::v1::DATA_FORMAT_UINT32_BIN: return &kUint32Bin;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "data.format must be DATA_FORMAT_TEXT_BYTES, DATA_FORMAT_UINT16_BIN or "
          "DATA_FORMAT_UINT32_BIN, got ",
          weft::v1::DataFormat_Name(format).empty() ? absl::StrCat(static_cast<int>(format))
                                                    : weft::v1::DataFormat_Name(format)));
  }
}

absl::StatusOr<Source> ManifestSourceOf(const std::string& manifest_path, int vocab_size,
                                        Split split) {
  WEFT_ASSIGN_OR_RETURN(const DatasetManifest m, ReadManifest(manifest_path));
  const std::string file = ManifestFilePath(m, kManifestFileName);
  if (m.tokenizer.vocab_size > vocab_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        file, ": tokenizer.vocab_size ", m.tokenizer.vocab_size, " is larger than "
        "model.vocab_size ", vocab_size, "; the model has no embedding row for the tokenizer's "
        "largest ids (set model.vocab_size >= ", m.tokenizer.vocab_size, ")"));
  }
  // Once per worker: the train split is opened first and always.
  if (split == Split::kTrain) WEFT_RETURN_IF_ERROR(CheckManifestTokenizer(m));
  const std::vector<ManifestShard>& shards = split == Split::kTrain ? m.train : m.val;
  if (shards.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        file, ": splits.val is empty, but validation is on (training.val_interval_steps > 0): "
        "prepare the dataset with a validation fraction, or set training.val_interval_steps "
        "to 0"));
  }
  Source source;
  source.name = file;
  source.expected = shards;
  source.split_field = split == Split::kTrain ? "splits.train" : "splits.val";
  for (const ManifestShard& shard : shards) {
    source.files.push_back(ManifestFilePath(m, shard.file));
    if (!shard.flags_file.empty()) {
      source.flag_files.push_back(ManifestFilePath(m, shard.flags_file));
    }
  }
  if (m.document_separator == "eos") source.eos_id = m.tokenizer.eos_id;
  WEFT_ASSIGN_OR_RETURN(source.format, BinFormatOf(m.token_format));
  source.format_origin = absl::StrCat("the token_format of its manifest ", file);
  return source;
}

absl::StatusOr<Source> PathSourceOf(const weft::v1::DataSpec& spec, Split split) {
  if (spec.train_path().empty()) {
    return absl::InvalidArgumentError("data.train_path is empty");
  }
  Source source;
  WEFT_ASSIGN_OR_RETURN(source.format, BinFormatOf(spec.format()));
  source.format_origin = "data.format";
  source.held_out = spec.val_path().empty();
  if (source.held_out) {
    source.val_fraction = spec.val_fraction();
    if (source.val_fraction == 0.0) source.val_fraction = kDefaultValFraction;
    // The negated comparison also rejects NaN.
    if (!(source.val_fraction >= 0.0 && source.val_fraction <= kMaxValFraction)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "data.val_fraction must be in [0, ", kMaxValFraction, "], got ", source.val_fraction));
    }
  }
  const bool own_val = split == Split::kVal && !source.held_out;
  source.name = own_val ? spec.val_path() : spec.train_path();
  WEFT_ASSIGN_OR_RETURN(source.files,
                        ListTokenFiles(source.name, own_val ? "data.val_path" : "data.train_path"));
  return source;
}

// The range of the stream of `total` tokens that `split` reads, and how to describe it.
struct SplitRange {
  int64_t first = 0;
  int64_t count = 0;
  std::string what;
};

SplitRange RangeOf(const Source& source, Split split, int64_t total, size_t files) {
  const std::string all = files == 1 ? "the file" : absl::StrCat("the ", files, " files");
  if (!source.held_out) return {0, total, all};
  // Floor, so the held-out tail never exceeds the requested fraction.
  const auto val_tokens =
      static_cast<int64_t>(std::floor(static_cast<double>(total) * source.val_fraction));
  if (split == Split::kTrain) {
    return {0, total - val_tokens,
            absl::StrCat("the train split (the first ", 100.0 * (1.0 - source.val_fraction),
                         "% of the ", total, " tokens)")};
  }
  return {total - val_tokens, val_tokens,
          absl::StrCat("the validation split (the last ", 100.0 * source.val_fraction,
                       "% of the ", total, " tokens)")};
}

// One row of a batch: inputs[t] = p[t], targets[t] = p[t + 1].
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
  return Open(spec, Options{vocab_size, seq_len, 1}, split);
}

absl::StatusOr<std::unique_ptr<TokenDataset>> TokenDataset::Open(const weft::v1::DataSpec& spec,
                                                                 const Options& options,
                                                                 Split split) {
  const int seq_len = options.seq_len;
  if (seq_len < 1) {
    return absl::InvalidArgumentError(absl::StrCat("sequence length must be >= 1, got ", seq_len));
  }
  if (options.vocab_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size must be >= 1, got ", options.vocab_size));
  }
  if (options.grad_accum_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("grad_accum_steps must be >= 1, got ", options.grad_accum_steps));
  }
  WEFT_ASSIGN_OR_RETURN(const Source source,
                        spec.manifest_path().empty()
                            ? PathSourceOf(spec, split)
                            : ManifestSourceOf(spec.manifest_path(), options.vocab_size, split));
  std::vector<OpenFile> files;
  std::vector<Mapping> flag_maps;
  int64_t total = 0;
  for (size_t i = 0; i < source.files.size(); ++i) {
    WEFT_ASSIGN_OR_RETURN(OpenFile file, OpenTokenFile(source, i));
    total += file.count;
    if (!source.flag_files.empty()) {
      WEFT_ASSIGN_OR_RETURN(Mapping flags, OpenFlagsFile(source, i, file.count));
      flag_maps.push_back(std::move(flags));
    }
    files.push_back(std::move(file));
  }
  const bool packed = spec.sampling() == weft::v1::DataSpec::PACKED;
  if ((packed || spec.document_masking()) && source.flag_files.empty() && source.eos_id < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.name, ": ", packed ? "data.sampling PACKED" : "data.document_masking",
        " needs documents, but this dataset records none: its shards have no token flags and "
        "its document_separator is not \"eos\" (prepare it with an EOS tokenizer, or --chat)"));
  }
  const SplitRange range = RangeOf(source, split, total, files.size());
  if (range.count < static_cast<int64_t>(seq_len) + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.name, ": too short: ", range.what, " has ", range.count,
        " tokens, but one sequence of seq_len ", seq_len, " needs ",
        static_cast<int64_t>(seq_len) + 1, " (seq_len + 1 for the targets)"));
  }

  auto dataset = std::unique_ptr<TokenDataset>(new TokenDataset());
  dataset->path_ = source.name;
  dataset->split_ = split;
  dataset->seq_len_ = seq_len;
  dataset->grad_accum_steps_ = options.grad_accum_steps;
  dataset->token_bytes_ = source.format == nullptr ? 1 : source.format->token_bytes;
  dataset->num_tokens_ = range.count;
  dataset->first_token_index_ = range.first;
  if (split == Split::kTrain && spec.sampling() == weft::v1::DataSpec::SEQUENTIAL) {
    dataset->sampling_ = weft::v1::DataSpec::SEQUENTIAL;
  }
  // Validation reads what training does when training reads whole documents: held-out
  // conversations, scored as the training ones are.
  if (packed) dataset->sampling_ = weft::v1::DataSpec::PACKED;
  dataset->document_masking_ = spec.document_masking();
  dataset->eos_id_ = source.eos_id;
  dataset->has_flags_ = !source.flag_files.empty();
  dataset->pad_token_ = std::max(0, source.eos_id);
  // Each file: scan what this split must check, and keep the mapping if the split reads it.
  // The train split checks every file whole, its held-out tail included, so a bad validation
  // token fails the job at start; a held-out validation split then checks only its own tail,
  // so a worker opening both scans a (possibly many-GB) stream once.
  const bool whole = split == Split::kTrain || !source.held_out;
  const int64_t end = range.first + range.count;
  int64_t file_begin = 0;
  for (size_t i = 0; i < files.size(); ++i) {
    OpenFile& file = files[i];
    const int64_t lo = std::clamp(range.first - file_begin, int64_t{0}, file.count);
    const int64_t hi = std::clamp(end - file_begin, int64_t{0}, file.count);
    WEFT_RETURN_IF_ERROR(ScanFile(source, i, file, whole ? 0 : lo, whole ? file.count : hi - lo,
                                  options.vocab_size));
    if (hi > lo) {
      Shard shard;
      shard.path = file.path;
      shard.map_size = file.mapping.size;
      shard.map_base = std::exchange(file.mapping.base, nullptr);
      shard.tokens = file.tokens + lo * dataset->token_bytes_;
      shard.count = hi - lo;
      shard.begin = file_begin + lo - range.first;
      if (dataset->has_flags_) {
        Mapping& flags = flag_maps[i];
        shard.flags = static_cast<const unsigned char*>(flags.base) + kTokenFlagsHeaderBytes + lo;
        shard.flags_map_size = flags.size;
        shard.flags_map_base = std::exchange(flags.base, nullptr);
      }
      shard.first_window = dataset->num_windows_;
      // Windows of seq_len + 1 tokens at a stride of seq_len: the last starts at
      // (w - 1) * seq_len and ends at w * seq_len <= count - 1.
      dataset->num_windows_ += (shard.count - 1) / seq_len;
      dataset->shards_.push_back(std::move(shard));
    }
    file_begin += file.count;
  }
  if (packed) {
    dataset->PackDocuments();
    if (dataset->packed_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat(source.name, ": no document of ", range.what,
                       " has two tokens (one input and its target): nothing to train on"));
    }
  }
  if (dataset->sampling_ == weft::v1::DataSpec::SEQUENTIAL && dataset->num_windows_ == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.name, ": too short for SEQUENTIAL sampling: no file of ", range.what,
        " holds one window of seq_len + 1 = ", static_cast<int64_t>(seq_len) + 1,
        " tokens (a window never spans two files)"));
  }
  return dataset;
}

TokenDataset::~TokenDataset() {
  for (const Shard& shard : shards_) {
    if (shard.map_base != nullptr) munmap(shard.map_base, shard.map_size);
    if (shard.flags_map_base != nullptr) munmap(shard.flags_map_base, shard.flags_map_size);
  }
}

uint8_t TokenDataset::Flags(int64_t i) const {
  assert(i >= 0 && i < num_tokens_);
  if (has_flags_) {
    const Shard& shard = ShardOfToken(i);
    return shard.flags[i - shard.begin];
  }
  const bool starts = i == 0 || (eos_id_ >= 0 && Token(i - 1) == eos_id_);
  return kTokenFlagLoss | (starts ? kTokenFlagDocStart : 0);
}

void TokenDataset::RowFlags(int64_t start, int n, const int32_t* inputs, uint8_t* out) const {
  if (has_flags_) {
    const Shard& shard = ShardOfToken(start);
    if (start + n <= shard.begin + shard.count) {
      std::memcpy(out, shard.flags + (start - shard.begin), static_cast<size_t>(n));
      return;
    }
    for (int t = 0; t < n; ++t) out[t] = Flags(start + t);  // rare: a window across files
    return;
  }
  // EOS separators: token t of the row begins a document when input t - 1 is an EOS, so the
  // row's own tokens say it, without a lookup per token.
  out[0] = Flags(start);
  for (int t = 1; t < n; ++t) {
    out[t] = kTokenFlagLoss | (inputs[t - 1] == eos_id_ ? kTokenFlagDocStart : 0);
  }
}

void TokenDataset::PackDocuments() {
  // The split's documents in stream order, as (first token, tokens).
  std::vector<std::pair<int64_t, int64_t>> docs;
  int64_t doc_begin = 0;
  int32_t previous = -1;
  for (const Shard& shard : shards_) {
    for (int64_t j = 0; j < shard.count; ++j) {
      const int64_t i = shard.begin + j;
      bool starts;
      if (has_flags_) {
        starts = (shard.flags[j] & kTokenFlagDocStart) != 0;
      } else {
        starts = previous == eos_id_;
        previous = Token(i);
      }
      if (starts && i > doc_begin) {
        docs.emplace_back(doc_begin, i - doc_begin);
        doc_begin = i;
      }
    }
  }
  docs.emplace_back(doc_begin, num_tokens_ - doc_begin);
  // First fit in order. A window holds seq_len + 1 tokens (inputs and the last target); a
  // document longer than that is cut into windows at a stride of seq_len, as SEQUENTIAL cuts
  // files, so that no target inside it is lost, and its last piece opens the next window.
  const int64_t capacity = static_cast<int64_t>(seq_len_) + 1;
  int64_t open_begin = 0, open_len = 0;
  const auto close = [&] {
    if (open_len >= 2) packed_.push_back({open_begin, static_cast<int32_t>(open_len)});
    open_len = 0;
  };
  for (const auto& [begin, len] : docs) {
    if (open_len > 0 && open_len + len <= capacity) {
      open_len += len;  // documents are adjacent in the stream
      continue;
    }
    close();
    int64_t at = begin, left = len;
    while (left > capacity) {
      packed_.push_back({at, static_cast<int32_t>(capacity)});
      at += seq_len_;
      left -= seq_len_;
    }
    open_begin = at;
    open_len = left;
  }
  close();
  num_windows_ = static_cast<int64_t>(packed_.size());
}

const TokenDataset::Shard& TokenDataset::ShardOfToken(int64_t i) const {
  if (shards_.size() == 1) return shards_[0];
  // The last shard whose first token is at or before i.
  const auto it = std::upper_bound(shards_.begin(), shards_.end(), i,
                                   [](int64_t v, const Shard& s) { return v < s.begin; });
  return *(it - 1);
}

int32_t TokenDataset::Token(int64_t i) const {
  assert(i >= 0 && i < num_tokens_);
  const Shard& shard = ShardOfToken(i);
  const unsigned char* p = shard.tokens + (i - shard.begin) * token_bytes_;
  switch (token_bytes_) {
    case 1: return *p;
    case 2: return LoadLe<uint16_t>(p);
    default: return static_cast<int32_t>(LoadLe<uint32_t>(p));
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

int64_t TokenDataset::SequentialStart(uint64_t seed, int64_t n) const {
  const int64_t window = PermutedWindow(seed, n);
  // The last shard whose first window is at or before `window` (shards without a window share
  // their first_window with the next one, and upper_bound passes them).
  const auto it = std::upper_bound(shards_.begin(), shards_.end(), window,
                                   [](int64_t v, const Shard& s) { return v < s.first_window; });
  const Shard& shard = *(it - 1);
  return shard.begin + (window - shard.first_window) * seq_len_;
}

void TokenDataset::CopyWindow(int64_t start, int32_t* inputs, int32_t* targets) const {
  const int64_t t_len = seq_len_;
  const Shard& shard = ShardOfToken(start);
  if (start + t_len < shard.begin + shard.count) {
    const unsigned char* p = shard.tokens + (start - shard.begin) * token_bytes_;
    // Specialized per width so the inner loops are branch-free copies.
    switch (token_bytes_) {
      case 1: CopySequence<uint8_t>(p, t_len, inputs, targets); break;
      case 2: CopySequence<uint16_t>(p, t_len, inputs, targets); break;
      default: CopySequence<uint32_t>(p, t_len, inputs, targets); break;
    }
    return;
  }
  // A random window running from one file into the next: rare, so token by token.
  for (int64_t t = 0; t < t_len; ++t) {
    inputs[t] = Token(start + t);
    targets[t] = Token(start + t + 1);
  }
}

void TokenDataset::ReadTokens(int64_t begin, int64_t n, int32_t* out) const {
  const Shard& shard = ShardOfToken(begin);
  if (begin + n <= shard.begin + shard.count) {
    const unsigned char* p = shard.tokens + (begin - shard.begin) * token_bytes_;
    switch (token_bytes_) {
      case 1:
        for (int64_t i = 0; i < n; ++i) out[i] = p[i];
        break;
      case 2:
        for (int64_t i = 0; i < n; ++i) out[i] = LoadLe<uint16_t>(p + 2 * i);
        break;
      default:
        for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int32_t>(LoadLe<uint32_t>(p + 4 * i));
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) out[i] = Token(begin + i);  // across shards: rare
}

int64_t TokenDataset::PermutedWindow(uint64_t seed, int64_t n) const {
  assert(n >= 0 && num_windows_ > 0);
  const auto windows = static_cast<uint64_t>(num_windows_);
  const uint64_t epoch = static_cast<uint64_t>(n) / windows;
  const KeyedPermutation order(windows,
                               HashCombine(HashCombine(Mix64(seed), kSequentialDomain), epoch));
  return static_cast<int64_t>(order(static_cast<uint64_t>(n) % windows));
}

void TokenDataset::CopyPackedWindow(int64_t window, int32_t* inputs, int32_t* targets,
                                    int32_t* doc_starts) const {
  const PackedWindow w = packed_[window];
  const int len = w.length;  // <= seq_len + 1
  const int n_in = std::min(len, seq_len_);
  ReadTokens(w.begin, n_in, inputs);
  // The targets are the inputs one on; a full window's last one is its extra token.
  if (n_in > 1) std::copy(inputs + 1, inputs + n_in, targets);
  if (len > seq_len_) targets[seq_len_ - 1] = Token(w.begin + seq_len_);
  for (int t = std::max(len - 1, 0); t < seq_len_; ++t) targets[t] = -1;
  // Padding: no target, a document of its own.
  for (int t = n_in; t < seq_len_; ++t) inputs[t] = pad_token_;
  // The window's first token opens a document even where it continues a cut one.
  uint8_t flags_buffer[1024];
  std::vector<uint8_t> flags_heap;
  const int n = std::min(len, seq_len_ + 1);
  uint8_t* flags = flags_buffer;
  if (n > static_cast<int>(sizeof(flags_buffer))) {
    flags_heap.resize(static_cast<size_t>(n));
    flags = flags_heap.data();
  }
  RowFlags(w.begin, n, inputs, flags);
  MaskRow(flags, n, targets, doc_starts);
  if (doc_starts != nullptr) {
    for (int t = std::min(len, seq_len_); t < seq_len_; ++t) doc_starts[t] = std::min(len, t);
  }
}

void TokenDataset::MaskRow(const uint8_t* flags, int n, int32_t* targets,
                           int32_t* doc_starts) const {
  // flags[t] is of the row's token t: input t and the target of position t - 1.
  for (int t = 0; t + 1 < n && t < seq_len_; ++t) {
    const uint8_t f = flags[t + 1];
    if ((f & kTokenFlagLoss) == 0 || (document_masking_ && (f & kTokenFlagDocStart) != 0)) {
      targets[t] = -1;
    }
  }
  if (doc_starts == nullptr) return;
  doc_starts[0] = 0;
  for (int t = 1; t < seq_len_ && t < n; ++t) {
    doc_starts[t] = (flags[t] & kTokenFlagDocStart) != 0 ? t : doc_starts[t - 1];
  }
}

void TokenDataset::Batch(uint64_t seed, int64_t step, int micro_step, int rank, int world_size,
                         int batch_size, int32_t* inputs, int32_t* targets,
                         int32_t* doc_starts) const {
  assert(world_size >= 1 && rank >= 0 && rank < world_size);
  assert(batch_size >= 1 && step >= 0 && micro_step >= 0);
  const int64_t t_len = seq_len_;
  const int64_t global_batch = static_cast<int64_t>(world_size) * batch_size;
  const int64_t first_sequence = (step * grad_accum_steps_ + micro_step) * global_batch;
  // Flags matter where a shard has them (loss masks) or documents are asked for.
  const bool masked = has_flags_ || document_masking_;
  std::vector<uint8_t> flags(masked ? t_len + 1 : 0);
  for (int b = 0; b < batch_size; ++b) {
    const int64_t global_index = static_cast<int64_t>(rank) * batch_size + b;
    int32_t* row_inputs = inputs + b * t_len;
    int32_t* row_targets = targets + b * t_len;
    int32_t* row_docs = doc_starts == nullptr ? nullptr : doc_starts + b * t_len;
    if (sampling_ == weft::v1::DataSpec::PACKED) {
      CopyPackedWindow(PermutedWindow(seed, first_sequence + global_index), row_inputs, row_targets,
                       row_docs);
      continue;
    }
    const int64_t start = sampling_ == weft::v1::DataSpec::SEQUENTIAL
                              ? SequentialStart(seed, first_sequence + global_index)
                              : SequenceStart(seed, step, micro_step, global_index);
    CopyWindow(start, row_inputs, row_targets);
    if (!masked) {
      if (row_docs != nullptr) std::fill(row_docs, row_docs + t_len, 0);
      continue;
    }
    RowFlags(start, static_cast<int>(t_len + 1), row_inputs, flags.data());
    MaskRow(flags.data(), static_cast<int>(t_len + 1), row_targets, row_docs);
  }
}

}  // namespace weft::data
