// The trained model as one portable file: safetensors, one tensor per parameter (named as in
// the architecture's unit layout, engine/model_arch.h), with the JobSpec it was trained under in
// the metadata. Written by rank 0 at the end of a job; read by `trainctl sample`.
#ifndef WEFT_WORKER_MODEL_IO_H_
#define WEFT_WORKER_MODEL_IO_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/safetensors.h"
#include "worker/engine/model_arch.h"
#include "weft/v1/job.pb.h"

namespace weft::worker {

// `units`: every unit's full (unpadded) parameters, in unit order.
absl::Status SaveModel(const std::string& path, const weft::v1::JobSpec& spec,
                       const std::vector<std::vector<float>>& units);

// SaveModel's file written a unit at a time, so that the writer holds one unit, never the whole
// model: Begin announces every tensor (the header's offsets come from the architecture's
// tensor tables, before any data), WriteUnit appends unit 0, 1, ... in order, Commit makes the
// file appear under `path`. Until then the bytes live in a temporary file beside `path` (removed
// if the writer is destroyed uncommitted), so a reader never sees a partial model. The bytes
// equal SaveModel's for the same parameters.
class ModelFileWriter {
 public:
  // `extra_metadata`: entries written next to the JobSpec and the format tag (a key of theirs
  // is refused: INVALID_ARGUMENT). Errors: a spec no architecture takes, or the file's
  // (data::SafetensorsWriter::Begin).
  static absl::StatusOr<std::unique_ptr<ModelFileWriter>> Begin(
      const std::string& path, const weft::v1::JobSpec& spec,
      const std::map<std::string, std::string>& extra_metadata = {});

  // Unit `params` (its UnitSize unpadded floats) as the next unit. FAILED_PRECONDITION for a
  // unit out of order or of the wrong size; a failed write is the file's error.
  absl::Status WriteUnit(int unit, const std::vector<float>& params);
  // FAILED_PRECONDITION until every unit was written.
  absl::Status Commit();

 private:
  ModelFileWriter() = default;

  std::string path_;
  std::unique_ptr<const engine::ModelArch> arch_;
  std::unique_ptr<data::SafetensorsWriter> file_;
  int next_unit_ = 0;
};

struct LoadedModel {
  weft::v1::JobSpec spec;
  std::shared_ptr<const engine::ModelArch> arch;
  std::vector<std::vector<float>> units;
};

// Errors name the file: unreadable, not safetensors, no weft.job_spec metadata, a model spec no
// architecture takes, a tensor missing or of the wrong shape.
absl::StatusOr<LoadedModel> LoadModel(const std::string& path);

// The model's logits for `tokens` (one sequence, 1 <= length <= context): (T, vocab_size)
// row-major, padding columns left out. INVALID_ARGUMENT for an empty or too long sequence or an
// id outside [0, vocab_size). What `trainctl model logits` prints, to compare with another
// implementation (tests/fixtures/hf/check_export.py compares it with transformers).
absl::StatusOr<std::vector<float>> ModelLogits(const LoadedModel& model,
                                               const std::vector<int32_t>& tokens);

struct SampleOptions {
  int tokens = 200;
  // 0: always the most likely token.
  float temperature = 0.8f;
  // 0: sample from every token.
  int top_k = 40;
  uint64_t seed = 1;
};

// Continues `prompt`. Byte-level models (vocab 256) read and write text; other models read the
// prompt as whitespace-separated token ids and write ids.
absl::StatusOr<std::string> GenerateText(const LoadedModel& model, const std::string& prompt,
                                         const SampleOptions& options);

}  // namespace weft::worker

#endif  // WEFT_WORKER_MODEL_IO_H_
