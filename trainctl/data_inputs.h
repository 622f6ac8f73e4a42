// The text inputs of `trainctl data prepare` and `trainctl data train-tokenizer`: which files
// an argument list names, and the documents inside each file.
//
// An input is a file, a directory (its regular files, recursively, in path order; names
// starting with "." are skipped, as are hidden directories) or a glob (its matches in path
// order). A file named *.jsonl holds one JSON object per line and its `jsonl_field` (a string)
// is a document; blank lines are skipped. Any other file is text: one document, or, with a
// document separator, the runs of lines between lines equal to it (a fortune file's "%").
// `prepare --chat` reads JSONL lines of conversations instead (JsonlConversation).
#ifndef WEFT_TRAINCTL_DATA_INPUTS_H_
#define WEFT_TRAINCTL_DATA_INPUTS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/chat_template.h"

namespace weft::dataprep {

struct SourceFile {
  std::string path;  // absolute
  int64_t bytes = 0;
  int64_t mtime_ns = 0;
  bool jsonl = false;
};

// The files `inputs` name, in argument order (each directory or glob sorted), duplicates
// dropped. Errors naming the argument: NOT_FOUND for a missing path, INVALID_ARGUMENT for a
// glob or a directory that matches no file, no inputs at all, or something that is not a
// regular file or directory; FAILED_PRECONDITION for an empty file.
absl::StatusOr<std::vector<SourceFile>> ExpandInputs(const std::vector<std::string>& inputs);

// A file mapped read-only into memory (an empty view for an empty file).
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  absl::string_view data() const { return {static_cast<const char*>(base_), size_}; }

 private:
  MappedFile() = default;
  void* base_ = nullptr;
  size_t size_ = 0;
};

// One document of a file: its text (a text file) or its JSON line (a .jsonl file, still to be
// parsed by JsonlDocument), and the 1-based line of the file it starts on.
struct RawDocument {
  absl::string_view text;
  int64_t line = 1;
};

// Calls `fn` for every document of `contents` in order (text: split at lines equal to
// `separator` when it is not empty, empty documents skipped; jsonl: every non-blank line).
// Stops at the first error `fn` returns and returns it.
absl::Status ForEachRawDocument(absl::string_view contents, bool jsonl,
                                const std::string& separator,
                                const std::function<absl::Status(const RawDocument&)>& fn);

// The document in one JSONL line: the string value of `field`. INVALID_ARGUMENT naming
// `path`:`line` when the line is not valid UTF-8, not JSON, not an object, lacks the field, or
// its field is not a string.
absl::StatusOr<std::string> JsonlDocument(absl::string_view json_line, const std::string& field,
                                          const std::string& path, int64_t line);

// The conversation in one JSONL line of `prepare --chat` input, in either form:
//   {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
//   {"prompt": "...", "completion": "..."}   (a user message, then an assistant message)
// A line with "messages" is read by them alone (other fields, such as an id or a "prompt" kept
// beside them, are ignored); a message has exactly the fields role and content, both strings.
// INVALID_ARGUMENT naming `path`:`line` and the field (e.g. `messages[2].role`) for a line that
// is not valid UTF-8, not a JSON object, has neither form, an empty "messages", a missing or
// non-string field, an unknown role or an unknown field in a message.
absl::StatusOr<std::vector<data::ChatMessage>> JsonlConversation(absl::string_view json_line,
                                                                 const std::string& path,
                                                                 int64_t line);

// INVALID_ARGUMENT "path:line: invalid UTF-8 (byte 0xNN at column C)" if `text`, which starts
// on line `first_line` of `path`, is not valid UTF-8; OK otherwise.
absl::Status CheckUtf8(absl::string_view text, const std::string& path, int64_t first_line);

// Every document of `files`, in order, read whole into memory (for tokenizer training, whose
// library holds its text in memory anyway). Text documents are checked to be UTF-8.
absl::StatusOr<std::vector<std::string>> ReadAllDocuments(const std::vector<SourceFile>& files,
                                                          const std::string& jsonl_field,
                                                          const std::string& separator);

}  // namespace weft::dataprep

#endif  // WEFT_TRAINCTL_DATA_INPUTS_H_
