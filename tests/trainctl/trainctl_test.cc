// End-to-end tests of the trainctl binary against a real weft-coordinator on loopback: what a
// user sees (exit status, stdout, stderr) for the everyday commands and the common mistakes.
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/coordinator_client.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "weft/v1/coordinator.pb.h"
#include "weft/v1/job.pb.h"

namespace weft {
namespace {

using ::weft::testing::CommandResult;
using ::weft::testing::CoordinatorProcess;
using ::weft::testing::RunCommand;
using ::weft::testing::TempDir;
using ::weft::testing::WriteFile;

// min_workers 2 and no workers registered: the job stays PENDING for the whole test.
constexpr char kValidSpec[] = R"pb(name: "tiny"
model { num_layers: 2 hidden_size: 64 num_heads: 4 vocab_size: 256 context_length: 64 }
data { train_path: "/tmp/x.txt" format: DATA_FORMAT_TEXT_BYTES }
optimizer { learning_rate: 0.001 }
training { total_steps: 10 micro_batch_size: 4 }
resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
)pb";

std::string Trainctl() { return weft::testing::BinDir() + "/trainctl"; }

// Gives a failing command's whole output, so a failure explains itself.
std::string Describe(const CommandResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout\n", r.out, "\n--- stderr\n", r.err);
}

template <typename Message>
Message ParseJson(const std::string& json) {
  Message message;
  auto status = google::protobuf::util::JsonStringToMessage(json, &message);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return message;
}

class TrainctlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto coordinator = CoordinatorProcess::Start(dir_.File("coordinator"));
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(*coordinator);
  }

  // trainctl --coordinator <ours> args...
  CommandResult Run(const std::vector<std::string>& args,
                    const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {Trainctl(), "--coordinator", coordinator_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, env, absl::Seconds(30));
  }

  std::string WriteSpec(const std::string& name, const std::string& text) {
    const std::string path = dir_.File(name);
    WriteFile(path, text);
    return path;
  }

  // Submits kValidSpec; returns the job id (empty after a test failure).
  std::string SubmitValid() {
    CommandResult r = Run({"submit", WriteSpec("job.pb.txt", kValidSpec)});
    EXPECT_EQ(r.exit_code, 0) << Describe(r);
    return std::string(absl::StripAsciiWhitespace(r.out));
  }

  TempDir dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
};

TEST_F(TrainctlTest, SubmitPrintsJobIdAndTheJobIsPending) {
  const std::string job_id = SubmitValid();
  ASSERT_TRUE(absl::StartsWith(job_id, "tiny-")) << job_id;
  EXPECT_EQ(job_id.find('\n'), std::string::npos) << "only the id, for $(trainctl submit ...)";

  CommandResult status = Run({"status", job_id});
  ASSERT_EQ(status.exit_code, 0) << Describe(status);
  EXPECT_TRUE(absl::StrContains(status.out, job_id)) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "PENDING")) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "/tmp/x.txt")) << "spec summary\n" << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "SUBMITTED")) << "events\n" << status.out;

  CommandResult list = Run({"list"});
  ASSERT_EQ(list.exit_code, 0) << Describe(list);
  EXPECT_TRUE(absl::StrContains(list.out, "JOB ID")) << list.out;
  EXPECT_TRUE(absl::StrContains(list.out, job_id)) << list.out;
  EXPECT_TRUE(absl::StrContains(list.out, "PENDING")) << list.out;

  CommandResult json_status = Run({"-o", "json", "status", job_id});
  ASSERT_EQ(json_status.exit_code, 0) << Describe(json_status);
  auto job = ParseJson<weft::v1::Job>(json_status.out);
  EXPECT_EQ(job.status().job_id(), job_id);
  EXPECT_EQ(job.status().state(), weft::v1::PENDING);
  EXPECT_EQ(job.spec().model().num_heads(), 4);

  // Global options also work after the subcommand.
  CommandResult json_list = Run({"list", "-o", "json"});
  ASSERT_EQ(json_list.exit_code, 0) << Describe(json_list);
  auto jobs = ParseJson<weft::v1::ListJobsResponse>(json_list.out);
  ASSERT_EQ(jobs.jobs_size(), 1) << json_list.out;
  EXPECT_EQ(jobs.jobs(0).job_id(), job_id);
  EXPECT_EQ(jobs.jobs(0).state(), weft::v1::PENDING);

  CommandResult running = Run({"list", "--state", "running", "-o", "json"});
  ASSERT_EQ(running.exit_code, 0) << Describe(running);
  EXPECT_EQ(ParseJson<weft::v1::ListJobsResponse>(running.out).jobs_size(), 0) << running.out;

  CommandResult pending = Run({"list", "--state", "PENDING,RUNNING"});
  ASSERT_EQ(pending.exit_code, 0) << Describe(pending);
  EXPECT_TRUE(absl::StrContains(pending.out, job_id)) << pending.out;
}


// A generation waiting for members to join names them, in the table and in JSON.
TEST_F(TrainctlTest, StatusNamesTheMembersARendezvousWaitsFor) {
  const std::string job_id = SubmitValid();
  CoordinatorClient client(coordinator_->address());
  for (int device : {0, 1}) {
    weft::v1::WorkerInfo info;
    info.set_host("node");
    info.set_device_kind(weft::v1::DEVICE_KIND_CPU);
    info.set_device_index(device);
    ASSERT_TRUE(client.RegisterWorker(info, "").ok());
  }
  // Registered workers that never heartbeat: the generation formed, and nobody joins it.
  ASSERT_TRUE(weft::testing::Eventually(
      [&] {
        auto job = client.GetJob(job_id);
        return job.ok() && job->status().state() == weft::v1::RUNNING;
      },
      absl::Seconds(10)));
  CommandResult status = Run({"status", job_id});
  ASSERT_EQ(status.exit_code, 0) << Describe(status);
  EXPECT_TRUE(absl::StrContains(
      status.out, "waiting for node/cpu0, node/cpu1 to join (0 of 2 joined)"))
      << status.out;
  CommandResult json_status = Run({"-o", "json", "status", job_id});
  ASSERT_EQ(json_status.exit_code, 0) << Describe(json_status);
  auto job = ParseJson<weft::v1::Job>(json_status.out);
  EXPECT_EQ(job.status().awaiting_join_size(), 2);
}
TEST_F(TrainctlTest, SubmitJsonPrintsTheStoredSpec) {
  CommandResult r = Run({"-o", "json", "submit", WriteSpec("job.pb.txt", kValidSpec)});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto response = ParseJson<weft::v1::SubmitJobResponse>(r.out);
  EXPECT_TRUE(absl::StartsWith(response.job_id(), "tiny-")) << r.out;
  // Defaults are filled in by the coordinator.
  EXPECT_EQ(response.spec().resources().max_workers(), 2) << r.out;
}

TEST_F(TrainctlTest, SyntaxErrorNamesFileLineAndColumn) {
  const std::string path = WriteSpec("syntax.pb.txt", R"pb(name: "tiny"
model { num_layers: = 2 }
)pb");
  CommandResult r = Run({"submit", path});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, absl::StrCat(path, ":2:21:"))) << Describe(r);
  EXPECT_TRUE(r.out.empty()) << Describe(r);
}

TEST_F(TrainctlTest, UnknownFieldIsNamed) {
  const std::string path = WriteSpec("unknown.pb.txt", R"pb(name: "tiny"
model { num_layers: 2 hiden_size: 64 num_heads: 4 vocab_size: 256 context_length: 64 }
)pb");
  CommandResult r = Run({"submit", path});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "hiden_size")) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, absl::StrCat(path, ":2:"))) << Describe(r);
}

TEST_F(TrainctlTest, RejectedSpecListsEveryViolation) {
  const std::string path = WriteSpec("invalid.pb.txt", R"pb(name: "tiny"
model { num_layers: 2 hidden_size: 64 num_heads: 0 vocab_size: 256 context_length: 64 }
data { train_path: "/tmp/x.txt" format: DATA_FORMAT_TEXT_BYTES }
optimizer { learning_rate: -0.5 }
training { total_steps: 10 micro_batch_size: 0 }
resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
)pb");
  CommandResult r = Run({"submit", path});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  for (const char* field :
       {"model.num_heads", "optimizer.learning_rate", "training.micro_batch_size"}) {
    EXPECT_TRUE(absl::StrContains(r.err, absl::StrCat("\n", field, ":")))
        << field << " on a line of its own\n"
        << Describe(r);
  }
  EXPECT_TRUE(absl::StrContains(r.err, path)) << Describe(r);

  // Nothing was stored.
  CommandResult list = Run({"-o", "json", "list"});
  ASSERT_EQ(list.exit_code, 0) << Describe(list);
  EXPECT_EQ(ParseJson<weft::v1::ListJobsResponse>(list.out).jobs_size(), 0) << list.out;
}

TEST_F(TrainctlTest, MissingFileIsNamed) {
  const std::string path = dir_.File("no-such-job.pb.txt");
  CommandResult r = Run({"submit", path});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StartsWith(r.err, "trainctl: ")) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, path)) << Describe(r);
}

TEST_F(TrainctlTest, CancelPendingJobThenCancelAgainFails) {
  const std::string job_id = SubmitValid();
  ASSERT_FALSE(job_id.empty());

  CommandResult cancel = Run({"cancel", job_id, "--reason", "changed my mind"});
  ASSERT_EQ(cancel.exit_code, 0) << Describe(cancel);
  EXPECT_TRUE(absl::StrContains(cancel.out, "CANCELLED")) << cancel.out;

  CommandResult json_status = Run({"status", job_id, "-o", "json"});
  ASSERT_EQ(json_status.exit_code, 0) << Describe(json_status);
  EXPECT_EQ(ParseJson<weft::v1::Job>(json_status.out).status().state(), weft::v1::CANCELLED);

  CommandResult again = Run({"cancel", job_id});
  EXPECT_EQ(again.exit_code, 1) << Describe(again);
  EXPECT_TRUE(absl::StartsWith(again.err, "trainctl: ")) << Describe(again);

  // The job has ended, so watch returns at once, and CANCELLED is a failure for scripts.
  CommandResult watch = Run({"watch", job_id});
  EXPECT_EQ(watch.exit_code, 1) << Describe(watch);
  EXPECT_TRUE(absl::StrContains(watch.err, "CANCELLED")) << Describe(watch);
  EXPECT_TRUE(absl::StrContains(watch.out, "CANCELLED")) << Describe(watch);
}

TEST_F(TrainctlTest, WatchFollowsAJobToSuccess) {
  // Two control-plane-only workers: rank 0 reports 10 quick steps, then completion.
  std::vector<std::unique_ptr<weft::testing::Subprocess>> workers;
  for (int i = 0; i < 2; ++i) {
    auto worker = weft::testing::Subprocess::Start(
        {weft::testing::BinDir() + "/weft-sim-worker", "--coordinator", coordinator_->address(),
         "--device-index", absl::StrCat(i), "--report-steps", "10", "--step-interval-ms", "20"},
        dir_.File(absl::StrCat("worker", i, ".log")));
    ASSERT_TRUE(worker.ok()) << worker.status();
    workers.push_back(std::move(*worker));
  }
  const std::string job_id = SubmitValid();
  ASSERT_FALSE(job_id.empty());

  // stdout is a file here, so one line per update rather than a redrawn line.
  CommandResult watch = Run({"watch", job_id});
  ASSERT_EQ(watch.exit_code, 0) << Describe(watch);
  EXPECT_TRUE(absl::StrContains(watch.out, "RUNNING")) << watch.out;
  EXPECT_TRUE(absl::StrContains(watch.out, "step 10/10")) << watch.out;
  EXPECT_TRUE(absl::StrContains(watch.out, "SUCCEEDED")) << watch.out;
  EXPECT_EQ(watch.out.find('\r'), std::string::npos) << watch.out;

  // JSON: one JobStatus per line; the job has ended, so exactly one.
  CommandResult json = Run({"-o", "json", "watch", job_id});
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  std::vector<std::string> lines = absl::StrSplit(json.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 1u) << json.out;
  auto status = ParseJson<weft::v1::JobStatus>(lines[0]);
  EXPECT_EQ(status.state(), weft::v1::SUCCEEDED);
  EXPECT_EQ(status.step(), 10);
  EXPECT_DOUBLE_EQ(status.last_metrics().loss(), 0.5);

  // status says how long it ran, that nothing is left to wait for, and its checkpoints.
  CommandResult shown = Run({"status", job_id});
  ASSERT_EQ(shown.exit_code, 0) << Describe(shown);
  EXPECT_TRUE(std::regex_search(shown.out, std::regex(R"(\nElapsed +\d+s\n)"))) << shown.out;
  EXPECT_TRUE(std::regex_search(shown.out, std::regex(R"(\nETA +-\n)"))) << shown.out;
  EXPECT_TRUE(std::regex_search(
      shown.out,
      std::regex(R"(\nCheckpoint +none committed; 0 failed saves in the recent events\n)")))
      << shown.out;
  EXPECT_TRUE(std::regex_search(shown.out, std::regex(R"(\nModel +\S+)"))) << shown.out;

  CommandResult list = Run({"list"});
  ASSERT_EQ(list.exit_code, 0) << Describe(list);
  EXPECT_TRUE(absl::StrContains(list.out, "10/10")) << list.out;
  EXPECT_TRUE(absl::StrContains(list.out, "0.5000")) << list.out;
}

TEST_F(TrainctlTest, EventsListEveryTransitionWithTimeAndReason) {
  const std::string job_id = SubmitValid();
  ASSERT_FALSE(job_id.empty());
  ASSERT_EQ(Run({"cancel", job_id, "--reason", "budget cut"}).exit_code, 0);

  CommandResult events = Run({"events", job_id});
  ASSERT_EQ(events.exit_code, 0) << Describe(events);
  std::vector<std::string> lines = absl::StrSplit(events.out, '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 3u) << events.out;
  EXPECT_TRUE(absl::StrContains(lines[0], "SUBMITTED")) << events.out;
  EXPECT_TRUE(absl::StrContains(events.out, "CANCEL_REQUESTED")) << events.out;
  EXPECT_TRUE(absl::StrContains(events.out, "budget cut")) << events.out;
  EXPECT_TRUE(absl::StrContains(events.out, "-> CANCELLED")) << events.out;
  // Millisecond timestamps: "YYYY-MM-DD HH:MM:SS.mmm".
  EXPECT_EQ(lines[0][19], '.') << lines[0];

  // JSON, answered once: one object, {"job_id": ..., "events": [JobEvent...]}, in order.
  CommandResult json = Run({"-o", "json", "events", job_id});
  ASSERT_EQ(json.exit_code, 0) << Describe(json);
  const nlohmann::json object = nlohmann::json::parse(json.out, nullptr, false);
  ASSERT_TRUE(object.is_object()) << json.out;
  EXPECT_EQ(object.value("job_id", ""), job_id);
  ASSERT_TRUE(object.contains("events") && object["events"].is_array()) << json.out;
  ASSERT_EQ(object["events"].size(), lines.size()) << json.out;
  EXPECT_EQ(ParseJson<weft::v1::JobEvent>(object["events"].front().dump()).type(),
            weft::v1::SUBMITTED);
  EXPECT_EQ(ParseJson<weft::v1::JobEvent>(object["events"].back().dump()).state(),
            weft::v1::CANCELLED);

  // Following an ended job prints its events and returns at once; CANCELLED exits 1.
  CommandResult follow = Run({"events", "--follow", job_id});
  EXPECT_EQ(follow.exit_code, 1) << Describe(follow);
  EXPECT_EQ(follow.out, events.out);
  // JSON, followed: one JobEvent per line (JSON Lines).
  CommandResult json_follow = Run({"-o", "json", "events", "--follow", job_id});
  EXPECT_EQ(json_follow.exit_code, 1) << Describe(json_follow);
  std::vector<std::string> json_lines = absl::StrSplit(json_follow.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(json_lines.size(), lines.size()) << json_follow.out;
  EXPECT_EQ(ParseJson<weft::v1::JobEvent>(json_lines[0]).type(), weft::v1::SUBMITTED);

  CommandResult unknown = Run({"events", "no-such-job-7"});
  EXPECT_EQ(unknown.exit_code, 1) << Describe(unknown);
  EXPECT_TRUE(absl::StrContains(unknown.err, "no-such-job-7")) << Describe(unknown);
}

TEST_F(TrainctlTest, UnknownJobFails) {
  CommandResult r = Run({"status", "no-such-job-7"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StartsWith(r.err, "trainctl: ")) << Describe(r);
}

// -o json, one rule (trainctl_output.h): a command that answers once prints exactly one JSON
// object, whatever it is; errors stay on stderr with exit 1 and leave stdout empty.
TEST_F(TrainctlTest, JsonIsOneObjectPerAnswerAndErrorsStayOnStderr) {
  const std::string job_id = SubmitValid();
  ASSERT_FALSE(job_id.empty());
  const std::vector<std::vector<std::string>> once = {
      {"status", job_id}, {"list"}, {"workers"}, {"events", job_id}, {"logs", job_id},
      {"logs", job_id, "--rank", "0"}, {"cancel", job_id}};
  for (const std::vector<std::string>& command : once) {
    std::vector<std::string> args = {"-o", "json"};
    args.insert(args.end(), command.begin(), command.end());
    CommandResult r = Run(args);
    ASSERT_EQ(r.exit_code, 0) << command[0] << "\n" << Describe(r);
    const nlohmann::json parsed = nlohmann::json::parse(r.out, nullptr, false);
    EXPECT_TRUE(parsed.is_object()) << command[0] << ": not one JSON object\n" << r.out;
    EXPECT_EQ(r.err, "") << command[0];
  }
  // A job without lines yet: its state, and nothing to print in text.
  CommandResult logs = Run({"-o", "json", "logs", job_id});
  auto response = ParseJson<weft::v1::GetJobLogsResponse>(logs.out);
  EXPECT_EQ(response.state(), weft::v1::CANCELLED);
  EXPECT_EQ(response.lines_size(), 0);
  EXPECT_TRUE(absl::StrContains(logs.out, "\"dropped\": \"0\"")) << "zeros included\n" << logs.out;
  CommandResult text = Run({"logs", job_id});
  EXPECT_EQ(text.exit_code, 0) << Describe(text);
  EXPECT_EQ(text.out, "");

  for (const std::vector<std::string>& command :
       std::vector<std::vector<std::string>>{{"status", "no-such-job-7"},
                                             {"logs", "no-such-job-7"},
                                             {"logs", "-f", "no-such-job-7"},
                                             {"events", "no-such-job-7"},
                                             {"cancel", job_id}}) {
    for (const char* output : {"text", "json"}) {
      std::vector<std::string> args = {"-o", output};
      args.insert(args.end(), command.begin(), command.end());
      CommandResult r = Run(args);
      EXPECT_EQ(r.exit_code, 1) << command[0] << " -o " << output << "\n" << Describe(r);
      EXPECT_EQ(r.out, "") << command[0] << " -o " << output;
      EXPECT_TRUE(absl::StartsWith(r.err, "trainctl: ")) << Describe(r);
    }
  }
  CommandResult unknown = Run({"logs", "no-such-job-7"});
  EXPECT_TRUE(absl::StrContains(unknown.err, "job no-such-job-7 not found")) << Describe(unknown);
  CommandResult negative = Run({"logs", job_id, "--rank=-1"});
  EXPECT_NE(negative.exit_code, 0) << Describe(negative);
  EXPECT_TRUE(absl::StrContains(negative.err, "--rank")) << Describe(negative);
}

TEST_F(TrainctlTest, WorkersPrintsATableWhenThereAreNone) {
  CommandResult r = Run({"workers"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.out, "WORKER ID")) << r.out;
}

TEST_F(TrainctlTest, CoordinatorAddressFromEnvironment) {
  const std::string job_id = SubmitValid();
  ASSERT_FALSE(job_id.empty());

  CommandResult from_env = RunCommand({Trainctl(), "list"},
                                      {{"WEFT_COORDINATOR", coordinator_->address()}});
  ASSERT_EQ(from_env.exit_code, 0) << Describe(from_env);
  EXPECT_TRUE(absl::StrContains(from_env.out, job_id)) << from_env.out;

  // The flag wins over the environment.
  CommandResult flag_wins = Run({"list"}, {{"WEFT_COORDINATOR", "127.0.0.1:1"}});
  ASSERT_EQ(flag_wins.exit_code, 0) << Describe(flag_wins);
  EXPECT_TRUE(absl::StrContains(flag_wins.out, job_id)) << flag_wins.out;
}

// Needs no coordinator: nothing listens on port 1.
TEST(TrainctlUnreachableTest, NamesTheCoordinatorAddress) {
  CommandResult r =
      RunCommand({Trainctl(), "--coordinator", "127.0.0.1:1", "list"}, {}, absl::Seconds(30));
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StartsWith(r.err, "trainctl: coordinator 127.0.0.1:1 unreachable"))
      << Describe(r);
}

// A mistyped subcommand is named, with the closest one, at any level; no daemon is dialled.
TEST(TrainctlUsageTest, UnknownSubcommandIsNamedWithTheClosest) {
  CommandResult r = RunCommand({Trainctl(), "sumbit", "job.pb.txt"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_EQ(r.err, "trainctl: unknown subcommand 'sumbit' of trainctl; did you mean 'submit'?\n")
      << Describe(r);
  r = RunCommand({Trainctl(), "-o", "json", "data", "prepar", "--out", "x", "a.txt"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(
      r.err, "unknown subcommand 'prepar' of trainctl data; did you mean 'prepare'?"))
      << Describe(r);
  r = RunCommand({Trainctl(), "frobnicate"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_TRUE(absl::StrContains(
      r.err, "unknown subcommand 'frobnicate' of trainctl; `trainctl --help` lists them"))
      << Describe(r);
  // No subcommand at all is still CLI11's own message.
  r = RunCommand({Trainctl()});
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "A subcommand is required")) << Describe(r);
}

TEST(TrainctlUnreachableTest, MalformedAddressIsRejectedBeforeDialing) {
  CommandResult r = RunCommand({Trainctl(), "--coordinator", "localhost", "list"});
  EXPECT_NE(r.exit_code, 0) << Describe(r);
  EXPECT_TRUE(absl::StrContains(r.err, "--coordinator")) << Describe(r);
}

}  // namespace
}  // namespace weft

namespace weft {
namespace {

TEST_F(TrainctlTest, ResumeFromMustNameAnExistingJob) {
  CommandResult r = Run({"submit", WriteSpec("job.pb.txt", kValidSpec), "--resume-from=nope-9"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(r.err, "resume_from_job: no job \"nope-9\"")) << r.err;
  const std::string first = SubmitValid();
  r = Run({"-o", "json", "submit", WriteSpec("job2.pb.txt", kValidSpec),
           "--resume-from=" + first});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "\"resume_from_job\": \"" + first + "\"")) << r.out;
}

}  // namespace
}  // namespace weft
