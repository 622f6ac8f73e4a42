#include "worker/model_io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace weft::model_io {
namespace {

// ordered_json keeps keys in insertion (and, when parsing, file) order, so the header lists the
// tensors in the order they are laid out: easier to read with `head -c`, and stable bytes.
using Json = nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr char kF32[] = "F32";

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  size_t bytes;
};
constexpr DtypeInfo kDtypes[] = {
    {Dtype::kF32, "F32", 4}, {Dtype::kBF16, "BF16", 2}, {Dtype::kF16, "F16", 2}};

const DtypeInfo& InfoOf(Dtype dtype) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.dtype == dtype) return info;
  }
  return kDtypes[0];
}
// Same bound as the reference implementation: a header this large is garbage, and refusing it
// keeps a corrupt length from making us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// Tensor bytes are little-endian in the file. On little-endian hosts (every machine Weft runs
// on) floats go through unchanged; the swap keeps the format right elsewhere.
constexpr bool kHostIsLittleEndian = std::endian::native == std::endian::little;

uint32_t ByteSwap32(uint32_t v) {
  return (v >> 24) | ((v >> 8) & 0xFF00u) | ((v << 8) & 0xFF0000u) | (v << 24);
}

absl::Status WriteAll(int fd, const void* data, size_t size, const std::string& what) {
  const auto* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(what, ": write failed"));
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Reads exactly `size` bytes at `offset`; a short read means the file shrank under us.
absl::Status ReadAllAt(int fd, void* data, size_t size, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = pread(fd, p, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": read failed: ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: unexpected end of file at byte ", offset));
    }
    p += n;
    size -= static_cast<size_t>(n);
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

float Bf16ToFloat(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN instead of rounding into infinity.
uint16_t FloatToBf16(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

// _Float16 conversions are IEEE's (round to nearest even, subnormals kept).
float F16ToFloat(uint16_t bits) { return static_cast<float>(std::bit_cast<_Float16>(bits)); }
uint16_t FloatToF16(float value) {
  return std::bit_cast<uint16_t>(static_cast<_Float16>(value));
}

// Converts in bounded chunks: staging a multi-GB tensor at once would double its memory.
absl::Status WriteFloats(int fd, const float* values, size_t count, Dtype dtype,
                         const std::string& what) {
  if (dtype == Dtype::kF32 && kHostIsLittleEndian) {
    return WriteAll(fd, values, count * sizeof(float), what);
  }
  constexpr size_t kChunk = 1 << 16;
  std::vector<unsigned char> buffer;
  const size_t width = dtype == Dtype::kF32 ? 4 : 2;
  for (size_t i = 0; i < count; i += kChunk) {
    const size_t n = std::min(kChunk, count - i);
    buffer.resize(n * width);
    for (size_t j = 0; j < n; ++j) {
      const float v = values[i + j];
      const uint32_t bits = dtype == Dtype::kF32    ? std::bit_cast<uint32_t>(v)
                            : dtype == Dtype::kBF16 ? FloatToBf16(v)
                                                    : FloatToF16(v);
      for (size_t b = 0; b < width; ++b) buffer[j * width + b] = (bits >> (8 * b)) & 0xFFu;
    }
    WEFT_RETURN_IF_ERROR(WriteAll(fd, buffer.data(), buffer.size(), what));
  }
  return absl::OkStatus();
}

// Element count of `shape`, or an error for a negative dimension or int64 overflow.
absl::StatusOr<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dimension ", d));
    if (__builtin_mul_overflow(count, d, &count)) {
      return absl::InvalidArgumentError("element count overflows int64");
    }
  }
  return count;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&s, i ? ", " : "", shape[i]);
  return s + "]";
}

// The JSON header (padded with spaces to a multiple of 8 bytes) announcing `tensors` laid out
// back to back as `dtype`, then `metadata`; *elements gets their total element count. Errors:
// INVALID_ARGUMENT naming `path` and the tensor.
absl::StatusOr<std::string> HeaderText(const std::string& path,
                                       const std::vector<TensorHeader>& tensors,
                                       const std::map<std::string, std::string>& metadata,
                                       Dtype dtype, uint64_t* elements) {
  Json header = Json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  *elements = 0;
  for (const TensorHeader& t : tensors) {
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": a tensor has an empty name"));
    }
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", kMetadataKey, "\" is reserved and cannot name a tensor"));
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": duplicate tensor name \"", t.name, "\""));
    }
    const absl::StatusOr<int64_t> count = ElementCount(t.shape);
    if (!count.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", t.name, "\": shape ",
                                                     ShapeString(t.shape), ": ",
                                                     count.status().message()));
    }
    const uint64_t bytes = static_cast<uint64_t>(*count) * DtypeBytes(dtype);
    Json entry = Json::object();
    entry["dtype"] = DtypeName(dtype);
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[t.name] = std::move(entry);
    offset += bytes;
    *elements += static_cast<uint64_t>(*count);
  }
  if (!metadata.empty()) header[kMetadataKey] = metadata;

  std::string header_text;
  try {
    // strict: reject invalid UTF-8 rather than write a header other readers refuse.
    header_text = header.dump(-1, ' ', false, Json::error_handler_t::strict);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor name or metadata is not valid UTF-8: ", e.what()));
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  return header_text;
}

absl::Status SyncDirectory(const std::string& dir, const std::string& path) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open directory ", dir,
                                                   " to sync the rename"));
  }
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) {
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": fsync of directory ", dir, " failed"));
  }
  return absl::OkStatus();
}

// A JSON integer >= 0 (rejecting floats like 2.0 and negatives), or nullopt.
std::optional<uint64_t> NonNegativeInt(const Json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

struct Entry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Parses one tensor's header entry; `data_size` is the length of the data section. With
// `f32_only`, any dtype but F32 is UNIMPLEMENTED (ReadSafetensors' contract).
absl::StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name,
                                 const Json& value, uint64_t data_size, bool f32_only) {
  const std::string where = absl::StrCat(path, ": tensor \"", name, "\": ");
  if (!value.is_object()) {
    return absl::DataLossError(absl::StrCat(where, "header entry is not a JSON object"));
  }
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) {
    return absl::DataLossError(absl::StrCat(where, "missing or non-string \"dtype\""));
  }
  Entry entry;
  entry.name = name;
  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) {
    return absl::DataLossError(absl::StrCat(where, "missing or non-array \"shape\""));
  }
  for (const Json& d : *shape) {
    const std::optional<uint64_t> dim = NonNegativeInt(d);
    if (!dim.has_value() || *dim > static_cast<uint64_t>(INT64_MAX)) {
      return absl::DataLossError(
          absl::StrCat(where, "\"shape\" must hold non-negative integers, got ", shape->dump()));
    }
    entry.shape.push_back(static_cast<int64_t>(*dim));
  }
  const auto offsets = value.find("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets != value.end() && offsets->is_array() && offsets->size() == 2) {
    begin = NonNegativeInt((*offsets)[0]);
    end = NonNegativeInt((*offsets)[1]);
  }
  if (!begin.has_value() || !end.has_value()) {
    return absl::DataLossError(absl::StrCat(
        where, "\"data_offsets\" must be [begin, end] with non-negative integers, got ",
        offsets == value.end() ? std::string("nothing") : offsets->dump()));
  }
  if (*begin > *end) {
    return absl::DataLossError(absl::StrCat(where, "data_offsets [", *begin, ", ", *end,
                                            "] end before they begin"));
  }
  entry.begin = *begin;
  entry.end = *end;
  const std::string dtype_name = dtype->get<std::string>();
  if (f32_only && dtype_name != kF32) {
    return absl::UnimplementedError(absl::StrCat(where, "unsupported dtype ", dtype_name,
                                                 "; only ", kF32, " is supported"));
  }
  const DtypeInfo* info = nullptr;
  for (const DtypeInfo& candidate : kDtypes) {
    if (dtype_name == candidate.name) info = &candidate;
  }
  if (info == nullptr) {
    return absl::UnimplementedError(absl::StrCat(where, "unsupported dtype ", dtype_name,
                                                 "; Weft reads F32, BF16 and F16"));
  }
  entry.dtype = info->dtype;
  const absl::StatusOr<int64_t> elements = ElementCount(entry.shape);
  uint64_t expected_bytes = 0;
  if (!elements.ok() ||
      __builtin_mul_overflow(static_cast<uint64_t>(*elements), info->bytes, &expected_bytes)) {
    return absl::DataLossError(
        absl::StrCat(where, "shape ", ShapeString(entry.shape), " is too large"));
  }
  if (entry.end - entry.begin != expected_bytes) {
    return absl::DataLossError(absl::StrCat(
        where, "shape/size mismatch: shape ", ShapeString(entry.shape), " of ", info->name, " needs ",
        expected_bytes, " bytes, but data_offsets [", entry.begin, ", ", entry.end, "] span ",
        entry.end - entry.begin));
  }
  if (entry.end > data_size) {
    return absl::DataLossError(absl::StrCat(where, "data_offsets [", entry.begin, ", ", entry.end,
                                            "] out of range: the data section has ", data_size,
                                            " bytes (file truncated?)"));
  }
  return entry;
}

}  // namespace

const char* DtypeName(Dtype dtype) { return InfoOf(dtype).name; }
size_t DtypeBytes(Dtype dtype) { return InfoOf(dtype).bytes; }

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  return WriteSafetensors(path, tensors, metadata, Dtype::kF32);
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata, Dtype dtype) {
  std::vector<TensorHeader> headers;
  headers.reserve(tensors.size());
  for (const TensorData& t : tensors) {
    // A bad shape is the writer's to name; here only data that disagrees with a good one.
    const absl::StatusOr<int64_t> elements = ElementCount(t.shape);
    if (elements.ok() && static_cast<uint64_t>(*elements) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor \"", t.name, "\": shape ", ShapeString(t.shape), " has ", *elements,
          " elements but data has ", t.data.size()));
    }
    headers.push_back({t.name, t.shape});
  }
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                        SafetensorsWriter::Begin(path, headers, metadata, dtype));
  for (const TensorData& t : tensors) {
    WEFT_RETURN_IF_ERROR(writer->Append(t.data.data(), t.data.size()));
  }
  return writer->Commit();
}

absl::StatusOr<std::unique_ptr<SafetensorsWriter>> SafetensorsWriter::Begin(
    const std::string& path, const std::vector<TensorHeader>& tensors,
    const std::map<std::string, std::string>& metadata, Dtype dtype) {
  uint64_t elements = 0;
  WEFT_ASSIGN_OR_RETURN(const std::string header_text,
                        HeaderText(path, tensors, metadata, dtype, &elements));
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header_text.size() >> (8 * i));

  std::unique_ptr<SafetensorsWriter> writer(new SafetensorsWriter());
  writer->path_ = path;
  writer->dtype_ = dtype;
  writer->remaining_ = elements;
  // The temporary file must be in the destination's directory: rename is atomic only within
  // one filesystem.
  const std::filesystem::path fs_path(path);
  writer->dir_ = fs_path.has_parent_path() ? fs_path.parent_path().string() : std::string(".");
  writer->temp_ = path + ".tmp.XXXXXX";
  writer->fd_ = mkstemp(writer->temp_.data());
  if (writer->fd_ < 0) {
    const int err = errno;
    writer->temp_.clear();
    return absl::ErrnoToStatus(
        err, absl::StrCat(path, ": cannot create temporary file ", path, ".tmp.XXXXXX"));
  }
  // mkstemp creates 0600; a model file is meant to be shared like any other output.
  if (fchmod(writer->fd_, 0644) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat(path, ": chmod of ", writer->temp_, " failed"));
  }
  WEFT_RETURN_IF_ERROR(WriteAll(writer->fd_, length, sizeof(length), path));
  WEFT_RETURN_IF_ERROR(WriteAll(writer->fd_, header_text.data(), header_text.size(), path));
  return writer;
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) close(fd_);
  if (!temp_.empty()) unlink(temp_.c_str());
}

absl::Status SafetensorsWriter::Append(const float* values, size_t n) {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Append after Commit or after a failed write"));
  }
  if (n > remaining_) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": ", n, " elements appended, but the header announced only ", remaining_,
        " more"));
  }
  absl::Status s = WriteFloats(fd_, values, n, dtype_, path_);
  if (!s.ok()) {
    // The file is unusable now: later calls fail, the destructor removes it.
    close(fd_);
    fd_ = -1;
    return s;
  }
  remaining_ -= n;
  return absl::OkStatus();
}

absl::Status SafetensorsWriter::Commit() {
  if (fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": Commit after Commit or after a failed write"));
  }
  if (remaining_ != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": Commit with ", remaining_, " elements the header announced still unwritten"));
  }
  const int fd = fd_;
  fd_ = -1;
  // fsync before rename: otherwise a crash can leave the new name pointing at missing data.
  if (fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(path_, ": fsync failed"));
  }
  if (close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path_, ": close failed"));
  if (rename(temp_.c_str(), path_.c_str()) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat(path_, ": rename from ", temp_, " failed"));
  }
  temp_.clear();
  return SyncDirectory(dir_, path_);
}

namespace {

// The 8-byte header length and the JSON header after it, checked against the file's size;
// *header_size gets the header's length in bytes.
absl::StatusOr<Json> ReadHeader(int fd, uint64_t file_size, const std::string& path,
                                uint64_t* header_size) {
  if (file_size < 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: ", file_size,
                                            " bytes, less than the 8-byte header length"));
  }
  unsigned char length_bytes[8];
  WEFT_RETURN_IF_ERROR(ReadAllAt(fd, length_bytes, 8, 0, path));
  *header_size = 0;
  for (int i = 0; i < 8; ++i) *header_size |= static_cast<uint64_t>(length_bytes[i]) << (8 * i);
  if (*header_size > file_size - 8) {
    return absl::DataLossError(absl::StrCat(path, ": truncated: header length is ", *header_size,
                                            " bytes but only ", file_size - 8, " bytes follow it"));
  }
  if (*header_size > kMaxHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": header length ", *header_size,
                                            " exceeds the limit of ", kMaxHeaderBytes,
                                            " bytes; not a safetensors file?"));
  }
  std::string header_text(*header_size, '\0');
  WEFT_RETURN_IF_ERROR(ReadAllAt(fd, header_text.data(), *header_size, 8, path));
  Json header;
  try {
    header = Json::parse(header_text);
  } catch (const Json::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ": header is not valid JSON: ", e.what()));
  }
  if (!header.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": header JSON is not an object"));
  }
  return header;
}

// The "__metadata__" entry's string values into *metadata.
absl::Status ParseMetadata(const std::string& path, const Json& value,
                           std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) {
    return absl::DataLossError(absl::StrCat(path, ": \"", kMetadataKey, "\" is not a JSON object"));
  }
  for (const auto& [mkey, mvalue] : value.items()) {
    if (!mvalue.is_string()) {
      return absl::DataLossError(absl::StrCat(path, ": ", kMetadataKey, " value of \"", mkey,
                                              "\" is not a string: ", mvalue.dump()));
    }
    (*metadata)[mkey] = mvalue.get<std::string>();
  }
  return absl::OkStatus();
}

// The tensors must tile [0, data_size) exactly. Sorts `entries` by (begin, end), which puts
// empty tensors before a non-empty one at the same offset, so they never read as overlaps;
// stable keeps header order among equals.
absl::Status CheckTiling(const std::string& path, uint64_t data_size, std::vector<Entry>& entries) {
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      return absl::DataLossError(absl::StrCat(
          path, ": tensors \"", previous->name, "\" and \"", e.name, "\" overlap: [",
          previous->begin, ", ", previous->end, ") and [", e.begin, ", ", e.end, ")"));
    }
    if (e.begin > covered) {
      return absl::DataLossError(absl::StrCat(path, ": gap in the data section: bytes [", covered,
                                              ", ", e.begin, ") belong to no tensor (before \"",
                                              e.name, "\")"));
    }
    covered = e.end;
    previous = &e;
  }
  if (covered != data_size) {
    return absl::DataLossError(absl::StrCat(path, ": the data section has ", data_size,
                                            " bytes but the tensors cover only ", covered,
                                            " (trailing bytes after the last tensor)"));
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

// Opens `path` for reading; a regular file only. *size gets its length.
absl::StatusOr<int> OpenRegularFile(const std::string& path, uint64_t* size) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": file does not exist"));
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot stat: ", std::strerror(err)));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

struct ParsedFile {
  uint64_t data_start = 0;  // bytes before the data section
  std::vector<Entry> entries;  // in data-offset order
  std::map<std::string, std::string> metadata;
};

// The header of the open file `fd`, every check ReadSafetensors documents applied.
absl::StatusOr<ParsedFile> ParseFile(int fd, uint64_t file_size, const std::string& path,
                                     bool f32_only) {
  uint64_t header_size = 0;
  WEFT_ASSIGN_OR_RETURN(const Json header, ReadHeader(fd, file_size, path, &header_size));
  ParsedFile parsed;
  parsed.data_start = 8 + header_size;
  const uint64_t data_size = file_size - parsed.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      WEFT_RETURN_IF_ERROR(ParseMetadata(path, value, &parsed.metadata));
      continue;
    }
    WEFT_ASSIGN_OR_RETURN(Entry entry, ParseEntry(path, key, value, data_size, f32_only));
    parsed.entries.push_back(std::move(entry));
  }
  WEFT_RETURN_IF_ERROR(CheckTiling(path, data_size, parsed.entries));
  return parsed;
}

uint16_t LoadLe16(const unsigned char* p) {
  return static_cast<uint16_t>(p[0] | (static_cast<uint16_t>(p[1]) << 8));
}
uint32_t LoadLe32(const unsigned char* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}

// `n` elements of `dtype` at `bytes` (little-endian) to floats.
void DecodeToFloat(Dtype dtype, const unsigned char* bytes, size_t n, float* out) {
  switch (dtype) {
    case Dtype::kF32:
      if constexpr (kHostIsLittleEndian) {
        std::memcpy(out, bytes, n * sizeof(float));
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = std::bit_cast<float>(LoadLe32(bytes + 4 * i));
      }
      return;
    case Dtype::kBF16:
      for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(LoadLe16(bytes + 2 * i));
      return;
    case Dtype::kF16:
      for (size_t i = 0; i < n; ++i) out[i] = F16ToFloat(LoadLe16(bytes + 2 * i));
      return;
  }
}

}  // namespace

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  uint64_t file_size = 0;
  WEFT_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &file_size));
  absl::Cleanup closer = [fd] { close(fd); };
  WEFT_ASSIGN_OR_RETURN(ParsedFile parsed, ParseFile(fd, file_size, path, /*f32_only=*/true));
  SafetensorsFile result;
  result.metadata = std::move(parsed.metadata);
  result.tensors.reserve(parsed.entries.size());
  for (Entry& e : parsed.entries) {
    TensorData t;
    t.name = std::move(e.name);
    t.shape = std::move(e.shape);
    t.data.resize((e.end - e.begin) / sizeof(float));
    WEFT_RETURN_IF_ERROR(
        ReadAllAt(fd, t.data.data(), e.end - e.begin, parsed.data_start + e.begin, path));
    if constexpr (!kHostIsLittleEndian) {
      for (float& f : t.data) f = std::bit_cast<float>(ByteSwap32(std::bit_cast<uint32_t>(f)));
    }
    result.tensors.push_back(std::move(t));
  }
  return result;
}

absl::StatusOr<std::unique_ptr<SafetensorsReader>> SafetensorsReader::Open(
    const std::string& path) {
  uint64_t file_size = 0;
  WEFT_ASSIGN_OR_RETURN(const int fd, OpenRegularFile(path, &file_size));
  absl::Cleanup closer = [fd] { close(fd); };
  WEFT_ASSIGN_OR_RETURN(ParsedFile parsed, ParseFile(fd, file_size, path, /*f32_only=*/false));
  // ParseFile proved file_size >= 8, so the mapping is never empty.
  void* map = mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot memory-map: ", std::strerror(errno)));
  }
  // Reads land on scattered shard ranges: read-ahead of neighbouring pages is wasted.
  madvise(map, file_size, MADV_RANDOM);
  std::unique_ptr<SafetensorsReader> reader(new SafetensorsReader());
  reader->path_ = path;
  reader->map_ = static_cast<const unsigned char*>(map);
  reader->map_size_ = file_size;
  reader->metadata_ = std::move(parsed.metadata);
  for (Entry& e : parsed.entries) {
    Tensor t;
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.elements = static_cast<int64_t>((e.end - e.begin) / DtypeBytes(e.dtype));
    t.offset = parsed.data_start + e.begin;
    reader->by_name_[t.name] = reader->tensors_.size();
    reader->tensors_.push_back(std::move(t));
  }
  return reader;
}

SafetensorsReader::~SafetensorsReader() {
  if (map_ != nullptr) munmap(const_cast<unsigned char*>(map_), map_size_);
}

const SafetensorsReader::Tensor* SafetensorsReader::Find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

absl::Status SafetensorsReader::Read(const Tensor& tensor, int64_t begin, int64_t end,
                                     float* out) const {
  if (begin < 0 || begin > end || end > tensor.elements) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": tensor \"", tensor.name,
                                              "\": elements [", begin, ", ", end,
                                              ") out of range: it has ", tensor.elements));
  }
  const size_t bytes = DtypeBytes(tensor.dtype);
  DecodeToFloat(tensor.dtype, map_ + tensor.offset + static_cast<uint64_t>(begin) * bytes,
                static_cast<size_t>(end - begin), out);
  bytes_read_.fetch_add(static_cast<uint64_t>(end - begin) * bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace weft::model_io
