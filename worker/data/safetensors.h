// safetensors: Weft's portable model file (the final model of a job now, checkpoint export
// later), readable by the Hugging Face `safetensors` library and anything else that speaks it.
//
// Layout: an 8-byte little-endian unsigned header length N; N bytes of UTF-8 JSON
//   {"<name>": {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value", ...}}
// padded with spaces so that N is a multiple of 8 (the data then starts 8-byte aligned); then
// the tensor bytes, little-endian, with [begin, end) relative to the start of the data.
//
// This implementation writes and reads F32 only (all Weft keeps outside the training engine).
#ifndef WEFT_WORKER_DATA_SAFETENSORS_H_
#define WEFT_WORKER_DATA_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace weft::data {

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

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_SAFETENSORS_H_
