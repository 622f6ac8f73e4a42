// The manifest of a prepared dataset: DIR/manifest.json, written by `trainctl data prepare`
// next to its token shards and read by the worker from DataSpec.manifest_path (docs/data.md).
//
//   {"format": "weft-dataset", "version": 1,
//    "token_format": "DATA_FORMAT_UINT16_BIN" | "DATA_FORMAT_UINT32_BIN",
//    "tokenizer": {"kind": "sentencepiece", "file": "tokenizer.model", "crc32c": "0x1234abcd",
//                  "vocab_size": 4096, "bos_id": 1, "eos_id": 2},
//                 (kind "tokenizer.json": "file": "tokenizer.json", a Hugging Face byte-level BPE;
//                  kind "bytes": no "file" and no "crc32c"; vocab_size 256; bos_id, eos_id -1)
//    "document_separator": "eos" | "none",
//    "splits": {"train": [{"file": "train-00000.bin", "tokens": N, "bytes": B,
//                          "crc32c": "0x...",
//                          "flags": {"file": "train-00000.flags", "bytes": B,
//                                    "crc32c": "0x..."}}, ...],
//               "val": [...]},
//    "documents": {"train": D, "val": D},
//    "sources": [{"path": "/data/corpus/a.txt", "bytes": B, "documents": D}, ...],
//    "chat": {"template": "llama3", "loss_mask": "assistant"},
//    "options": {...}}
//
// Version 2 adds the optional "flags" of a shard (worker/data/token_flags.h: per-token loss
// mask and document starts; every shard of a dataset has one or none does) and the optional
// "chat" (how `prepare --chat` rendered conversations: the template's name and which tokens
// are targets, "assistant" or "all"). A manifest without either is written as version 1, as
// before, and both versions are read.//
// Every shard is an llm.c token file of token_format on its own; "tokens" is its header's
// count, "bytes" its size (1024 + tokens x width) and "crc32c" that of the whole file. File
// names are relative to DIR. Checksums are CRC32C (common/crc32c.h) written as "0x" and eight
// lower-case hex digits.
#ifndef WEFT_WORKER_DATA_MANIFEST_H_
#define WEFT_WORKER_DATA_MANIFEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"

namespace weft::data {

inline constexpr char kManifestFileName[] = "manifest.json";
inline constexpr char kManifestFormat[] = "weft-dataset";
inline constexpr int kManifestVersion = 2;  // the newest this build reads and writes

struct ManifestShard {
  std::string file;  // relative to the manifest's directory
  int64_t tokens = 0;
  int64_t bytes = 0;
  uint32_t crc32c = 0;
  // The shard's token flags file (worker/data/token_flags.h), relative to the manifest's
  // directory; empty: none. flags_bytes is 1024 + tokens.
  std::string flags_file;
  int64_t flags_bytes = 0;
  uint32_t flags_crc32c = 0;
};

struct ManifestTokenizer {
  std::string kind;  // "sentencepiece", "tokenizer.json" or "bytes"
  std::string file;  // sentencepiece only: relative to the manifest's directory
  uint32_t crc32c = 0;  // of `file`; sentencepiece only
  int vocab_size = 0;
  int bos_id = -1;  // -1: the tokenizer has none
  int eos_id = -1;
};

struct ManifestSource {
  std::string path;
  int64_t bytes = 0;
  int64_t documents = 0;
};

struct DatasetManifest {
  // The directory holding manifest.json, against which file names resolve. Set by
  // ReadManifest; not part of the file.
  std::string dir;
  weft::v1::DataFormat token_format = weft::v1::DATA_FORMAT_UNSPECIFIED;
  ManifestTokenizer tokenizer;
  std::string document_separator;  // "eos" or "none"
  std::vector<ManifestShard> train;
  std::vector<ManifestShard> val;  // may be empty
  int64_t train_documents = 0;
  int64_t val_documents = 0;
  std::vector<ManifestSource> sources;
  // Conversations rendered by `prepare --chat`: the template's name (e.g. "llama3", "chatml",
  // "mistral") and the loss mask policy ("assistant" or "all"); both empty otherwise.
  std::string chat_template;
  std::string loss_mask;
  // The options prepare ran with, as a JSON object's text (free-form: recorded for people and
  // for an idempotent re-run, never interpreted by the reader). Empty is written as {}.
  std::string options_json;
};

// Reads and checks `path_or_dir` (manifest.json itself, or the directory holding it). Strict:
// every field must be present with the right type and range and no unknown field may appear
// (outside "options"); a shard's bytes must be 1024 + tokens x the token width (its flags file's
// 1024 + tokens); shard and flags file names must be relative, without "..", and distinct;
// either every shard has flags or none does. Shard files themselves are not opened (the
// dataset does that, checking size and crc32c in its one pass over the tokens).
// Errors: NOT_FOUND if the file does not exist; FAILED_PRECONDITION, naming the file and the
// field (e.g. `splits.train[2].crc32c`) and what is wrong, for anything else.
absl::StatusOr<DatasetManifest> ReadManifest(const std::string& path_or_dir);

// Writes `manifest` as `dir`/manifest.json (manifest.dir is ignored), keys in the order above
// and indented, so the same manifest always gives the same bytes. Atomic: a temporary file in
// `dir` is written, fsynced and renamed over manifest.json, then `dir` is fsynced; a reader sees
// the old manifest or the whole new one, never a part. INVALID_ARGUMENT if `manifest` would not
// pass ReadManifest's checks (naming the field); otherwise the errno-derived code of the step
// that failed.
absl::Status WriteManifest(const DatasetManifest& manifest, const std::string& dir);

// The path of a file named in `manifest` (a shard, the tokenizer): manifest.dir/file.
std::string ManifestFilePath(const DatasetManifest& manifest, const std::string& file);

// "0x" and eight lower-case hex digits; ParseCrc32c accepts exactly that form.
std::string FormatCrc32c(uint32_t crc);
bool ParseCrc32c(const std::string& text, uint32_t* crc);

// CRC32C of the whole file at `path`, read in blocks. NOT_FOUND if it does not exist; the
// errno-derived code of a failed open or read otherwise.
absl::StatusOr<uint32_t> Crc32cOfFile(const std::string& path);

// Checks the tokenizer file a sentencepiece manifest names: present, and its crc32c equal to
// the manifest's ("changed after its manifest was written", naming the file and both values,
// FAILED_PRECONDITION). OK without reading anything for kind "bytes".
absl::Status CheckManifestTokenizer(const DatasetManifest& manifest);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_MANIFEST_H_
