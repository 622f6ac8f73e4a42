#include "tests/testing/small_disk.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"

namespace weft::testing {

absl::StatusOr<std::unique_ptr<SmallDisk>> SmallDisk::Mount(const std::string& dir,
                                                             int64_t bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::UnavailableError(absl::StrCat(dir, ": ", ec.message()));
  const std::string data = absl::StrCat("size=", bytes);
  if (::mount("weft-test-disk", dir.c_str(), "tmpfs", 0, data.c_str()) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot mount a tmpfs at ", dir, " (needs root): ", std::strerror(errno)));
  }
  return std::unique_ptr<SmallDisk>(new SmallDisk(dir));
}

SmallDisk::~SmallDisk() { ::umount2(path_.c_str(), MNT_DETACH); }

int64_t SmallDisk::FreeBytes() const {
  struct statvfs fs;
  if (::statvfs(path_.c_str(), &fs) != 0) return -1;
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

absl::StatusOr<int64_t> SmallDisk::Fill(const std::string& name) const {
  const std::string file = absl::StrCat(path_, "/", name);
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(file, ": ", std::strerror(errno)));
  const std::string block(64 << 10, 'F');
  int64_t written = 0;
  // Whole blocks while they fit, then single pages for the rest.
  for (size_t size : {block.size(), size_t{4096}, size_t{1}}) {
    while (true) {
      const ssize_t n = ::write(fd, block.data(), size);
      if (n <= 0) break;
      written += n;
    }
  }
  const int err = errno;
  ::close(fd);
  if (err != ENOSPC) {
    return absl::UnavailableError(absl::StrCat(file, ": ", std::strerror(err)));
  }
  return written;
}

}  // namespace weft::testing
