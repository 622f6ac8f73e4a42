// The process helpers the integration and e2e tests stand on: a server that cannot start must
// say why at once, not after its start-up timeout.
#include "tests/testing/subprocess.h"

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::testing {
namespace {

using ::testing::HasSubstr;

TEST(WaitForFileFromTest, ReturnsWhatTheProcessWrote) {
  TempDir dir;
  const std::string file = dir.File("port");
  // exec: the SIGKILL at the end reaches the sleep, which would otherwise outlive the shell
  // holding ctest's output pipe open.
  auto proc = Subprocess::Start({"/bin/sh", "-c", "echo 7 > " + file + "; exec sleep 30"}, "");
  ASSERT_TRUE(proc.ok()) << proc.status();
  const absl::StatusOr<std::string> got = WaitForFileFrom(**proc, file, absl::Seconds(30));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "7\n");
}

TEST(WaitForFileFromTest, AProcessThatExitsFirstIsReportedWithItsExitCode) {
  TempDir dir;
  auto proc = Subprocess::Start({"/bin/sh", "-c", "exit 3"}, "");
  ASSERT_TRUE(proc.ok()) << proc.status();
  const absl::StatusOr<std::string> got =
      WaitForFileFrom(**proc, dir.File("port"), absl::Minutes(10));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(got.status().message(), HasSubstr("exited (code 3) before writing"));
}

// A wrong WEFT_BIN_DIR: the coordinator's exec fails, and Start says so with the exec error.
TEST(CoordinatorProcessTest, AMissingBinaryIsReportedWithTheExecError) {
  TempDir dir;
  auto cp = CoordinatorProcess::Start(dir.path(), {}, dir.File("no-such-bin-dir"));
  ASSERT_FALSE(cp.ok());
  EXPECT_THAT(cp.status().message(), HasSubstr("exited (code 127)"));
  EXPECT_THAT(cp.status().message(), HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace weft::testing
