#include "worker/data/token_flags.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace weft::data {
namespace {

int32_t ReadInt32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 |
                              static_cast<uint32_t>(p[3]) << 24);
}

}  // namespace

std::string TokenFlagsHeader(int32_t count) {
  std::string header(kTokenFlagsHeaderBytes, '\0');
  const int32_t fields[3] = {kTokenFlagsMagic, kTokenFlagsVersion, count};
  for (int f = 0; f < 3; ++f) {
    const uint32_t v = static_cast<uint32_t>(fields[f]);
    for (int b = 0; b < 4; ++b) header[f * 4 + b] = static_cast<char>((v >> (8 * b)) & 0xff);
  }
  return header;
}

absl::Status CheckTokenFlags(const unsigned char* data, size_t size, int64_t expected_count,
                             const std::string& path) {
  if (size < static_cast<size_t>(kTokenFlagsHeaderBytes)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": ", size, " bytes is shorter than a flags file's 1024-byte header"));
  }
  if (ReadInt32(data) != kTokenFlagsMagic) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": not a token flags file (magic ", ReadInt32(data), ", expected ",
        kTokenFlagsMagic, ")"));
  }
  if (ReadInt32(data + 4) != kTokenFlagsVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": token flags version ",
                                                      ReadInt32(data + 4), " (this build reads ",
                                                      kTokenFlagsVersion, ")"));
  }
  const int64_t count = ReadInt32(data + 8);
  if (count != expected_count) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": holds flags for ", count, " tokens but its shard has ",
                     expected_count));
  }
  if (static_cast<int64_t>(size) != kTokenFlagsHeaderBytes + count) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": ", size, " bytes, expected ",
                                                      kTokenFlagsHeaderBytes + count,
                                                      " (header + one byte a token)"));
  }
  const unsigned char* flags = data + kTokenFlagsHeaderBytes;
  for (int64_t i = 0; i < count; ++i) {
    if ((flags[i] & ~kTokenFlagsKnown) != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat(path, ": token ", i, " has unknown flag bits 0x",
                       absl::Hex(flags[i] & ~kTokenFlagsKnown)));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTokenFlagsFile(const std::string& path, absl::Span<const uint8_t> flags) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
  const std::string header = TokenFlagsHeader(static_cast<int32_t>(flags.size()));
  bool ok = std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            std::fwrite(flags.data(), 1, flags.size(), f) == flags.size();
  const int write_errno = errno;
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    return absl::ErrnoToStatus(write_errno != 0 ? write_errno : EIO,
                               absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace weft::data
