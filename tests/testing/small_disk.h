// Real full disks for tests: a tmpfs of a few MiB mounted for the test, which the code under
// test fills (or the test fills for it, as another program sharing the disk would).
#ifndef WEFT_TESTS_TESTING_SMALL_DISK_H_
#define WEFT_TESTS_TESTING_SMALL_DISK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace weft::testing {

class SmallDisk {
 public:
  // Mounts a tmpfs of `bytes` at `dir` (created if missing). Needs root: UNAVAILABLE,
  // naming why, where mount is refused, so that a test can skip.
  static absl::StatusOr<std::unique_ptr<SmallDisk>> Mount(const std::string& dir, int64_t bytes);
  // Unmounts (lazily, so a process still holding files there cannot keep it mounted).
  ~SmallDisk();

  const std::string& path() const { return path_; }
  // What statvfs says an unprivileged writer may still use.
  int64_t FreeBytes() const;
  // Writes `name` under the mount until the disk refuses another byte (ENOSPC): the disk is
  // then full to the last page. Returns the bytes written.
  absl::StatusOr<int64_t> Fill(const std::string& name) const;

 private:
  explicit SmallDisk(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace weft::testing

#endif  // WEFT_TESTS_TESTING_SMALL_DISK_H_
