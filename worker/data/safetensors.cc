#include "worker/data/safetensors.h"

#include <fcntl.h>
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

namespace weft::data {
namespace {

// ordered_json keeps keys in insertion (and, when parsing, file) order, so the header lists the
// tensors in the order they are laid out: easier to read with `head -c`, and stable bytes.
using Json = nlohmann::ordered_json;

constexpr char kMetadataKey[] = "__metadata__";
constexpr char kF32[] = "F32";
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

absl::Status WriteFloats(int fd, const std::vector<float>& values, const std::string& what) {
  if constexpr (kHostIsLittleEndian) {
    return WriteAll(fd, values.data(), values.size() * sizeof(float), what);
  } else {
    // Bounded staging buffer: converting a multi-GB tensor at once would double its memory.
    constexpr size_t kChunk = 1 << 16;
    std::vector<uint32_t> buffer;
    for (size_t i = 0; i < values.size(); i += kChunk) {
      const size_t n = std::min(kChunk, values.size() - i);
      buffer.resize(n);
      std::memcpy(buffer.data(), values.data() + i, n * sizeof(float));
      for (uint32_t& v : buffer) v = ByteSwap32(v);
      WEFT_RETURN_IF_ERROR(WriteAll(fd, buffer.data(), n * sizeof(float), what));
    }
    return absl::OkStatus();
  }
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
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Parses one tensor's header entry; `data_size` is the length of the data section.
absl::StatusOr<Entry> ParseEntry(const std::string& path, const std::string& name,
                                 const Json& value, uint64_t data_size) {
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
  if (dtype_name != kF32) {
    return absl::UnimplementedError(absl::StrCat(where, "unsupported dtype ", dtype_name,
                                                 "; only ", kF32, " is supported"));
  }
  const absl::StatusOr<int64_t> elements = ElementCount(entry.shape);
  uint64_t expected_bytes = 0;
  if (!elements.ok() ||
      __builtin_mul_overflow(static_cast<uint64_t>(*elements), sizeof(float), &expected_bytes)) {
    return absl::DataLossError(
        absl::StrCat(where, "shape ", ShapeString(entry.shape), " is too large"));
  }
  if (entry.end - entry.begin != expected_bytes) {
    return absl::DataLossError(absl::StrCat(
        where, "shape/size mismatch: shape ", ShapeString(entry.shape), " of ", kF32, " needs ",
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

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorData& t : tensors) {
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
    const absl::StatusOr<int64_t> elements = ElementCount(t.shape);
    if (!elements.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", t.name, "\": shape ",
                                                     ShapeString(t.shape), ": ",
                                                     elements.status().message()));
    }
    if (static_cast<uint64_t>(*elements) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor \"", t.name, "\": shape ", ShapeString(t.shape), " has ", *elements,
          " elements but data has ", t.data.size()));
    }
    const uint64_t bytes = t.data.size() * sizeof(float);
    Json entry = Json::object();
    entry["dtype"] = kF32;
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[t.name] = std::move(entry);
    offset += bytes;
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
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header_text.size() >> (8 * i));

  // The temporary file must be in the destination's directory: rename is atomic only within
  // one filesystem.
  const std::filesystem::path fs_path(path);
  const std::string dir =
      fs_path.has_parent_path() ? fs_path.parent_path().string() : std::string(".");
  std::string temp = path + ".tmp.XXXXXX";
  const int fd = mkstemp(temp.data());
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create temporary file ", temp));
  }
  bool fd_open = true;
  absl::Cleanup cleanup = [&] {
    if (fd_open) close(fd);
    unlink(temp.c_str());
  };
  // mkstemp creates 0600; a model file is meant to be shared like any other output.
  if (fchmod(fd, 0644) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": chmod of ", temp, " failed"));
  }
  WEFT_RETURN_IF_ERROR(WriteAll(fd, length, sizeof(length), path));
  WEFT_RETURN_IF_ERROR(WriteAll(fd, header_text.data(), header_text.size(), path));
  for (const TensorData& t : tensors) WEFT_RETURN_IF_ERROR(WriteFloats(fd, t.data, path));
  // fsync before rename: otherwise a crash can leave the new name pointing at missing data.
  if (fsync(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": fsync failed"));
  fd_open = false;
  if (close(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": close failed"));
  if (rename(temp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": rename from ", temp, " failed"));
  }
  std::move(cleanup).Cancel();
  return SyncDirectory(dir, path);
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

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": file does not exist"));
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot open: ", std::strerror(err)));
  }
  absl::Cleanup closer = [fd] { close(fd); };
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  }
  const auto file_size = static_cast<uint64_t>(st.st_size);
  uint64_t header_size = 0;
  WEFT_ASSIGN_OR_RETURN(const Json header, ReadHeader(fd, file_size, path, &header_size));

  const uint64_t data_start = 8 + header_size;
  const uint64_t data_size = file_size - data_start;
  SafetensorsFile result;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      WEFT_RETURN_IF_ERROR(ParseMetadata(path, value, &result.metadata));
      continue;
    }
    WEFT_ASSIGN_OR_RETURN(Entry entry, ParseEntry(path, key, value, data_size));
    entries.push_back(std::move(entry));
  }
  WEFT_RETURN_IF_ERROR(CheckTiling(path, data_size, entries));

  result.tensors.reserve(entries.size());
  for (Entry& e : entries) {
    TensorData t;
    t.name = std::move(e.name);
    t.shape = std::move(e.shape);
    t.data.resize((e.end - e.begin) / sizeof(float));
    WEFT_RETURN_IF_ERROR(
        ReadAllAt(fd, t.data.data(), e.end - e.begin, data_start + e.begin, path));
    if constexpr (!kHostIsLittleEndian) {
      for (float& f : t.data) f = std::bit_cast<float>(ByteSwap32(std::bit_cast<uint32_t>(f)));
    }
    result.tensors.push_back(std::move(t));
  }
  return result;
}

}  // namespace weft::data
