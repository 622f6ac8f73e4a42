// The output conventions every trainctl subcommand shares (trainctl.cc talks to the
// coordinator, trainctl_checkpoints.cc to weft-checkpointd, trainctl_data.cc and
// trainctl_model.cc to local files). One rule, in both output modes:
//
// - -o text (the default) is for people: tables of padded columns and one-line summaries.
// - -o json is for scripts. A command that answers once prints one JSON object, indented:
//   the response message of its RPC as protobuf JSON (PrintJsonExit, PrintListJson: proto field
//   names, every field with zeros included so that scripts find step 0, enums by name, 64-bit
//   integers as strings, times in RFC 3339), or, where there is no response message to print
//   (local work, empty answers, a view such as `events`), an object with snake_case keys that
//   docs/deploy.md lists (PrintJsonObject). A command that follows something until it ends
//   (`watch`, `events -f`, `logs -f`) prints one compact object per line as it comes (JSON
//   Lines, PrintJsonLine). `model logits` prints JSON in both modes, on one line (its arrays
//   are large).
// - Errors go to stderr as "trainctl: <message>" with exit status 1, in both modes, and never
//   as JSON on stdout. A command whose answer is itself a failure (`watch` or a follow of a
//   job that did not succeed, `model diff` beyond its tolerance) prints that answer first.
//   Warnings and progress go to stderr too, so that stdout holds only the answer.
#ifndef WEFT_TRAINCTL_TRAINCTL_OUTPUT_H_
#define WEFT_TRAINCTL_TRAINCTL_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "nlohmann/json.hpp"
#include "weft/v1/job.pb.h"

namespace weft::trainctl {

// The part of a proto enum name people read: without the prefix that only keeps C++
// enumerators unique ("DEVICE_KIND_CPU" -> "CPU").
std::string ShortEnumName(const std::string& name, absl::string_view prefix);
// "RUNNING" for JOB_STATE_RUNNING.
std::string StateName(weft::v1::JobState state);
// Whether a proto timestamp was set (all zero: not).
bool HasTime(const google::protobuf::Timestamp& t);

// Prints "trainctl: <message>" on stderr; returns the exit status, 1.
int Fail(const absl::Status& status);

// The name among `names` closest to a mistyped `word`, for "did you mean": at most two edits
// (insertions, deletions, substitutions, swaps of neighbours) away and fewer than half of
// `word`'s length; the first such of the fewest edits; "" when none is that close.
std::string ClosestName(const std::string& word, const std::vector<std::string>& names);

// Rows as columns separated by two spaces; the last column is not padded so that a long
// message does not drag trailing blanks.
void PrintTable(const std::vector<std::vector<std::string>>& rows);

// `message` as JSON on stdout: indented when `pretty`, else on one line; ends with a newline.
absl::Status PrintJson(const google::protobuf::Message& message, bool pretty);

// PrintJson(message, pretty) as an exit status (0, or Fail's).
int PrintJsonExit(const google::protobuf::Message& message, bool pretty = true);

// One message of a stream: PrintJson on one line, flushed.
absl::Status PrintJsonLine(const google::protobuf::Message& message);

// The protobuf JSON of `message` (as PrintJson prints it) as a value to put in an object.
absl::StatusOr<nlohmann::json> ProtoToJson(const google::protobuf::Message& message);

// The answer of a command without a response message: `object` indented like PrintJson's,
// invalid UTF-8 in its strings replaced (U+FFFD). Returns the exit status, 0.
int PrintJsonObject(const nlohmann::json& object);

// Prints `items` as the JSON of the list response `Response` whose repeated field
// `field` holds them (e.g. ListJobsResponse::mutable_jobs), so that -o json shows the RPC's
// own response object. Returns the exit status.
template <typename Response, typename Item>
int PrintListJson(std::vector<Item> items,
                  google::protobuf::RepeatedPtrField<Item>* (Response::*field)()) {
  Response response;
  for (Item& item : items) *(response.*field)()->Add() = std::move(item);
  return PrintJsonExit(response);
}

}  // namespace weft::trainctl

#endif  // WEFT_TRAINCTL_TRAINCTL_OUTPUT_H_
