// safetensors: Weft's portable model file (the final model of a job now, checkpoint export
// later), readable by the Hugging Face `safetensors` library and anything else that speaks it.
//
// Layout: an 8-byte little-endian unsigned header length N; N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// padded with spaces so that N is a multiple of 8 (the data then starts 8-byte aligned); then
// the tensor bytes, little-endian, with [begin, end) relative to the start of the data.
//
// WriteSafetensors and ReadSafetensors handle whole files of F32 tensors (Weft's own model
// files); SafetensorsReader reads F32, BF16 and F16 tensors of any file in place, element range
// by element range (Hugging Face checkpoints), and the writer also writes BF16 and F16.
#ifndef WEFT_WORKER_MODEL_IO_SAFETENSORS_H_
#define WEFT_WORKER_MODEL_IO_SAFETENSORS_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace weft::model_io {

struct TensorData {
  std::string name;
  std::vector<int64_t> shape;  // {} is a scalar (one element)
  std::vector<float> data;     // row-major, product(shape) elements
};

// Writes `tensors` (their data laid out back to back, in the order given, header keys in the
// same order, "__metadata__" last and left out when `metadata` is empty) and `metadata`.
//
// Atomic: the bytes go to a temporary file in the same directory, which is fsynced and then
// renamed over `path` (and the directory fsynced, so the rename survives a crash). A reader
// sees either the old file or the complete new one, never a partial file; on failure the
// temporary file is removed and `path` is untouched.
//
// Errors: INVALID_ARGUMENT (naming the tensor) for an empty, duplicate or "__metadata__" name,
// a negative dimension, a shape whose element count differs from data.size(), or a name or
// metadata string that is not valid UTF-8; otherwise the errno-derived code of the failing
// system call (NOT_FOUND for a missing directory, PERMISSION_DENIED, RESOURCE_EXHAUSTED for
// a full disk, ...), with a message naming `path`.
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Tensor element types Weft reads and writes ("F32", "BF16", "F16" in the header).
enum class Dtype { kF32, kBF16, kF16 };
const char* DtypeName(Dtype dtype);
size_t DtypeBytes(Dtype dtype);

// The same, every tensor stored as `dtype`: floats are rounded to the nearest representable
// value, ties to even (BF16 keeps NaN a NaN; F16 overflows to infinity like any IEEE cast).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorData>& tensors,
                              const std::map<std::string, std::string>& metadata, Dtype dtype);

// A tensor announced by its name and shape, its data to come: what a streamed file's header
// is made of.
struct TensorHeader {
  std::string name;
  std::vector<int64_t> shape;
};

// Writes a safetensors file whose data arrives in pieces, so that a file larger than memory
// (a model gathered unit by unit) never exists whole in memory. The header, which gives every
// tensor's offset, is written first from the names and shapes alone; Append then streams the
// data section in layout order (a piece may end mid-tensor or span tensors), and Commit makes
// the file appear. The bytes are exactly WriteSafetensors' for the same tensors and metadata
// (WriteSafetensors is this writer fed whole tensors), and so is the atomicity: until Commit
// succeeds the data lives in a temporary file beside `path`, which the destructor removes.
class SafetensorsWriter {
 public:
  // Creates the temporary file and writes the header. Errors: WriteSafetensors' (bad names,
  // shapes and UTF-8 are INVALID_ARGUMENT; a failing system call its errno's code), naming
  // `path`.
  static absl::StatusOr<std::unique_ptr<SafetensorsWriter>> Begin(
      const std::string& path, const std::vector<TensorHeader>& tensors,
      const std::map<std::string, std::string>& metadata, Dtype dtype = Dtype::kF32);
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next `n` elements of the data section, converted to the file's dtype. FAILED_PRECONDITION
  // for more elements than the header has left, or after Commit or a failed write (a failed
  // write leaves the writer unusable).
  absl::Status Append(const float* values, size_t n);
  // Syncs the file and renames it over `path` (then syncs the directory). FAILED_PRECONDITION
  // while elements the header announced are missing.
  absl::Status Commit();

 private:
  SafetensorsWriter() = default;

  std::string path_;
  std::string dir_;
  std::string temp_;  // empty once renamed (nothing to remove)
  int fd_ = -1;
  Dtype dtype_ = Dtype::kF32;
  uint64_t remaining_ = 0;  // elements the header announced that are not written yet
};

struct SafetensorsFile {
  std::vector<TensorData> tensors;  // in data-offset order (= the order they were written)
  std::map<std::string, std::string> metadata;
};

// Reads a whole safetensors file of F32 tensors. The file is validated as strictly as the
// reference implementation does: the tensors must tile the data section exactly (no overlap,
// no gap, no trailing bytes), so any truncation or stray write is caught.
//
// Errors, each naming the file (and the tensor, where there is one):
//  - NOT_FOUND: no such file.
//  - FAILED_PRECONDITION: not a regular file, or cannot be opened or read.
//  - DATA_LOSS: the file is not a well-formed safetensors file: truncated (shorter than the
//    8-byte length, or than the header it announces), header JSON unparsable or not an object,
//    a tensor entry or __metadata__ of the wrong form, shape/size mismatch, data_offsets out of
//    range, overlapping, leaving a gap, or not covering the data section.
//  - UNIMPLEMENTED: a well-formed tensor of a dtype other than F32.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

// A safetensors file mapped into memory, read lazily: Open parses and checks only the header
// (every check of ReadSafetensors, F32, BF16 and F16 accepted; another dtype is UNIMPLEMENTED
// naming it), and Read converts an element range of one tensor to float, touching only the
// pages of those bytes. That is how a rank imports its shard of a model far larger than its
// memory. Thread-safe for concurrent Reads.
//
// The file must not shrink while mapped (a read past its new end faults, as with any mapping);
// checkpoints are not rewritten in place.
class SafetensorsReader {
 public:
  struct Tensor {
    std::string name;
    Dtype dtype = Dtype::kF32;
    std::vector<int64_t> shape;
    int64_t elements = 0;
    uint64_t offset = 0;  // of its first byte in the file
  };

  static absl::StatusOr<std::unique_ptr<SafetensorsReader>> Open(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  // In data-offset order.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // nullptr when the file has no tensor `name`.
  const Tensor* Find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Elements [begin, end) of `tensor` (one of tensors()), flat row-major, as floats into `out`.
  // OUT_OF_RANGE naming the file and tensor for a range outside it.
  absl::Status Read(const Tensor& tensor, int64_t begin, int64_t end, float* out) const;

  // Tensor bytes Read has touched so far (headers excluded): what tests check to prove that a
  // rank reads its share only.
  uint64_t bytes_read() const { return bytes_read_.load(std::memory_order_relaxed); }

 private:
  SafetensorsReader() = default;

  std::string path_;
  const unsigned char* map_ = nullptr;
  uint64_t map_size_ = 0;
  std::vector<Tensor> tensors_;
  std::map<std::string, size_t> by_name_;
  std::map<std::string, std::string> metadata_;
  mutable std::atomic<uint64_t> bytes_read_{0};
};

}  // namespace weft::model_io

#endif  // WEFT_WORKER_MODEL_IO_SAFETENSORS_H_
