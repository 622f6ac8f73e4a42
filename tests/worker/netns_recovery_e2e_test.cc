// Recovery from a network partition, with real processes: one of a job's two CPU workers runs
// in its own network namespace, joined to the host by a veth pair, and once a mid-run
// checkpoint is committed its link is cut. The process stays alive and silent (no FIN, no RST
// reaches anyone), which is what a pulled cable or a dead switch port looks like, unlike the
// SIGKILL/SIGSTOP cases of recovery_e2e_test. The coordinator must declare it lost from its
// missed heartbeats, the surviving worker must leave its blocked Gloo collectives, and a new
// generation with an idle spare must resume from the checkpoint and end with the model an
// uninterrupted run gives, bit for bit.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`; skips without them.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "common/security.h"
#include "common/time_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/netns.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"
#include "tests/worker/tls_cluster.h"

namespace weft {
namespace {

using testing::BinDir;
using testing::Eventually;
using testing::ExpectSameModel;
using testing::Subprocess;
using testing::TempDir;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = 160;
// Worker ids (--host "/cpu" --device index): the namespaced one is a member of the job from
// the start; host/cpu2 is the spare that replaces it.
constexpr char kCutWorkerId[] = "netns/cpu0";

class NetnsRecoveryE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = dir_.File("corpus.txt");
    testing::WriteFile(corpus_, testing::WordCorpus());
    auto netns = testing::Netns::Create();
    if (!netns.ok()) GTEST_SKIP() << netns.status();
    netns_ = std::move(*netns);
    host_ip_ = netns_->host_ip();
    ns_ip_ = netns_->ns_ip();
  }

  void TearDown() override {
    // The namespaced worker may hang forever on its dead link; it must also be gone before
    // the namespace can disappear.
    for (auto& w : workers_) w->Signal(SIGKILL);
    daemons_.Kill();
    for (auto& w : workers_) (void)w->Wait(absl::Seconds(10));
    netns_.reset();  // after its processes are gone
  }

  // The same job without interruption on two workers, all on 127.0.0.1.
  v1::JobStatus Uninterrupted() {
    return testing::RunUninterrupted(
        dir_.File("straight"), 2, testing::RecoveryJobSpec("partition", corpus_, 2, kSteps));
  }

  // The coordinator and checkpointd listen on the host end of the veth pair, not on
  // 127.0.0.1 as every other test's do: the namespaced worker has its own loopback and reaches
  // the host only through the veth.
  void StartDaemons(const std::vector<std::string>& coordinator_flags = {}) {
    ASSERT_NO_FATAL_FAILURE(daemons_.Start(host_ip_, {host_ip_}, coordinator_flags));
    client_ = &daemons_.client();
  }

  // Worker "<host>/cpu<device>", in the namespace when `in_netns`. Gloo listens on and
  // advertises --data-address, which must be reachable from the other side of the veth: the
  // default would be 127.0.0.1 only for a loopback coordinator, else the host name.
  void StartWorker(int device, bool in_netns) {
    std::vector<std::string> worker = {
        BinDir() + "/weft-worker",
        absl::StrCat("--device=cpu:", device),
        in_netns ? "--host=netns" : "--host=host",
        in_netns ? "--host-id=netns" : "--host-id=host",
        "--data-address=" + (in_netns ? ns_ip_ : host_ip_),
        "--output-dir=" + dir_.File("models"),
        "--metrics-address=none"};
    for (const auto& flag : daemons_.WorkerFlags(host_ip_)) worker.push_back(flag);
    auto w = Subprocess::Start(in_netns ? netns_->Wrap(worker) : worker,
                               dir_.File(absl::StrCat("worker-cpu", device, ".log")),
                               testing::TlsDaemons::Env());
    ASSERT_TRUE(w.ok()) << w.status();
    workers_.push_back(std::move(*w));
  }

  v1::JobStatus Status(const std::string& id) { return daemons_.Status(id); }

  std::string Logs() {
    std::string all = daemons_.Logs();
    for (const char* name : {"worker-cpu0", "worker-cpu1", "worker-cpu2"}) {
      absl::StrAppend(&all, "\n--- ", name, "\n",
                      testing::ReadFile(dir_.File(absl::StrCat(name, ".log"))));
    }
    return all;
  }

  TempDir dir_;
  std::string corpus_;
  std::unique_ptr<testing::Netns> netns_;
  std::string host_ip_, ns_ip_;
  testing::TlsDaemons daemons_{dir_.path()};
  CoordinatorClient* client_ = nullptr;
  std::vector<std::unique_ptr<Subprocess>> workers_;
};

TEST_F(NetnsRecoveryE2eTest, WorkerWhoseLinkIsCutIsDetectedAndReplacedAndTheModelIsUnchanged) {
  const v1::JobStatus straight = Uninterrupted();

  ASSERT_NO_FATAL_FAILURE(StartDaemons());
  // Only two workers while the job is scheduled, so that the namespaced one is a member; the
  // spare comes once the job runs.
  ASSERT_NO_FATAL_FAILURE(StartWorker(0, /*in_netns=*/true));
  ASSERT_NO_FATAL_FAILURE(StartWorker(1, /*in_netns=*/false));
  auto job = client_->SubmitJob(testing::RecoveryJobSpec("partition", corpus_, 2, kSteps));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  ASSERT_TRUE(Eventually([&] { return Status(id).state() == v1::RUNNING; }, absl::Seconds(60)))
      << Logs();
  ASSERT_THAT(Status(id).worker_ids(), Contains(kCutWorkerId));
  ASSERT_NO_FATAL_FAILURE(StartWorker(2, /*in_netns=*/false));

  ASSERT_TRUE(Eventually([&] { return Status(id).checkpoint_step() >= 40; }, absl::Seconds(120)))
      << Logs();
  const v1::JobStatus before = Status(id);
  ASSERT_LT(before.step(), kSteps) << "the job ended before its link could be cut";
  ASSERT_THAT(before.worker_ids(), Contains(kCutWorkerId));

  // The host's own traffic to host_ip_ (workers to the coordinator) goes on.
  const absl::Status cut = netns_->Cut();
  ASSERT_TRUE(cut.ok()) << cut;
  // Taken once the link is surely down: the detection time below is, if anything, low by
  // the few milliseconds the command took.
  const absl::Time cut_time = absl::Now();

  // Step reports seen while waiting: the first of the new generation marks training resumed.
  std::vector<v1::StepMetrics> reports;
  ASSERT_TRUE(Eventually(
      [&] {
        const v1::JobStatus s = Status(id);
        if (s.generation() > before.generation() && s.has_last_metrics() &&
            (reports.empty() || reports.back().step() != s.last_metrics().step())) {
          reports.push_back(s.last_metrics());
        }
        return s.state() == v1::SUCCEEDED;
      },
      absl::Seconds(120)))
      << Logs();
  const v1::JobStatus after = Status(id);
  EXPECT_GE(after.restarts(), 1) << Logs();
  EXPECT_GT(after.generation(), before.generation());
  EXPECT_THAT(after.worker_ids(), Not(Contains(kCutWorkerId)));
  // The cut worker was found out by its silence, not by its death.
  EXPECT_TRUE(workers_[0]->Running()) << "the namespaced worker exited: " << Logs();

  absl::Duration detection = absl::InfiniteDuration();
  absl::Time next_generation = absl::InfiniteFuture();
  for (const auto& e : after.events()) {
    if (e.type() == v1::WORKER_LOST && detection == absl::InfiniteDuration()) {
      EXPECT_THAT(e.message(), HasSubstr(kCutWorkerId));
      detection = FromProtoTime(e.time()) - cut_time;
    }
    if (e.type() == v1::GENERATION_STARTED && e.generation() > before.generation() &&
        next_generation == absl::InfiniteFuture()) {
      next_generation = FromProtoTime(e.time());
    }
  }
  ASSERT_NE(detection, absl::InfiniteDuration()) << "no WORKER_LOST event: " << Logs();
  ASSERT_NE(next_generation, absl::InfiniteFuture()) << "no later generation: " << Logs();
  // Heartbeats every 200 ms, a member lost after 1.5 s of silence, checked every 50 ms. No
  // tight lower bound: a loaded machine may have delayed the last heartbeats before the cut.
  EXPECT_GT(detection, absl::ZeroDuration());
  EXPECT_LT(detection, absl::Seconds(10));
  // The first step the new generation reported (polling may miss a few, hence the step).
  const v1::StepMetrics* resumed = nullptr;
  for (const auto& r : reports) {
    if (FromProtoTime(r.time()) >= next_generation) {
      resumed = &r;
      break;
    }
  }
  ASSERT_NE(resumed, nullptr) << "no step reported by the new generation";
  const absl::Duration recovery = FromProtoTime(resumed->time()) - cut_time;
  std::printf(
      "link cut at step %lld (checkpoint %lld): WORKER_LOST after %s, generation %lld started "
      "after %s, its step %lld reported after %s, job SUCCEEDED after %s\n",
      static_cast<long long>(before.step()), static_cast<long long>(before.checkpoint_step()),
      absl::FormatDuration(detection).c_str(), static_cast<long long>(after.generation()),
      absl::FormatDuration(next_generation - cut_time).c_str(),
      static_cast<long long>(resumed->step()), absl::FormatDuration(recovery).c_str(),
      absl::FormatDuration(FromProtoTime(after.end_time()) - cut_time).c_str());
  RecordProperty("detection_ms", static_cast<int>(absl::ToInt64Milliseconds(detection)));
  RecordProperty("recovery_ms", static_cast<int>(absl::ToInt64Milliseconds(recovery)));

  EXPECT_THAT(Logs(), HasSubstr("restored checkpoint"));
  ExpectSameModel(straight, after);
}

// A cut link closes nothing, so only HTTP/2 keepalive pings (common/rpc.h, default every
// 1 s with a 1 s timeout, on the coordinator's server and the worker's channel) can reveal it
// before the heartbeat timeout, here 30 s. The coordinator's pings go unanswered, it closes
// the connection, the worker's session stream is cancelled, and after the connection-lost
// grace the job records CONNECTION_LOST.
TEST_F(NetnsRecoveryE2eTest, CutLinkIsSeenByKeepaliveWithinThreeSeconds) {
  // Grace 500 ms: at most 1 s to the next ping, 1 s for its timeout, the grace, 50 ms ticks.
  ASSERT_NO_FATAL_FAILURE(StartDaemons({"--connection-lost-grace-ms=500"}));
  ASSERT_NO_FATAL_FAILURE(StartWorker(0, /*in_netns=*/true));
  v1::JobSpec spec = testing::RecoveryJobSpec("keepalive", corpus_, 1, 1000000);
  spec.mutable_fault()->set_heartbeat_timeout_ms(30000);
  spec.mutable_fault()->set_max_restarts(0);
  auto job = client_->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job_id();
  ASSERT_TRUE(Eventually([&] { return Status(id).step() >= 1; }, absl::Seconds(60))) << Logs();
  ASSERT_THAT(Status(id).worker_ids(), Contains(kCutWorkerId));

  ASSERT_TRUE(netns_->Cut().ok());
  const absl::Time cut_time = absl::Now();

  const v1::JobEvent* lost = nullptr;
  v1::JobStatus s;
  ASSERT_TRUE(Eventually(
      [&] {
        s = Status(id);
        for (const auto& e : s.events()) {
          const bool loss = e.type() == v1::CONNECTION_LOST || e.type() == v1::WORKER_LOST;
          if (loss && lost == nullptr) lost = &e;
        }
        return lost != nullptr;
      },
      absl::Seconds(20)))
      << "the cut link was not noticed within 20 s: " << Logs();
  EXPECT_EQ(lost->type(), v1::CONNECTION_LOST) << lost->message();
  EXPECT_THAT(lost->message(), HasSubstr(kCutWorkerId));
  EXPECT_THAT(lost->message(), HasSubstr("lost its connection"));
  const absl::Duration detection = FromProtoTime(lost->time()) - cut_time;
  std::printf("link cut: %s after %s\n", v1::JobEventType_Name(lost->type()).c_str(),
              absl::FormatDuration(detection).c_str());
  RecordProperty("detection_ms", static_cast<int>(absl::ToInt64Milliseconds(detection)));
  EXPECT_GT(detection, absl::ZeroDuration());
  EXPECT_LT(detection, absl::Seconds(3)) << Logs();
  EXPECT_TRUE(workers_[0]->Running()) << "the namespaced worker exited: " << Logs();
}

}  // namespace
}  // namespace weft
