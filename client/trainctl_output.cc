#include "client/trainctl_output.h"

#include <algorithm>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace weft::trainctl {

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

absl::Status PrintJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = pretty;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print JSON: ", status.ToString()));
  }
  std::cout << json;
  if (!pretty || json.empty() || json.back() != '\n') std::cout << "\n";
  std::cout.flush();
  return absl::OkStatus();
}

int PrintJsonExit(const google::protobuf::Message& message, bool pretty) {
  absl::Status printed = PrintJson(message, pretty);
  return printed.ok() ? 0 : Fail(printed);
}

}  // namespace weft::trainctl
