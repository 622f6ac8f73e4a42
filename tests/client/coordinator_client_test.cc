// CoordinatorClient against a real weft-coordinator process on 127.0.0.1: which calls outlast
// a coordinator that is killed and started again on its port, and which are sent only once.
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using ::weft::testing::CoordinatorProcess;
using ::weft::testing::TempDir;

// A tiny CPU job; it only has to be accepted and kept (no worker ever runs it).
v1::JobSpec TinySpec() {
  auto spec = ParseJobSpecText(R"pb(
    name: "tiny"
    model { num_layers: 1 hidden_size: 16 num_heads: 2 vocab_size: 256 context_length: 16 }
    data { train_path: "/tmp/x.txt" format: DATA_FORMAT_TEXT_BYTES }
    optimizer { learning_rate: 0.001 }
    training { total_steps: 10 micro_batch_size: 2 }
    resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
  )pb", "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

// The coordinator is SIGKILLed and started again on its port and state. Meanwhile a new
// client submits: it waits for the coordinator and the job lands once. And a client that had
// talked to the old process reads: GetJob, ListJobs and ListWorkers go again on the dead
// connection's UNAVAILABLE and answer from the new one. Sent at once, every call would fail.
TEST(CoordinatorClientRestartTest, CallsOutlastACoordinatorRestart) {
  TempDir dir;
  auto coordinator = CoordinatorProcess::Start(dir.path());
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = (*coordinator)->address();
  const int port = (*coordinator)->port();
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(60);
  options.reconnect_wait = absl::Seconds(60);  // far longer than a restart on a loaded machine
  CoordinatorClient client(address, options);
  auto submitted = client.SubmitJob(TinySpec());
  ASSERT_TRUE(submitted.ok()) << submitted.status();

  (*coordinator)->process().Signal(SIGKILL);
  ASSERT_TRUE((*coordinator)->process().Wait(absl::Seconds(30)).ok());
  absl::StatusOr<v1::SubmitJobResponse> second = absl::UnknownError("not run");
  absl::StatusOr<v1::Job> job = absl::UnknownError("not run");
  absl::StatusOr<std::vector<v1::JobStatus>> jobs = absl::UnknownError("not run");
  absl::StatusOr<std::vector<v1::WorkerStatus>> workers = absl::UnknownError("not run");
  std::thread calls([&] {
    // A connection of its own, as a new trainctl process has, so that the submit is not sent
    // on the one the kill left: a call sent there may or may not have arrived, so a submit
    // would not go again.
    ClientOptions fresh = options;
    fresh.channel.private_connection = true;
    second = CoordinatorClient(address, fresh).SubmitJob(TinySpec());
    job = client.GetJob(submitted->job_id());
    jobs = client.ListJobs();
    workers = client.ListWorkers();
  });
  // Long enough for the first call to find nothing listening.
  absl::SleepFor(absl::Milliseconds(300));
  auto restarted = CoordinatorProcess::Start(dir.path(), {}, testing::BinDir(), port);
  calls.join();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->status().job_id(), submitted->job_id());
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  ASSERT_EQ(jobs->size(), 2u) << "the submit during the restart landed once";
  EXPECT_EQ((*jobs)[0].job_id(), second->job_id());  // newest first
  EXPECT_EQ((*jobs)[1].job_id(), submitted->job_id());
  ASSERT_TRUE(workers.ok()) << workers.status();
  EXPECT_TRUE(workers->empty());
}

// Nothing listens on port 1: a read and a submit each wait out the reconnect wait and then
// name the address.
TEST(CoordinatorClientRestartTest, UnreachableCoordinatorIsNamedAfterTheWait) {
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(5);
  options.reconnect_wait = absl::Milliseconds(500);
  CoordinatorClient client("127.0.0.1:1", options);
  const absl::Time start = absl::Now();
  auto jobs = client.ListJobs();
  EXPECT_EQ(jobs.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(jobs.status().message(), HasSubstr("coordinator 127.0.0.1:1 unreachable"));
  // At least the wait, so the call did wait for a reconnection before giving up.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(500));
  const absl::Time submit_start = absl::Now();
  auto submitted = client.SubmitJob(TinySpec());
  EXPECT_GE(absl::Now() - submit_start, absl::Milliseconds(500));
  EXPECT_EQ(submitted.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(submitted.status().message(), HasSubstr("coordinator 127.0.0.1:1 unreachable"));
}

}  // namespace
}  // namespace weft
