#include "trainctl/trainctl_output.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"

namespace weft::trainctl {

std::string ShortEnumName(const std::string& name, absl::string_view prefix) {
  return std::string(absl::StripPrefix(name, prefix));
}

std::string StateName(weft::v1::JobState state) {
  return ShortEnumName(weft::v1::JobState_Name(state), "JOB_STATE_");
}

bool HasTime(const google::protobuf::Timestamp& t) { return t.seconds() != 0 || t.nanos() != 0; }

int Fail(const absl::Status& status) {
  std::cerr << "trainctl: " << status.message() << "\n";
  return 1;
}

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i > 0) line += "  ";
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size(), ' ');
    }
    std::cout << line << "\n";
  }
}

namespace {

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  return json;
}

}  // namespace

absl::Status PrintJson(const google::protobuf::Message& message, bool pretty) {
  absl::StatusOr<std::string> converted = ToJson(message, pretty);
  if (!converted.ok()) return converted.status();
  const std::string& json = *converted;
  std::cout << json;
  if (!pretty || json.empty() || json.back() != '\n') std::cout << "\n";
  std::cout.flush();
  return absl::OkStatus();
}

int PrintJsonExit(const google::protobuf::Message& message, bool pretty) {
  absl::Status printed = PrintJson(message, pretty);
  return printed.ok() ? 0 : Fail(printed);
}

absl::Status PrintJsonLine(const google::protobuf::Message& message) {
  return PrintJson(message, /*pretty=*/false);
}

absl::StatusOr<nlohmann::json> ProtoToJson(const google::protobuf::Message& message) {
  absl::StatusOr<std::string> json = ToJson(message, /*pretty=*/false);
  if (!json.ok()) return json.status();
  nlohmann::json value = nlohmann::json::parse(*json, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::InternalError("cannot read back the JSON printed");
  return value;
}

int PrintJsonObject(const nlohmann::json& object) {
  std::cout << object.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  std::cout.flush();
  return 0;
}

namespace {

// Optimal string alignment distance: edits with swaps of neighbouring characters, so that
// "sumbit" is one edit from "submit".
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string ClosestName(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  size_t best_distance = 3;  // more than two edits is not a typo
  for (const std::string& name : names) {
    const size_t distance = EditDistance(word, name);
    if (distance < best_distance && 2 * distance < word.size()) {
      best = name;
      best_distance = distance;
    }
  }
  return best;
}

}  // namespace weft::trainctl
