#include "worker/hf/hf_export.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/engine/model_arch.h"
#include "worker/hf/hf_checkpoint.h"
#include "worker/hf/hf_config.h"
#include "worker/hf/hf_tokenizer.h"

namespace weft::hf {
namespace {

namespace fs = std::filesystem;

// Writes `text` to `path` and fsyncs it (the directory is renamed into place afterwards).
absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create"));
  absl::Cleanup closer = [fd] { close(fd); };
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": write failed"));
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": fsync failed"));
  return absl::OkStatus();
}

// Groups the tensors, in order, into files of at most `max_bytes` each.
std::vector<std::vector<const HfTensorMap*>> Shards(const std::vector<HfTensorMap>& mapping,
                                                    size_t element_bytes, uint64_t max_bytes) {
  std::vector<std::vector<const HfTensorMap*>> shards;
  uint64_t bytes = 0;
  for (const HfTensorMap& m : mapping) {
    const uint64_t size = m.size() * element_bytes;
    if (shards.empty() || (bytes > 0 && bytes + size > max_bytes)) {
      shards.emplace_back();
      bytes = 0;
    }
    shards.back().push_back(&m);
    bytes += size;
  }
  return shards;
}

absl::Status CheckUnits(const engine::ModelArch& arch,
                        const std::vector<std::vector<float>>& units) {
  if (static_cast<int>(units.size()) != arch.NumUnits()) {
    return absl::InvalidArgumentError(absl::StrCat("Hugging Face export: ", units.size(),
                                                   " units given, the model has ",
                                                   arch.NumUnits()));
  }
  for (int u = 0; u < arch.NumUnits(); ++u) {
    if (units[u].size() != arch.UnitSize(u)) {
      return absl::InvalidArgumentError(absl::StrCat("Hugging Face export: unit ", u, " has ",
                                                     units[u].size(), " floats, the model needs ",
                                                     arch.UnitSize(u)));
    }
  }
  return absl::OkStatus();
}

// config.json, generation_config.json, the tokenizer's files, the weights and, when sharded,
// the index, into the (empty) directory `dir`.
absl::Status WriteContents(const std::string& dir, const weft::v1::ModelSpec& spec,
                           const std::vector<HfTensorMap>& mapping,
                           const std::vector<std::vector<float>>& units,
                           const HfExportOptions& options) {
  HfTokenizerFiles tokenizer;
  if (options.tokenizer != nullptr) {
    WEFT_ASSIGN_OR_RETURN(tokenizer,
                          HfTokenizerFilesFor(*options.tokenizer, spec.context_length()));
  }
  WEFT_RETURN_IF_ERROR(WriteTextFile((fs::path(dir) / kHfConfigFile).string(),
                                     HfConfigJson(spec, options.dtype, tokenizer.ids)));
  WEFT_RETURN_IF_ERROR(WriteTextFile((fs::path(dir) / kHfGenerationConfigFile).string(),
                                     HfGenerationConfigJson(tokenizer.ids)));
  for (const auto& [file, contents] : tokenizer.files) {
    WEFT_RETURN_IF_ERROR(WriteTextFile((fs::path(dir) / file).string(), contents));
  }
  const size_t element_bytes = model_io::DtypeBytes(options.dtype);
  const auto shards = Shards(mapping, element_bytes, options.max_shard_bytes);
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  uint64_t total_bytes = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        shards.size() == 1 ? std::string(kHfSingleFile)
                           : absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1,
                                             shards.size());
    std::vector<model_io::TensorData> tensors;
    for (const HfTensorMap* m : shards[s]) {
      tensors.push_back(HfTensorFromUnits(*m, units));
      weight_map[m->name] = file;
      total_bytes += m->size() * element_bytes;
    }
    // transformers refuses safetensors whose "format" metadata is not a framework it knows.
    WEFT_RETURN_IF_ERROR(model_io::WriteSafetensors((fs::path(dir) / file).string(), tensors,
                                                {{"format", "pt"}}, options.dtype));
  }
  if (shards.size() == 1) return absl::OkStatus();
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total_bytes}}},
                                  {"weight_map", weight_map}};
  return WriteTextFile((fs::path(dir) / kHfIndexFile).string(), index.dump(2) + "\n");
}

}  // namespace

model_io::TensorData HfTensorFromUnits(const HfTensorMap& m,
                                   const std::vector<std::vector<float>>& units) {
  model_io::TensorData t;
  t.name = m.name;
  t.shape = m.shape;
  const float* src = units[m.unit].data() + m.offset;
  if (!m.transposed) {
    t.data.assign(src, src + m.size());
    return t;
  }
  t.data.resize(m.size());
  const float* unit = units[m.unit].data();
  for (size_t i = 0; i < m.size(); ++i) t.data[i] = unit[UnitOffsetOf(m, static_cast<int64_t>(i))];
  return t;
}

absl::Status ExportHf(const std::string& out_dir, const weft::v1::ModelSpec& spec,
                      const std::vector<std::vector<float>>& units,
                      const HfExportOptions& options) {
  if (options.max_shard_bytes == 0) {
    return absl::InvalidArgumentError("Hugging Face export: max_shard_bytes must be > 0");
  }
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec));
  WEFT_RETURN_IF_ERROR(CheckUnits(*arch, units));
  if (options.tokenizer != nullptr && options.tokenizer->vocab_size() > spec.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Hugging Face export: the tokenizer has ", options.tokenizer->vocab_size(),
        " tokens, more than the model's vocab_size ", spec.vocab_size()));
  }
  WEFT_ASSIGN_OR_RETURN(const std::vector<HfTensorMap> mapping, HfTensorMapping(*arch));
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) {
    return absl::AlreadyExistsError(
        absl::StrCat(out_dir, ": exists and is not an empty directory; choose a new --out"));
  }
  // The temporary directory sits beside out_dir: rename is atomic only within a filesystem.
  std::string temp = fs::path(out_dir).lexically_normal().string();
  while (temp.size() > 1 && temp.back() == '/') temp.pop_back();
  temp += ".tmp.XXXXXX";
  if (mkdtemp(temp.data()) == nullptr) {
    return absl::ErrnoToStatus(errno, absl::StrCat(out_dir, ": cannot create ", temp));
  }
  absl::Cleanup remove = [&] { fs::remove_all(temp, ec); };
  if (chmod(temp.c_str(), 0755) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(temp, ": chmod failed"));
  }
  WEFT_RETURN_IF_ERROR(WriteContents(temp, spec, mapping, units, options));
  if (rename(temp.c_str(), out_dir.c_str()) != 0) {
    const int err = errno;
    if (err == ENOTEMPTY || err == EEXIST) {
      return absl::AlreadyExistsError(
          absl::StrCat(out_dir, ": appeared (not empty) while exporting; nothing was written"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat(out_dir, ": rename from ", temp, " failed"));
  }
  std::move(remove).Cancel();
  return absl::OkStatus();
}

}  // namespace weft::hf
