// Export of a Weft model to a Hugging Face directory that transformers' from_pretrained loads:
// config.json (HfConfigJson, with the tokenizer's bos/eos/pad ids, null where it has none),
// generation_config.json (the same ids), the weights named and shaped as Hugging Face's
// (hf_mapping.h), vocabulary padding dropped, in one model.safetensors or, past the shard size,
// in model-0000k-of-0000N.safetensors files with model.safetensors.index.json, and the
// tokenizer's files (hf_tokenizer.h) when the model has one, so that
// pipeline("text-generation", model=DIR) makes text from the directory alone.
#ifndef WEFT_WORKER_HF_HF_EXPORT_H_
#define WEFT_WORKER_HF_HF_EXPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model_io/safetensors.h"
#include "worker/data/tokenizer.h"
#include "worker/hf/hf_mapping.h"
#include "weft/v1/job.pb.h"

namespace weft::hf {

struct HfExportOptions {
  model_io::Dtype dtype = model_io::Dtype::kF32;
  // A file holds tensors up to this many bytes (a larger tensor gets a file of its own);
  // transformers' default is 5 GB.
  uint64_t max_shard_bytes = 5'000'000'000;
  // The tokens' tokenizer; null: none known (config ids null, no tokenizer files).
  std::shared_ptr<const data::Tokenizer> tokenizer;
};

// Hugging Face's tensor `m` taken out of `units` (every unit's parameters, in unit order),
// transposed back where Hugging Face stores the transpose.
model_io::TensorData HfTensorFromUnits(const HfTensorMap& m,
                                   const std::vector<std::vector<float>>& units);

// Writes the model `spec` (normalized) with parameters `units` (every unit's, unpadded, in
// unit order) to `out_dir`, atomically: everything goes to a temporary directory beside it,
// renamed into place once complete, so `out_dir` either does not exist or is whole.
// INVALID_ARGUMENT for units that do not fit the spec or a max_shard_bytes of 0, or a tokenizer
// with more tokens than the model's vocabulary; a tokenizer HfTokenizerFilesFor refuses;
// ALREADY_EXISTS when `out_dir` exists and is not an empty directory; the errno-derived code of
// a failing system call otherwise, naming the path.
absl::Status ExportHf(const std::string& out_dir, const weft::v1::ModelSpec& spec,
                      const std::vector<std::vector<float>>& units,
                      const HfExportOptions& options);

}  // namespace weft::hf

#endif  // WEFT_WORKER_HF_HF_EXPORT_H_
