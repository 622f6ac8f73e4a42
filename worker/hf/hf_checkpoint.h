// A Hugging Face checkpoint directory, read lazily, and the import of one into a ZeRO engine.
//
// The directory holds config.json and either model.safetensors or the sharded form,
// model.safetensors.index.json (its "weight_map": tensor name -> file) plus the files it names
// (model-00001-of-0000N.safetensors, ...). Opening parses only headers; tensor bytes are read
// when asked for, from memory-mapped files.
//
// Import (HfImporter): ZeroEngine::Restore asks every rank for exactly its kept range of each
// unit; the importer's RangeReader serves "u<unit>.params" from the Hugging Face tensors that
// overlap that range (converted to fp32, vocabulary padding rows 0) and "u<unit>.m|v" as zeros,
// so a rank touches only the bytes of its own shard and never holds the whole model. For Llama
// (weights stored (out, in) like Weft's) a shard is one contiguous byte range per tensor. GPT-2's
// Conv1D weights are stored transposed: a block of Weft rows is a column block of the file, read
// as one short run per file row, so the bytes read stay about the share (plus up to a row at each
// end) but the pages touched spread over the whole tensor.
#ifndef WEFT_WORKER_HF_HF_CHECKPOINT_H_
#define WEFT_WORKER_HF_HF_CHECKPOINT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model_io/checkpoint_schema.h"
#include "worker/model_io/safetensors.h"
#include "worker/engine/model_arch.h"
#include "worker/hf/hf_mapping.h"
#include "weft/v1/job.pb.h"

namespace weft::hf {

inline constexpr char kHfConfigFile[] = "config.json";
inline constexpr char kHfSingleFile[] = "model.safetensors";
inline constexpr char kHfIndexFile[] = "model.safetensors.index.json";

class HfCheckpoint {
 public:
  // Reads config.json and every safetensors header. Errors name the file (and tensor):
  // NOT_FOUND for a missing directory, config.json, weights file or a file the index names;
  // DATA_LOSS for an index that is not {"weight_map": {name: file}}, a tensor the index lists
  // but its file lacks, or a malformed safetensors file; UNIMPLEMENTED for a dtype other than
  // F32, BF16 and F16.
  static absl::StatusOr<std::unique_ptr<HfCheckpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::string& config_text() const { return config_text_; }
  std::string config_path() const;

  struct Located {
    const model_io::SafetensorsReader* file = nullptr;
    const model_io::SafetensorsReader::Tensor* tensor = nullptr;
  };
  // The tensor `name`, or nullptr members when the checkpoint has none.
  Located Find(const std::string& name) const;
  // Every tensor name of the checkpoint (the index's, or the single file's).
  std::vector<std::string> TensorNames() const;

  // Tensor bytes read from all files so far.
  uint64_t bytes_read() const;

 private:
  HfCheckpoint() = default;
  absl::Status OpenIndexed();
  absl::Status OpenSingle();

  std::string dir_;
  std::string config_text_;
  std::map<std::string, std::unique_ptr<model_io::SafetensorsReader>> files_;  // by file name
  std::map<std::string, Located> tensors_;                                 // by tensor name
};

class HfImporter {
 public:
  // Opens `dir` for the model `spec` (a normalized ModelSpec): config.json must describe it
  // (CheckHfConfig: every unsupported key and mismatching field named) and every tensor of the
  // mapping must be present with its shape; a tensor Weft would not use is refused too, so that
  // nothing of the checkpoint is silently dropped. INVALID_ARGUMENT naming the file and tensor
  // otherwise (besides HfCheckpoint::Open's errors).
  static absl::StatusOr<std::unique_ptr<HfImporter>> Open(const std::string& dir,
                                                          const weft::v1::ModelSpec& spec);

  // The checkpoint as Weft's: "u<unit>.params" (elements [begin, end) of the unit, fp32),
  // "u<unit>.m" and "u<unit>.v" (zeros: the optimizer starts afresh). NOT_FOUND for another
  // name. Valid while this object lives.
  model_io::RangeReader Reader() const;
  // Elements [begin, end) of unit `unit`'s parameters.
  absl::Status ReadParams(int unit, int64_t begin, int64_t end, float* out) const;

  const HfCheckpoint& checkpoint() const { return *checkpoint_; }
  const engine::ModelArch& arch() const { return *arch_; }

 private:
  HfImporter() = default;
  struct Mapped {
    HfTensorMap map;
    HfCheckpoint::Located where;
  };
  // The part [begin, end) (elements of Weft's block) of the mapped tensor into `out`.
  absl::Status ReadBlock(const Mapped& m, int64_t begin, int64_t end, float* out) const;

  std::unique_ptr<HfCheckpoint> checkpoint_;
  std::unique_ptr<const engine::ModelArch> arch_;
  std::vector<std::vector<Mapped>> by_unit_;  // per unit, by offset
};

}  // namespace weft::hf

#endif  // WEFT_WORKER_HF_HF_CHECKPOINT_H_
