// The output conventions every trainctl subcommand shares (trainctl.cc talks to the
// coordinator, trainctl_checkpoints.cc to weft-checkpointd): errors on stderr as
// "trainctl: <message>" with exit status 1, tables of padded columns, and protobuf JSON with
// proto field names and every field, zeros included (scripts should find step 0).
#ifndef WEFT_CLIENT_TRAINCTL_OUTPUT_H_
#define WEFT_CLIENT_TRAINCTL_OUTPUT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace weft::trainctl {

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

#endif  // WEFT_CLIENT_TRAINCTL_OUTPUT_H_
