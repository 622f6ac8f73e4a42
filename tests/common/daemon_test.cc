// The data-directory helpers every daemon shares: the default directory and its lock.
#include "common/daemon.h"

#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Wherever a daemon is started from, its default data directory is the same absolute one.
TEST(DefaultDataDirTest, IsAbsoluteForRootAndForUsers) {
  EXPECT_EQ(DefaultDataDirFor("coordinator", true, "/x", "/home/u"),
            "/var/lib/weft/coordinator");
  EXPECT_EQ(DefaultDataDirFor("coordinator", false, "/state", "/home/u"),
            "/state/weft/coordinator");
  EXPECT_EQ(DefaultDataDirFor("checkpoints", false, nullptr, "/home/u"),
            "/home/u/.local/state/weft/checkpoints");
  // Relative values (which would follow the working directory) are ignored.
  EXPECT_EQ(DefaultDataDirFor("coordinator", false, "rel", "/home/u"),
            "/home/u/.local/state/weft/coordinator");
  EXPECT_EQ(DefaultDataDirFor("coordinator", false, nullptr, "rel"),
            "/tmp/.local/state/weft/coordinator");
  EXPECT_THAT(DefaultDataDir("coordinator"), StartsWith("/"));
}

// A relative --data-dir is made absolute (and created); a second lock on the same directory is
// refused naming the directory and the holder, and granted once the holder let go.
TEST(DataDirLockTest, MakesTheDirectoryAbsoluteAndHoldsItAlone) {
  testing::TempDir tmp;
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::current_path(tmp.path());
  auto lock = DataDirLock::Acquire("a/b/", "weft-test");
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(lock.ok()) << lock.status();
  const std::string dir = std::filesystem::canonical(tmp.path()).string() + "/a/b";
  EXPECT_EQ((*lock)->dir(), dir);
  EXPECT_TRUE(std::filesystem::is_directory(dir));

  auto second = DataDirLock::Acquire(dir, "weft-other");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr("--data-dir " + dir),
                    HasSubstr(absl::StrCat("in use by weft-test (pid ", ::getpid(), ")"))));
  lock->reset();
  EXPECT_TRUE(DataDirLock::Acquire(dir, "weft-other").ok());
}

}  // namespace
}  // namespace weft
