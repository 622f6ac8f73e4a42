// Fuzzes the path a submitted spec takes: ParseJobSpecText (trainctl), then, for whatever
// parses, NormalizeJobSpec (the coordinator's defaults and validation). Every input must come
// back as a spec or a Status; crashes, sanitizer reports and broken invariants are findings.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "google/protobuf/util/message_differencer.h"
#include "tests/fuzz/require.h"

using weft::fuzz::Require;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<weft::v1::JobSpec> parsed = weft::ParseJobSpecText(text, "fuzz.pb.txt");
  if (!parsed.ok()) {
    // trainctl prints the message as the user's only hint, so it must say something.
    Require(parsed.status().code() == absl::StatusCode::kInvalidArgument,
            "a parse error is INVALID_ARGUMENT");
    Require(!parsed.status().message().empty(), "a parse error has a message");
    return 0;
  }

  absl::StatusOr<weft::v1::JobSpec> normalized = weft::NormalizeJobSpec(*parsed);
  if (!normalized.ok()) {
    Require(normalized.status().code() == absl::StatusCode::kInvalidArgument,
            "a rejected spec is INVALID_ARGUMENT");
    Require(!normalized.status().message().empty(), "a rejected spec says why");
    return 0;
  }

  // The coordinator stores the normalized spec and workers re-check it, so it must be a fixed
  // point: still valid, and unchanged by applying the defaults again.
  Require(weft::ValidateJobSpec(*normalized).empty(), "a normalized spec validates");
  weft::v1::JobSpec again = *normalized;
  weft::ApplyJobSpecDefaults(&again);
  Require(google::protobuf::util::MessageDifferencer::Equals(again, *normalized),
          "defaults are idempotent");
  // The coordinator counts parameters of every accepted spec: the bounds must keep it from
  // overflowing (UBSan aborts on signed overflow).
  Require(weft::ModelParameterCount(normalized->model()) > 0, "a valid model has parameters");
  return 0;
}
