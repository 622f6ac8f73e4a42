#include "worker/data/manifest.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <set>
#include <sstream>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/crc32c.h"
#include "common/status.h"
#include "nlohmann/json.hpp"

namespace weft::data {
namespace {

// ordered_json keeps keys in insertion order, so the written file reads top-down like the
// format description and the same manifest always gives the same bytes.
using Json = nlohmann::ordered_json;

constexpr int64_t kBinHeaderBytes = 1024;  // llm.c: 256 x int32
constexpr int kBytesVocab = 256;
constexpr int kMaxVocab = 1 << 24;  // model.vocab_size's bound (docs/models.md)
constexpr int kUint16MaxVocab = 65536;
constexpr size_t kReadBlock = 1 << 20;

int TokenWidth(weft::v1::DataFormat format) {
  return format == weft::v1::DATA_FORMAT_UINT32_BIN ? 4 : 2;
}

// Reads fields out of one manifest's JSON, turning every mismatch into an error that names the
// file and the field's full path (`splits.train[2].crc32c`).
class FieldReader {
 public:
  explicit FieldReader(std::string file) : file_(std::move(file)) {}

  absl::Status Error(const std::string& field, const std::string& what) const {
    return absl::FailedPreconditionError(absl::StrCat(file_, ": field ", field, ": ", what));
  }

  // `obj` (at `field`) must be an object holding exactly `keys`.
  // `obj` is an object holding every key of `keys`, perhaps some of `optional`, nothing else.
  absl::Status CheckObject(const Json& obj, const std::string& field,
                           const std::vector<std::string>& keys,
                           const std::vector<std::string>& optional = {}) const {
    const std::string name = field.empty() ? "(top level)" : field;
    if (!obj.is_object()) return Error(name, "must be a JSON object");
    std::set<std::string> allowed(keys.begin(), keys.end());
    allowed.insert(optional.begin(), optional.end());
    for (const auto& [key, value] : obj.items()) {
      if (allowed.count(key) == 0) {
        std::vector<std::string> all = keys;
        all.insert(all.end(), optional.begin(), optional.end());
        return Error(Join(field, key), absl::StrCat("unknown field (expected only ",
                                                    absl::StrJoin(all, ", "), ")"));
      }
    }
    for (const std::string& key : keys) {
      if (!obj.contains(key)) return Error(Join(field, key), "missing");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> String(const Json& obj, const std::string& field,
                                     const char* key) const {
    const Json& v = obj.at(key);
    if (!v.is_string()) return Error(Join(field, key), "must be a string");
    return v.get<std::string>();
  }

  // An integer (not a float such as 2.0) in [min, max].
  absl::StatusOr<int64_t> Int(const Json& obj, const std::string& field, const char* key,
                              int64_t min, int64_t max) const {
    const Json& v = obj.at(key);
    const bool integer = v.is_number_integer() &&
                         (!v.is_number_unsigned() ||
                          v.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()});
    if (!integer || v.get<int64_t>() < min || v.get<int64_t>() > max) {
      return Error(Join(field, key),
                   absl::StrCat("must be an integer in [", min, ", ", max, "], got ", v.dump()));
    }
    return v.get<int64_t>();
  }

  absl::StatusOr<uint32_t> Crc(const Json& obj, const std::string& field,
                               const char* key) const {
    WEFT_ASSIGN_OR_RETURN(const std::string text, String(obj, field, key));
    uint32_t crc = 0;
    if (!ParseCrc32c(text, &crc)) {
      return Error(Join(field, key), absl::StrCat("must be \"0x\" and eight lower-case hex "
                                                  "digits (a CRC32C), got \"",
                                                  text, "\""));
    }
    return crc;
  }

  // A file name relative to the manifest's directory, inside it.
  absl::StatusOr<std::string> RelativeFile(const Json& obj, const std::string& field,
                                           const char* key) const {
    WEFT_ASSIGN_OR_RETURN(std::string file, String(obj, field, key));
    const std::filesystem::path path(file);
    bool escapes = false;
    for (const auto& part : path) escapes |= part == "..";
    if (file.empty() || path.is_absolute() || escapes) {
      return Error(Join(field, key),
                   absl::StrCat("must be a file name relative to the manifest's directory, "
                                "without \"..\", got \"",
                                file, "\""));
    }
    return file;
  }

  static std::string Join(const std::string& field, const std::string& key) {
    return field.empty() ? key : absl::StrCat(field, ".", key);
  }

 private:
  std::string file_;
};

absl::StatusOr<ManifestTokenizer> ParseTokenizer(const FieldReader& r, const Json& j) {
  const std::string f = "tokenizer";
  if (!j.is_object()) return r.Error(f, "must be a JSON object");
  ManifestTokenizer t;
  if (!j.contains("kind")) return r.Error("tokenizer.kind", "missing");
  WEFT_ASSIGN_OR_RETURN(t.kind, r.String(j, f, "kind"));
  // A model file of its own: SentencePiece's or a Hugging Face tokenizer.json.
  const bool spm = t.kind == "sentencepiece" || t.kind == "tokenizer.json";
  if (!spm && t.kind != "bytes") {
    return r.Error("tokenizer.kind", absl::StrCat("must be \"sentencepiece\", \"tokenizer.json\" "
                                                  "or \"bytes\", got \"", t.kind, "\""));
  }
  if (spm) {
    WEFT_RETURN_IF_ERROR(
        r.CheckObject(j, f, {"kind", "file", "crc32c", "vocab_size", "bos_id", "eos_id"}));
    WEFT_ASSIGN_OR_RETURN(t.file, r.RelativeFile(j, f, "file"));
    WEFT_ASSIGN_OR_RETURN(t.crc32c, r.Crc(j, f, "crc32c"));
  } else {
    WEFT_RETURN_IF_ERROR(r.CheckObject(j, f, {"kind", "vocab_size", "bos_id", "eos_id"}));
  }
  const int64_t min_vocab = spm ? 1 : kBytesVocab;
  const int64_t max_vocab = spm ? kMaxVocab : kBytesVocab;
  WEFT_ASSIGN_OR_RETURN(t.vocab_size, r.Int(j, f, "vocab_size", min_vocab, max_vocab));
  // A byte tokenizer has no special tokens: all 256 ids are bytes.
  const int64_t max_id = spm ? t.vocab_size - 1 : -1;
  WEFT_ASSIGN_OR_RETURN(t.bos_id, r.Int(j, f, "bos_id", -1, max_id));
  WEFT_ASSIGN_OR_RETURN(t.eos_id, r.Int(j, f, "eos_id", -1, max_id));
  return t;
}

absl::StatusOr<std::vector<ManifestShard>> ParseSplit(const FieldReader& r, const Json& j,
                                                      const std::string& field, int width,
                                                      int64_t version) {
  if (!j.is_array()) return r.Error(field, "must be a JSON array of shards");
  std::vector<ManifestShard> shards;
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string f = absl::StrCat(field, "[", i, "]");
    WEFT_RETURN_IF_ERROR(r.CheckObject(j[i], f, {"file", "tokens", "bytes", "crc32c"},
                                       version >= 2 ? std::vector<std::string>{"flags"}
                                                    : std::vector<std::string>{}));
    ManifestShard s;
    WEFT_ASSIGN_OR_RETURN(s.file, r.RelativeFile(j[i], f, "file"));
    // The llm.c header holds the count as an int32.
    WEFT_ASSIGN_OR_RETURN(s.tokens,
                          r.Int(j[i], f, "tokens", 0, std::numeric_limits<int32_t>::max()));
    WEFT_ASSIGN_OR_RETURN(s.bytes,
                          r.Int(j[i], f, "bytes", 0, std::numeric_limits<int64_t>::max()));
    WEFT_ASSIGN_OR_RETURN(s.crc32c, r.Crc(j[i], f, "crc32c"));
    const int64_t expected = kBinHeaderBytes + s.tokens * width;
    if (s.bytes != expected) {
      return r.Error(absl::StrCat(f, ".bytes"),
                     absl::StrCat(s.bytes, " disagrees with tokens ", s.tokens, ": a ", width * 8,
                                  "-bit token file of that many tokens is ", expected,
                                  " bytes (1024-byte header + ", width, " bytes a token)"));
    }
    if (j[i].contains("flags")) {
      const std::string ff = absl::StrCat(f, ".flags");
      const Json& flags = j[i].at("flags");
      WEFT_RETURN_IF_ERROR(r.CheckObject(flags, ff, {"file", "bytes", "crc32c"}));
      WEFT_ASSIGN_OR_RETURN(s.flags_file, r.RelativeFile(flags, ff, "file"));
      WEFT_ASSIGN_OR_RETURN(s.flags_bytes,
                            r.Int(flags, ff, "bytes", 0, std::numeric_limits<int64_t>::max()));
      WEFT_ASSIGN_OR_RETURN(s.flags_crc32c, r.Crc(flags, ff, "crc32c"));
      if (s.flags_bytes != kBinHeaderBytes + s.tokens) {
        return r.Error(absl::StrCat(ff, ".bytes"),
                       absl::StrCat(s.flags_bytes, " disagrees with tokens ", s.tokens,
                                    ": its flags file is ", kBinHeaderBytes + s.tokens,
                                    " bytes (1024-byte header + one byte a token)"));
      }
    }
    shards.push_back(std::move(s));
  }
  return shards;
}

absl::StatusOr<std::vector<ManifestSource>> ParseSources(const FieldReader& r, const Json& j) {
  if (!j.is_array()) return r.Error("sources", "must be a JSON array");
  std::vector<ManifestSource> sources;
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < j.size(); ++i) {
    const std::string f = absl::StrCat("sources[", i, "]");
    WEFT_RETURN_IF_ERROR(r.CheckObject(j[i], f, {"path", "bytes", "documents"}));
    ManifestSource s;
    WEFT_ASSIGN_OR_RETURN(s.path, r.String(j[i], f, "path"));
    if (s.path.empty()) return r.Error(absl::StrCat(f, ".path"), "must not be empty");
    WEFT_ASSIGN_OR_RETURN(s.bytes, r.Int(j[i], f, "bytes", 0, kMax));
    WEFT_ASSIGN_OR_RETURN(s.documents, r.Int(j[i], f, "documents", 0, kMax));
    sources.push_back(std::move(s));
  }
  return sources;
}

// The checks that span fields: the token width holds the vocabulary, the separator exists,
// and no two entries name the same file.
absl::Status CheckConsistency(const FieldReader& r, const DatasetManifest& m) {
  if (m.token_format == weft::v1::DATA_FORMAT_UINT16_BIN &&
      m.tokenizer.vocab_size > kUint16MaxVocab) {
    return r.Error("token_format",
                   absl::StrCat("DATA_FORMAT_UINT16_BIN cannot hold tokenizer.vocab_size ",
                                m.tokenizer.vocab_size, " (at most ", kUint16MaxVocab,
                                "); use DATA_FORMAT_UINT32_BIN"));
  }
  if (m.document_separator == "eos" && m.tokenizer.eos_id < 0) {
    return r.Error("document_separator", "is \"eos\" but tokenizer.eos_id is -1 (none)");
  }
  std::set<std::string> files = {kManifestFileName};
  if (!m.tokenizer.file.empty()) files.insert(m.tokenizer.file);
  const bool flagged = !m.train.empty() && !m.train[0].flags_file.empty();
  for (const auto* split : {&m.train, &m.val}) {
    for (size_t i = 0; i < split->size(); ++i) {
      const std::string f =
          absl::StrCat("splits.", split == &m.train ? "train" : "val", "[", i, "]");
      const ManifestShard& shard = (*split)[i];
      if (!files.insert(shard.file).second) {
        return r.Error(absl::StrCat(f, ".file"),
                       absl::StrCat("\"", shard.file, "\" is named twice in the manifest"));
      }
      if (shard.flags_file.empty() == flagged) {
        return r.Error(f, flagged ? "has no \"flags\" but splits.train[0] has: every shard "
                                    "has token flags or none does"
                                  : "has \"flags\" but splits.train[0] has none: every shard "
                                    "has token flags or none does");
      }
      if (flagged && !files.insert(shard.flags_file).second) {
        return r.Error(absl::StrCat(f, ".flags.file"),
                       absl::StrCat("\"", shard.flags_file, "\" is named twice in the manifest"));
      }
    }
  }
  if (!m.chat_template.empty() && m.loss_mask != "assistant" && m.loss_mask != "all") {
    return r.Error("chat.loss_mask",
                   absl::StrCat("must be \"assistant\" or \"all\", got \"", m.loss_mask, "\""));
  }
  if (!m.chat_template.empty() && !flagged) {
    return r.Error("chat", "conversations need their token flags, but the shards have none");
  }
  if (m.train.empty()) return r.Error("splits.train", "has no shards");
  return absl::OkStatus();
}

absl::StatusOr<DatasetManifest> ParseManifest(const FieldReader& r, const Json& j) {
  const bool v2 = j.is_object() && j.contains("version") && j.at("version").is_number_integer() &&
                  j.at("version").get<int64_t>() >= 2;
  WEFT_RETURN_IF_ERROR(r.CheckObject(j, "",
                                     {"format", "version", "token_format", "tokenizer",
                                      "document_separator", "splits", "documents", "sources",
                                      "options"},
                                     v2 ? std::vector<std::string>{"chat"}
                                        : std::vector<std::string>{}));
  WEFT_ASSIGN_OR_RETURN(const std::string format, r.String(j, "", "format"));
  if (format != kManifestFormat) {
    return r.Error("format",
                   absl::StrCat("must be \"", kManifestFormat, "\", got \"", format, "\""));
  }
  const Json& version = j.at("version");
  if (!version.is_number_integer() || version.get<int64_t>() < 1 ||
      version.get<int64_t>() > kManifestVersion) {
    return r.Error("version", absl::StrCat("unsupported manifest version ", version.dump(),
                                           " (this build reads versions 1 to ", kManifestVersion,
                                           ")"));
  }
  const int64_t version_number = version.get<int64_t>();
  DatasetManifest m;
  WEFT_ASSIGN_OR_RETURN(const std::string token_format, r.String(j, "", "token_format"));
  if (token_format == "DATA_FORMAT_UINT16_BIN") {
    m.token_format = weft::v1::DATA_FORMAT_UINT16_BIN;
  } else if (token_format == "DATA_FORMAT_UINT32_BIN") {
    m.token_format = weft::v1::DATA_FORMAT_UINT32_BIN;
  } else {
    return r.Error("token_format",
                   absl::StrCat("must be \"DATA_FORMAT_UINT16_BIN\" or \"DATA_FORMAT_UINT32_BIN\", "
                                "got \"", token_format, "\""));
  }
  WEFT_ASSIGN_OR_RETURN(m.tokenizer, ParseTokenizer(r, j.at("tokenizer")));
  WEFT_ASSIGN_OR_RETURN(m.document_separator, r.String(j, "", "document_separator"));
  if (m.document_separator != "eos" && m.document_separator != "none") {
    return r.Error("document_separator", absl::StrCat("must be \"eos\" or \"none\", got \"",
                                                      m.document_separator, "\""));
  }
  const Json& splits = j.at("splits");
  WEFT_RETURN_IF_ERROR(r.CheckObject(splits, "splits", {"train", "val"}));
  const int width = TokenWidth(m.token_format);
  WEFT_ASSIGN_OR_RETURN(m.train, ParseSplit(r, splits.at("train"), "splits.train", width,
                                                  version_number));
  WEFT_ASSIGN_OR_RETURN(m.val, ParseSplit(r, splits.at("val"), "splits.val", width,
                                                version_number));
  const Json& documents = j.at("documents");
  WEFT_RETURN_IF_ERROR(r.CheckObject(documents, "documents", {"train", "val"}));
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  WEFT_ASSIGN_OR_RETURN(m.train_documents, r.Int(documents, "documents", "train", 0, kMax));
  WEFT_ASSIGN_OR_RETURN(m.val_documents, r.Int(documents, "documents", "val", 0, kMax));
  WEFT_ASSIGN_OR_RETURN(m.sources, ParseSources(r, j.at("sources")));
  if (j.contains("chat")) {
    const Json& chat = j.at("chat");
    WEFT_RETURN_IF_ERROR(r.CheckObject(chat, "chat", {"template", "loss_mask"}));
    WEFT_ASSIGN_OR_RETURN(m.chat_template, r.String(chat, "chat", "template"));
    WEFT_ASSIGN_OR_RETURN(m.loss_mask, r.String(chat, "chat", "loss_mask"));
    if (m.chat_template.empty()) return r.Error("chat.template", "must not be empty");
  }
  if (!j.at("options").is_object()) return r.Error("options", "must be a JSON object");
  m.options_json = j.at("options").dump();
  WEFT_RETURN_IF_ERROR(CheckConsistency(r, m));
  return m;
}

Json ShardsToJson(const std::vector<ManifestShard>& shards) {
  Json out = Json::array();
  for (const ManifestShard& s : shards) {
    Json shard = {{"file", s.file},
                  {"tokens", s.tokens},
                  {"bytes", s.bytes},
                  {"crc32c", FormatCrc32c(s.crc32c)}};
    if (!s.flags_file.empty()) {
      shard["flags"] = Json{{"file", s.flags_file},
                            {"bytes", s.flags_bytes},
                            {"crc32c", FormatCrc32c(s.flags_crc32c)}};
    }
    out.push_back(std::move(shard));
  }
  return out;
}

Json ToJson(const DatasetManifest& m, Json options) {
  Json tokenizer = {{"kind", m.tokenizer.kind}};
  if (m.tokenizer.kind != "bytes") {
    tokenizer["file"] = m.tokenizer.file;
    tokenizer["crc32c"] = FormatCrc32c(m.tokenizer.crc32c);
  }
  tokenizer["vocab_size"] = m.tokenizer.vocab_size;
  tokenizer["bos_id"] = m.tokenizer.bos_id;
  tokenizer["eos_id"] = m.tokenizer.eos_id;
  Json sources = Json::array();
  for (const ManifestSource& s : m.sources) {
    sources.push_back(Json{{"path", s.path}, {"bytes", s.bytes}, {"documents", s.documents}});
  }
  Json j;
  j["format"] = kManifestFormat;
  // Version 1 when nothing of version 2 is used, so older readers keep reading such datasets.
  const bool v2 = !m.chat_template.empty() || (!m.train.empty() && !m.train[0].flags_file.empty());
  j["version"] = v2 ? 2 : 1;
  j["token_format"] = weft::v1::DataFormat_Name(m.token_format);
  j["tokenizer"] = std::move(tokenizer);
  j["document_separator"] = m.document_separator;
  j["splits"] = Json{{"train", ShardsToJson(m.train)}, {"val", ShardsToJson(m.val)}};
  j["documents"] = Json{{"train", m.train_documents}, {"val", m.val_documents}};
  j["sources"] = std::move(sources);
  if (!m.chat_template.empty()) {
    j["chat"] = Json{{"template", m.chat_template}, {"loss_mask", m.loss_mask}};
  }
  j["options"] = std::move(options);
  return j;
}

absl::Status FsyncPath(const std::string& path, int flags, const std::string& what) {
  const int fd = open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(what, ": cannot open ", path));
  const int rc = fsync(fd);
  const int err = errno;
  close(fd);
  if (rc != 0) return absl::ErrnoToStatus(err, absl::StrCat(what, ": fsync of ", path));
  return absl::OkStatus();
}

// `contents` into `path` through a temporary sibling: written, fsynced, renamed, and the
// directory fsynced so the rename itself survives a crash.
absl::Status ReplaceFile(const std::string& dir, const std::string& path,
                         const std::string& contents) {
  const std::string temp = absl::StrCat(path, ".tmp.", getpid());
  absl::Cleanup remove_temp = [&] { std::remove(temp.c_str()); };
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << contents;
    out.close();
    if (!out) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot write ", temp));
  }
  WEFT_RETURN_IF_ERROR(FsyncPath(temp, O_RDONLY, path));
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": rename from ", temp, " failed"));
  }
  std::move(remove_temp).Cancel();
  return FsyncPath(dir, O_RDONLY | O_DIRECTORY, path);
}

}  // namespace

std::string FormatCrc32c(uint32_t crc) {
  char text[11];
  std::snprintf(text, sizeof(text), "0x%08x", crc);
  return text;
}

bool ParseCrc32c(const std::string& text, uint32_t* crc) {
  if (text.size() != 10 || text[0] != '0' || text[1] != 'x') return false;
  uint32_t value = 0;
  for (size_t i = 2; i < text.size(); ++i) {
    const char c = text[i];
    int digit = 0;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return false;
    }
    value = (value << 4) | static_cast<uint32_t>(digit);
  }
  *crc = value;
  return true;
}

std::string ManifestFilePath(const DatasetManifest& manifest, const std::string& file) {
  return (std::filesystem::path(manifest.dir) / file).string();
}

absl::StatusOr<DatasetManifest> ReadManifest(const std::string& path_or_dir) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(path_or_dir, ec);
  const std::filesystem::path file =
      is_dir ? std::filesystem::path(path_or_dir) / kManifestFileName
             : std::filesystem::path(path_or_dir);
  const std::string path = file.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!std::filesystem::exists(file, ec)) {
      return absl::NotFoundError(absl::StrCat(path, ": dataset manifest does not exist"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": cannot read dataset manifest: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  Json j = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": not a valid JSON dataset manifest"));
  }
  WEFT_ASSIGN_OR_RETURN(DatasetManifest manifest, ParseManifest(FieldReader(path), j));
  manifest.dir = file.has_parent_path() ? file.parent_path().string() : std::string(".");
  return manifest;
}

absl::Status WriteManifest(const DatasetManifest& manifest, const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / kManifestFileName).string();
  Json options = Json::object();
  if (!manifest.options_json.empty()) {
    options = Json::parse(manifest.options_json, nullptr, /*allow_exceptions=*/false);
    if (!options.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": field options: options_json is not a JSON object's text"));
    }
  }
  const Json j = ToJson(manifest, std::move(options));
  // The writer runs the reader's checks, so nothing is written that the worker would refuse.
  const absl::StatusOr<DatasetManifest> check = ParseManifest(FieldReader(path), j);
  if (!check.ok()) return absl::InvalidArgumentError(check.status().message());
  return ReplaceFile(dir, path, j.dump(2) + "\n");
}

absl::StatusOr<uint32_t> Crc32cOfFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open to checksum"));
  }
  absl::Cleanup close_fd = [fd] { close(fd); };
  std::vector<char> block(kReadBlock);
  uint32_t crc = 0;
  for (;;) {
    const ssize_t n = read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
    if (n == 0) return crc;
    crc = Crc32c(block.data(), static_cast<size_t>(n), crc);
  }
}

absl::Status CheckManifestTokenizer(const DatasetManifest& manifest) {
  if (manifest.tokenizer.kind == "bytes") return absl::OkStatus();
  const std::string path = ManifestFilePath(manifest, manifest.tokenizer.file);
  absl::StatusOr<uint32_t> crc = Crc32cOfFile(path);
  if (absl::IsNotFound(crc.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": the tokenizer file the dataset manifest names (tokenizer.file) is missing"));
  }
  WEFT_RETURN_IF_ERROR(crc.status());
  if (*crc != manifest.tokenizer.crc32c) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": tokenizer file changed after its manifest was written: crc32c ",
        FormatCrc32c(*crc), ", but the manifest says ", FormatCrc32c(manifest.tokenizer.crc32c)));
  }
  return absl::OkStatus();
}

}  // namespace weft::data
