#include "trainctl/data_inputs.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/data/tokenizer.h"

namespace weft::dataprep {
namespace {

namespace fs = std::filesystem;

// A JSON type's name with its article: "an object", "a string".
std::string ATypeName(const nlohmann::json& value) {
  const absl::string_view name = value.type_name();
  const bool vowel =
      !name.empty() && absl::string_view("aeiou").find(name[0]) != absl::string_view::npos;
  return absl::StrCat(vowel ? "an " : "a ", name);
}

bool IsGlob(const std::string& input) { return input.find_first_of("*?[") != std::string::npos; }

bool IsHidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

absl::StatusOr<SourceFile> StatFile(const std::string& path, const std::string& argument) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(argument, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a regular file (input ", argument, ")"));
  }
  if (st.st_size == 0) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": empty file"));
  }
  SourceFile file;
  file.path = fs::absolute(path).lexically_normal().string();
  file.bytes = st.st_size;
  file.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  file.jsonl = absl::EndsWith(path, ".jsonl");
  return file;
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) {
  glob_t matches{};
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> paths;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) paths.push_back(matches.gl_pathv[i]);
  ::globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && paths.empty())) {
    return absl::InvalidArgumentError(absl::StrCat("no file matches the glob ", pattern));
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("glob ", pattern, ": cannot be read"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code error;
  fs::recursive_directory_iterator it(dir, error), end;
  for (; !error && it != end; it.increment(error)) {
    if (IsHidden(it->path())) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) paths.push_back(it->path().string());
  }
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot list the directory: ", error.message()));
  }
  if (paths.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("directory ", dir, " has no files"));
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

}  // namespace

absl::StatusOr<std::vector<SourceFile>> ExpandInputs(const std::vector<std::string>& inputs) {
  if (inputs.empty()) return absl::InvalidArgumentError("no inputs given");
  std::vector<SourceFile> files;
  std::set<std::string> seen;
  for (const std::string& input : inputs) {
    std::vector<std::string> paths;
    std::error_code error;
    if (fs::is_directory(input, error)) {
      WEFT_ASSIGN_OR_RETURN(paths, ListDirectory(input));
    } else if (!fs::exists(input, error) && IsGlob(input)) {
      WEFT_ASSIGN_OR_RETURN(paths, Glob(input));
    } else {
      paths = {input};
    }
    for (const std::string& path : paths) {
      WEFT_ASSIGN_OR_RETURN(SourceFile file, StatFile(path, input));
      if (seen.insert(file.path).second) files.push_back(std::move(file));
    }
  }
  return files;
}

absl::StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", std::strerror(error)));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* base = ::mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (base == MAP_FAILED) {
      const int error = errno;
      ::close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": cannot map the file: ", std::strerror(error)));
    }
    // Read front to back once.
    ::madvise(base, file->size_, MADV_SEQUENTIAL);
    file->base_ = base;
  }
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() {
  if (base_ != nullptr) ::munmap(base_, size_);
}

absl::Status ForEachRawDocument(absl::string_view contents, bool jsonl,
                                const std::string& separator,
                                const std::function<absl::Status(const RawDocument&)>& fn) {
  const bool split = jsonl || !separator.empty();
  if (!split) return fn(RawDocument{contents, 1});
  size_t doc_start = 0;  // text: where the current document began
  int64_t doc_line = 1;
  int64_t line = 1;
  size_t pos = 0;
  while (pos < contents.size()) {
    const size_t newline = contents.find('\n', pos);
    const size_t end = newline == absl::string_view::npos ? contents.size() : newline;
    absl::string_view body = contents.substr(pos, end - pos);
    if (!body.empty() && body.back() == '\r') body.remove_suffix(1);
    const size_t next = newline == absl::string_view::npos ? contents.size() : newline + 1;
    if (jsonl) {
      if (body.find_first_not_of(" \t") != absl::string_view::npos) {
        WEFT_RETURN_IF_ERROR(fn(RawDocument{body, line}));
      }
    } else if (body == separator) {
      if (pos > doc_start) {
        WEFT_RETURN_IF_ERROR(fn(RawDocument{contents.substr(doc_start, pos - doc_start), doc_line}));
      }
      doc_start = next;
      doc_line = line + 1;
    }
    pos = next;
    ++line;
  }
  if (!jsonl && contents.size() > doc_start) {
    WEFT_RETURN_IF_ERROR(fn(RawDocument{contents.substr(doc_start), doc_line}));
  }
  return absl::OkStatus();
}

absl::Status CheckUtf8(absl::string_view text, const std::string& path, int64_t first_line) {
  const std::optional<size_t> bad = data::FindInvalidUtf8(text);
  if (!bad) return absl::OkStatus();
  const absl::string_view before = text.substr(0, *bad);
  const int64_t line = first_line + std::count(before.begin(), before.end(), '\n');
  const size_t line_start = before.rfind('\n');
  const size_t column = line_start == absl::string_view::npos ? *bad + 1 : *bad - line_start;
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s:%d: invalid UTF-8 (byte 0x%02X at column %d)", path, line,
      static_cast<unsigned char>(text[*bad]), column));
}

absl::StatusOr<std::string> JsonlDocument(absl::string_view json_line, const std::string& field,
                                          const std::string& path, int64_t line) {
  WEFT_RETURN_IF_ERROR(CheckUtf8(json_line, path, line));
  const std::string where = absl::StrCat(path, ":", line, ": ");
  nlohmann::json value = nlohmann::json::parse(json_line.begin(), json_line.end(), nullptr,
                                               /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "not a JSON value"));
  }
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "a JSON ", value.type_name(), ", not an object with a \"", field,
                     "\" field"));
  }
  auto it = value.find(field);
  if (it == value.end()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "no field \"", field, "\""));
  }
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(where, "field \"", field, "\" is a ",
                                                   it->type_name(), ", not a string"));
  }
  return it->get<std::string>();
}

absl::StatusOr<std::vector<data::ChatMessage>> JsonlConversation(absl::string_view json_line,
                                                                 const std::string& path,
                                                                 int64_t line) {
  WEFT_RETURN_IF_ERROR(CheckUtf8(json_line, path, line));
  const std::string where = absl::StrCat(path, ":", line, ": ");
  const auto error = [&](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(where, field, field.empty() ? "" : ": ", what));
  };
  const nlohmann::json value = nlohmann::json::parse(json_line.begin(), json_line.end(), nullptr,
                                                     /*allow_exceptions=*/false);
  if (value.is_discarded()) return error("", "not a JSON value");
  if (!value.is_object()) {
    return error("", absl::StrCat(ATypeName(value),
                                  ", not an object with \"messages\" or \"prompt\" and "
                                  "\"completion\""));
  }
  // A string field of `object`, named `name` in errors.
  const auto string_field = [&](const nlohmann::json& object, const std::string& key,
                                const std::string& name) -> absl::StatusOr<std::string> {
    auto it = object.find(key);
    if (it == object.end()) return error(name, "missing");
    if (!it->is_string()) {
      return error(name, absl::StrCat(ATypeName(*it), ", not a string"));
    }
    return it->get<std::string>();
  };
  std::vector<data::ChatMessage> messages;
  auto list = value.find("messages");
  if (list == value.end()) {
    if (!value.contains("prompt") && !value.contains("completion")) {
      return error("", "no \"messages\", nor \"prompt\" and \"completion\"");
    }
    WEFT_ASSIGN_OR_RETURN(std::string prompt, string_field(value, "prompt", "prompt"));
    WEFT_ASSIGN_OR_RETURN(std::string completion,
                          string_field(value, "completion", "completion"));
    messages.push_back({data::ChatRole::kUser, std::move(prompt)});
    messages.push_back({data::ChatRole::kAssistant, std::move(completion)});
    return messages;
  }
  if (!list->is_array()) {
    return error("messages", absl::StrCat(ATypeName(*list), ", not an array"));
  }
  if (list->empty()) return error("messages", "empty: a conversation needs a message");
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& m = (*list)[i];
    const std::string name = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      return error(name, absl::StrCat(ATypeName(m), ", not an object with role and content"));
    }
    for (const auto& [key, unused] : m.items()) {
      if (key != "role" && key != "content") {
        return error(absl::StrCat(name, ".", key),
                     "unknown field (a message has only role and content)");
      }
    }
    WEFT_ASSIGN_OR_RETURN(std::string role, string_field(m, "role", name + ".role"));
    std::optional<data::ChatRole> parsed = data::ParseChatRole(role);
    if (!parsed) {
      return error(name + ".role",
                   absl::StrCat("\"", role, "\" is not a role (system, user or assistant)"));
    }
    WEFT_ASSIGN_OR_RETURN(std::string content, string_field(m, "content", name + ".content"));
    messages.push_back({*parsed, std::move(content)});
  }
  return messages;
}

absl::StatusOr<std::vector<std::string>> ReadAllDocuments(const std::vector<SourceFile>& files,
                                                          const std::string& jsonl_field,
                                                          const std::string& separator) {
  std::vector<std::string> documents;
  for (const SourceFile& file : files) {
    WEFT_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> mapped, MappedFile::Open(file.path));
    WEFT_RETURN_IF_ERROR(ForEachRawDocument(
        mapped->data(), file.jsonl, separator, [&](const RawDocument& doc) -> absl::Status {
          if (file.jsonl) {
            WEFT_ASSIGN_OR_RETURN(std::string text,
                                  JsonlDocument(doc.text, jsonl_field, file.path, doc.line));
            documents.push_back(std::move(text));
            return absl::OkStatus();
          }
          WEFT_RETURN_IF_ERROR(CheckUtf8(doc.text, file.path, doc.line));
          documents.emplace_back(doc.text);
          return absl::OkStatus();
        }));
  }
  return documents;
}

}  // namespace weft::dataprep
