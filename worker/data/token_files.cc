#include "worker/data/token_files.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "worker/data/manifest.h"

namespace weft::data {
namespace {

namespace fs = std::filesystem;

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir,
                                                       const std::string& field) {
  std::error_code ec;
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    if (it->path().filename() == kManifestFileName) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, ": holds ", kManifestFileName, ", so it is a prepared dataset: name it in "
          "data.manifest_path (and leave ", field, ", data.val_path and data.format empty)"));
    }
    files.push_back(it->path().string());
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, ": cannot list the directory ", field, " names: ", ec.message()));
  }
  if (files.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, ": the directory ", field, " names holds no regular files (no token files)"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::vector<std::string>> ListGlob(const std::string& pattern,
                                                  const std::string& field) {
  glob_t matches{};
  // Sorted below by bytes rather than by glob's locale collation.
  const int rc = glob(pattern.c_str(), GLOB_NOSORT | GLOB_ERR, nullptr, &matches);
  std::vector<std::string> files(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::NotFoundError(
        absl::StrCat(pattern, ": the pattern ", field, " names matches no file"));
  }
  if (rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(pattern, ": cannot expand the pattern ", field, " names (glob error ", rc,
                     ": a directory on its way is unreadable)"));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ListTokenFiles(const std::string& path,
                                                        const std::string& field) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_directory(status)) return ListDirectory(path, field);
  if (fs::exists(status)) return std::vector<std::string>{path};
  if (path.find_first_of("*?[") != std::string::npos) return ListGlob(path, field);
  return absl::NotFoundError(absl::StrCat(path, ": token file does not exist"));
}

}  // namespace weft::data
