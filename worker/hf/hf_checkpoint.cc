#include "worker/hf/hf_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "worker/hf/hf_config.h"

namespace weft::hf {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat(path, ": no such file"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot read"));
  }
  return text.str();
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfCheckpoint>> HfCheckpoint::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a directory (a Hugging Face model "
                                            "directory holds config.json and *.safetensors)"));
  }
  std::unique_ptr<HfCheckpoint> c(new HfCheckpoint());
  c->dir_ = dir;
  WEFT_ASSIGN_OR_RETURN(c->config_text_, ReadTextFile(c->config_path()));
  if (fs::exists(fs::path(dir) / kHfIndexFile, ec)) {
    WEFT_RETURN_IF_ERROR(c->OpenIndexed());
  } else if (fs::exists(fs::path(dir) / kHfSingleFile, ec)) {
    WEFT_RETURN_IF_ERROR(c->OpenSingle());
  } else {
    return absl::NotFoundError(absl::StrCat(dir, ": neither ", kHfSingleFile, " nor ",
                                            kHfIndexFile, " is there"));
  }
  return c;
}

std::string HfCheckpoint::config_path() const { return (fs::path(dir_) / kHfConfigFile).string(); }

absl::Status HfCheckpoint::OpenSingle() {
  WEFT_ASSIGN_OR_RETURN(
      auto file, model_io::SafetensorsReader::Open((fs::path(dir_) / kHfSingleFile).string()));
  for (const auto& t : file->tensors()) tensors_[t.name] = Located{file.get(), &t};
  files_[kHfSingleFile] = std::move(file);
  return absl::OkStatus();
}

absl::Status HfCheckpoint::OpenIndexed() {
  const std::string index_path = (fs::path(dir_) / kHfIndexFile).string();
  WEFT_ASSIGN_OR_RETURN(const std::string text, ReadTextFile(index_path));
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return absl::DataLossError(absl::StrCat(index_path, ": not valid JSON: ", e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::DataLossError(
        absl::StrCat(index_path, ": has no \"weight_map\" object (tensor name -> file)"));
  }
  for (const auto& [name, file_json] : index["weight_map"].items()) {
    if (!file_json.is_string()) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map entry of tensor \"", name,
                                              "\" is not a file name: ", file_json.dump()));
    }
    const std::string file = file_json.get<std::string>();
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
      return absl::DataLossError(absl::StrCat(index_path, ": tensor \"", name, "\" maps to \"",
                                              file, "\", not a file name in the directory"));
    }
    auto it = files_.find(file);
    if (it == files_.end()) {
      const std::string path = (fs::path(dir_) / file).string();
      absl::StatusOr<std::unique_ptr<model_io::SafetensorsReader>> opened =
          model_io::SafetensorsReader::Open(path);
      if (!opened.ok()) {
        return absl::Status(opened.status().code(),
                            absl::StrCat(opened.status().message(), " (", index_path,
                                         " lists tensor \"", name, "\" in it)"));
      }
      it = files_.emplace(file, std::move(*opened)).first;
    }
    const model_io::SafetensorsReader::Tensor* tensor = it->second->Find(name);
    if (tensor == nullptr) {
      return absl::DataLossError(absl::StrCat(it->second->path(), ": has no tensor \"", name,
                                              "\", which ", index_path, " places there"));
    }
    tensors_[name] = Located{it->second.get(), tensor};
  }
  return absl::OkStatus();
}

HfCheckpoint::Located HfCheckpoint::Find(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? Located{} : it->second;
}

std::vector<std::string> HfCheckpoint::TensorNames() const {
  std::vector<std::string> names;
  for (const auto& [name, located] : tensors_) names.push_back(name);
  return names;
}

uint64_t HfCheckpoint::bytes_read() const {
  uint64_t total = 0;
  for (const auto& [name, file] : files_) total += file->bytes_read();
  return total;
}

absl::StatusOr<std::unique_ptr<HfImporter>> HfImporter::Open(const std::string& dir,
                                                             const weft::v1::ModelSpec& spec) {
  std::unique_ptr<HfImporter> importer(new HfImporter());
  WEFT_ASSIGN_OR_RETURN(importer->checkpoint_, HfCheckpoint::Open(dir));
  const HfCheckpoint& ckpt = *importer->checkpoint_;
  WEFT_RETURN_IF_ERROR(CheckHfConfig(ckpt.config_text(), ckpt.config_path(), spec));
  WEFT_ASSIGN_OR_RETURN(importer->arch_, engine::MakeModelArch(spec));
  WEFT_ASSIGN_OR_RETURN(std::vector<HfTensorMap> mapping, HfTensorMapping(*importer->arch_));
  importer->by_unit_.resize(importer->arch_->NumUnits());
  std::set<std::string> used;
  for (HfTensorMap& m : mapping) {
    std::string name = m.name;
    HfCheckpoint::Located where = ckpt.Find(name);
    if (where.tensor == nullptr && !HfAlternateName(name).empty()) {
      name = HfAlternateName(name);
      where = ckpt.Find(name);
    }
    if (where.tensor == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": tensor \"", m.name, "\" is missing (the ", importer->arch_->name(),
          " model of the job spec needs it)"));
    }
    if (where.tensor->shape != m.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          where.file->path(), ": tensor \"", name, "\" has shape ",
          ShapeText(where.tensor->shape), "; the job's model needs ", ShapeText(m.shape)));
    }
    used.insert(name);
    importer->by_unit_[m.unit].push_back(Mapped{std::move(m), where});
  }
  for (const std::string& name : ckpt.TensorNames()) {
    if (used.count(name) == 0 && !IsIgnorableHfTensor(name, *importer->arch_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          dir, ": tensor \"", name, "\" is not part of Weft's ", importer->arch_->name(),
          " model (refusing to drop it silently)"));
    }
  }
  return importer;
}

absl::Status HfImporter::ReadBlock(const Mapped& m, int64_t begin, int64_t end,
                                   float* out) const {
  const model_io::SafetensorsReader& file = *m.where.file;
  const model_io::SafetensorsReader::Tensor& tensor = *m.where.tensor;
  if (!m.map.transposed) return file.Read(tensor, begin, end, out);
  // Weft's (r, c) is the file's (c, r): read, per file row c, the run of Weft rows [r0, r1)
  // that the range touches, then pick the wanted elements out of that column block.
  const int64_t rows = m.map.rows;
  const int64_t cols = m.map.cols;
  const int64_t r0 = begin / cols;
  const int64_t r1 = (end + cols - 1) / cols;
  const int64_t width = r1 - r0;
  std::vector<float> block(static_cast<size_t>(width * cols));  // (cols, r1 - r0)
  for (int64_t c = 0; c < cols; ++c) {
    WEFT_RETURN_IF_ERROR(
        file.Read(tensor, c * rows + r0, c * rows + r1, block.data() + c * width));
  }
  for (int64_t e = begin; e < end; ++e) out[e - begin] = block[(e % cols) * width + e / cols - r0];
  return absl::OkStatus();
}

absl::Status HfImporter::ReadParams(int unit, int64_t begin, int64_t end, float* out) const {
  if (unit < 0 || unit >= arch_->NumUnits() || begin < 0 || begin > end ||
      static_cast<size_t>(end) > arch_->UnitSize(unit)) {
    return absl::OutOfRangeError(absl::StrCat("Hugging Face import: unit ", unit, " range [",
                                              begin, ", ", end, ") is outside the model"));
  }
  // Vocabulary padding rows are in no mapped tensor: they stay 0.
  std::fill(out, out + (end - begin), 0.0f);
  for (const Mapped& m : by_unit_[unit]) {
    const int64_t b = std::max(begin, static_cast<int64_t>(m.map.offset));
    const int64_t e = std::min(end, static_cast<int64_t>(m.map.offset + m.map.size()));
    if (b >= e) continue;
    const int64_t base = static_cast<int64_t>(m.map.offset);
    WEFT_RETURN_IF_ERROR(ReadBlock(m, b - base, e - base, out + (b - begin)));
  }
  return absl::OkStatus();
}

model_io::RangeReader HfImporter::Reader() const {
  return [this](const std::string& tensor, int64_t begin, int64_t end, float* out) {
    // "u<unit>.<state>"
    const size_t dot = tensor.find('.');
    int unit = -1;
    if (tensor.size() > 1 && tensor[0] == 'u' && dot != std::string::npos &&
        absl::SimpleAtoi(absl::string_view(tensor).substr(1, dot - 1), &unit) && unit >= 0 &&
        unit < arch_->NumUnits()) {
      const std::string state = tensor.substr(dot + 1);
      if (state == model_io::UnitStateName(model_io::UnitState::kParams)) {
        return ReadParams(unit, begin, end, out);
      }
      if (state == model_io::UnitStateName(model_io::UnitState::kM) ||
          state == model_io::UnitStateName(model_io::UnitState::kV)) {
        if (begin < 0 || begin > end) {
          return absl::OutOfRangeError(absl::StrCat("Hugging Face import: bad range [", begin,
                                                    ", ", end, ") of ", tensor));
        }
        std::fill(out, out + (end - begin), 0.0f);
        return absl::OkStatus();
      }
    }
    return absl::NotFoundError(
        absl::StrCat("Hugging Face import: no tensor ", tensor, " in the model"));
  };
}

}  // namespace weft::hf
