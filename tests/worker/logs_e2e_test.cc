// `trainctl logs` end to end (real processes on 127.0.0.1: a coordinator, two CPU workers and
// the trainctl binary): what each rank logged reaches the user through the coordinator, with
// no access to the workers' hosts, and a follow ends once the job has.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"
#include "weft/v1/coordinator.pb.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::CommandResult;

class LogsE2eTest : public testing::WorkersTest {
 protected:
  CommandResult Trainctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testing::BinDir() + "/trainctl", "--coordinator",
                                     coordinator_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::RunCommand(argv, {}, absl::Seconds(120));
  }
};

std::string Describe(const CommandResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout\n", r.out, "\n--- stderr\n", r.err);
}

TEST_F(LogsE2eTest, EachRanksLinesReachTrainctlAndAFollowEndsWithTheJob) {
  ASSERT_NO_FATAL_FAILURE(StartCoordinator(testing::WordCorpus()));
  for (const char* device : {"cpu:0", "cpu:1"}) {
    ASSERT_NO_FATAL_FAILURE(
        StartWorker(device, {"--checkpointd=none", "--metrics-address=none"}));
  }
  v1::JobSpec spec = testing::RecoveryJobSpec("logged", corpus_, 2, 30);
  spec.mutable_checkpoint()->set_interval_steps(0);
  auto job = client_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();

  // Followed from before it runs until it has ended: exit 0 once it SUCCEEDED.
  CommandResult follow = Trainctl({"logs", "-f", id});
  ASSERT_EQ(follow.exit_code, 0) << Describe(follow) << Logs();
  const std::string joined = absl::StrCat("joining job ", id, " generation 1 as rank ");
  // "<time UTC> rank <N> <level> <text>"
  EXPECT_THAT(follow.out, HasSubstr(absl::StrCat("Z rank 0 info ", joined, "0 of 2")));
  EXPECT_THAT(follow.out, HasSubstr(absl::StrCat("Z rank 1 info ", joined, "1 of 2")));
  EXPECT_EQ(client_->GetJob(id)->status().state(), v1::SUCCEEDED);

  // One rank's lines only, without the rank column.
  CommandResult rank1 = Trainctl({"logs", id, "--rank", "1"});
  ASSERT_EQ(rank1.exit_code, 0) << Describe(rank1);
  EXPECT_THAT(rank1.out, HasSubstr(absl::StrCat("Z info ", joined, "1 of 2")));
  EXPECT_THAT(rank1.out, Not(HasSubstr(absl::StrCat(joined, "0"))));
  EXPECT_THAT(rank1.out, Not(HasSubstr(" rank 1 info"))) << rank1.out;

  // -o json: the one GetJobLogsResponse; with -f, one JobLogLine per line.
  CommandResult json = Trainctl({"-o", "json", "logs", id, "--rank", "1"});
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  v1::GetJobLogsResponse response;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &response).ok()) << json.out;
  EXPECT_EQ(response.state(), v1::SUCCEEDED);
  ASSERT_GT(response.lines_size(), 0);
  for (const v1::JobLogLine& line : response.lines()) EXPECT_EQ(line.rank(), 1);
  CommandResult lines = Trainctl({"-o", "json", "logs", "-f", id});
  ASSERT_EQ(lines.exit_code, 0) << Describe(lines);
  std::vector<std::string> split = absl::StrSplit(lines.out, '\n', absl::SkipEmpty());
  ASSERT_GT(split.size(), static_cast<size_t>(response.lines_size()));
  for (const std::string& text : split) {
    v1::JobLogLine line;
    EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(text, &line).ok()) << text;
    EXPECT_GT(line.seq(), 0) << text;
  }

  CommandResult unknown = Trainctl({"logs", "no-such-job-1-aaaaaa"});
  EXPECT_EQ(unknown.exit_code, 1) << Describe(unknown);
  EXPECT_THAT(unknown.err, HasSubstr("trainctl: job no-such-job-1-aaaaaa not found"));
  EXPECT_EQ(unknown.out, "");
}

}  // namespace
}  // namespace weft
