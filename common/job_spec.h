// JobSpec text parsing, defaults and validation, shared by trainctl (parse), the coordinator
// (defaults + validation on submit) and the worker (which trusts only validated specs).
#ifndef WEFT_COMMON_JOB_SPEC_H_
#define WEFT_COMMON_JOB_SPEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"

namespace weft {

// Parses a text-format JobSpec. `filename` only labels errors. On failure the status is
// INVALID_ARGUMENT with one line per problem as "file:line:column: message" (1-based, where
// the parser noticed: for an unknown field, the token after its name), e.g.
// `job.pb.txt:4:9: Message type "weft.v1.ModelSpec" has no field named "layers".`
absl::StatusOr<weft::v1::JobSpec> ParseJobSpecText(std::string_view text,
                                                   std::string_view filename);

// Reads and parses a text-format JobSpec file; errors (missing, a directory, unreadable,
// unparsable) name the file.
absl::StatusOr<weft::v1::JobSpec> ReadJobSpecFile(const std::string& path);

// Replaces every unset or zero field that has a documented default (job.proto) with it.
// Idempotent; leaves required fields and out-of-range values alone so that validation can
// name them.
void ApplyJobSpecDefaults(weft::v1::JobSpec* spec);

// Every violation in `spec`, each "field.path: what is wrong". Empty means valid. Meant to run
// after ApplyJobSpecDefaults.
std::vector<std::string> ValidateJobSpec(const weft::v1::JobSpec& spec);

// Applies defaults and validates; INVALID_ARGUMENT listing every violation, one per line.
absl::StatusOr<weft::v1::JobSpec> NormalizeJobSpec(weft::v1::JobSpec spec);

// Parameter count of the spec's model (its architecture, padded vocabulary, tied or untied
// head); engine::ModelArch::ParameterCount agrees (tests/worker/engine/model_arch_test.cc).
int64_t ModelParameterCount(const weft::v1::ModelSpec& model);

// The first field in which two models differ once their defaults are filled in, as "model.hidden_size: 256 here,
// 128 there" (`here` and `there` name the two sides); empty when they are the same model. A
// checkpoint of one restores into the other only when this is empty.
std::string ModelDifference(const weft::v1::ModelSpec& here, const weft::v1::ModelSpec& there,
                            std::string_view here_name, std::string_view there_name);

// Bytes one rank of `world` writes per checkpoint: the fp32 params, AdamW m and v of its
// shard, 12 * ceil(parameters / world) (exact at world 1; within 12 bytes a unit otherwise,
// since each unit is split separately). world < 1 counts as 1.
int64_t CheckpointRankBytes(const weft::v1::ModelSpec& model, int world);

}  // namespace weft

#endif  // WEFT_COMMON_JOB_SPEC_H_
