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
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "common/security.h"
#include "common/time_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/pki.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/cluster.h"

namespace weft {
namespace {

using testing::BinDir;
using testing::CommandResult;
using testing::Eventually;
using testing::ExpectSameModel;
using testing::Subprocess;
using testing::TempDir;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int kSteps = 160;
// The bearer token the coordinator accepts (--auth-tokens-file) and the workers send.
constexpr char kToken[] = "netns-test-token-8d41c07e";
// Worker ids (--host "/cpu" --device index): the namespaced one is a member of the job from
// the start; host/cpu2 is the spare that replaces it.
constexpr char kCutWorkerId[] = "netns/cpu0";

// RunCommand execs a path, not a name looked up in PATH.
std::string FindIp() {
  for (const char* path : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(path, X_OK) == 0) return path;
  }
  return "";
}

class NetnsRecoveryE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = dir_.File("corpus.txt");
    testing::WriteFile(corpus_, testing::WordCorpus());
    ip_ = FindIp();
    if (ip_.empty()) GTEST_SKIP() << "no `ip` binary (iproute2) to build the test network";

    // Names and subnet derive from the pid so that concurrent runs do not collide (interface
    // names are at most 15 characters; a pid has at most 7 digits). The /30 is taken from
    // 198.18.0.0/15, the range reserved for network tests (RFC 2544), so it cannot shadow a
    // real network of the machine as a 10.x one could.
    const int pid = ::getpid();
    netns_ = absl::StrCat("weft", pid);
    host_veth_ = absl::StrCat("wv", pid, "h");
    ns_veth_ = absl::StrCat("wv", pid, "n");
    const int offset = pid % 32768 * 4;  // of the /30 in 198.18.0.0/15: 32768 of them
    const std::string subnet =
        absl::StrCat("198.", 18 + offset / 65536, ".", offset / 256 % 256, ".");
    host_ip_ = absl::StrCat(subnet, offset % 256 + 1);
    ns_ip_ = absl::StrCat(subnet, offset % 256 + 2);

    // Leftovers of a crashed run with the same pid would make `add` fail.
    (void)Ip({"netns", "del", netns_});
    (void)Ip({"link", "del", host_veth_});
    const std::vector<std::vector<std::string>> steps = {
        {"netns", "add", netns_},
        {"link", "add", host_veth_, "type", "veth", "peer", "name", ns_veth_},
        {"link", "set", ns_veth_, "netns", netns_},
        {"addr", "add", host_ip_ + "/30", "dev", host_veth_},
        {"link", "set", host_veth_, "up"},
        {"netns", "exec", netns_, ip_, "addr", "add", ns_ip_ + "/30", "dev", ns_veth_},
        {"netns", "exec", netns_, ip_, "link", "set", ns_veth_, "up"},
        {"netns", "exec", netns_, ip_, "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      network_created_ = true;  // from the first attempt on, TearDown cleans up
      const CommandResult r = Ip(step);
      if (r.exit_code != 0) {
        GTEST_SKIP() << "cannot build the test network (needs root: CAP_SYS_ADMIN and "
                        "CAP_NET_ADMIN): `ip "
                     << absl::StrJoin(step, " ") << "` exited " << r.exit_code << ": "
                     << absl::StripAsciiWhitespace(r.err);
      }
    }
  }

  void TearDown() override {
    // The namespaced worker may hang forever on its dead link; it must also be gone before
    // the namespace can disappear.
    for (auto& w : workers_) w->Signal(SIGKILL);
    if (checkpointd_) checkpointd_->Signal(SIGKILL);
    if (coordinator_) coordinator_->Signal(SIGKILL);
    for (auto& w : workers_) (void)w->Wait(absl::Seconds(10));
    if (checkpointd_) (void)checkpointd_->Wait(absl::Seconds(10));
    if (coordinator_) (void)coordinator_->Wait(absl::Seconds(10));
    if (network_created_) {
      (void)Ip({"netns", "del", netns_});
      (void)Ip({"link", "del", host_veth_});  // gone with the namespace unless that failed
    }
  }

  CommandResult Ip(std::vector<std::string> args) {
    args.insert(args.begin(), ip_);
    return testing::RunCommand(args, {}, absl::Seconds(10));
  }

  // The same job without interruption on two workers, all on 127.0.0.1.
  v1::JobStatus Uninterrupted() {
    return testing::RunUninterrupted(
        dir_.File("straight"), 2, testing::RecoveryJobSpec("partition", corpus_, 2, kSteps));
  }

  // Starts a process whose stdout and stderr go to dir_/<name>.log, and waits for it to write
  // its bound port to a file; returns "host_ip_:port".
  std::string StartDaemon(const std::string& name, std::vector<std::string> argv,
                          std::unique_ptr<Subprocess>* process) {
    const std::string port_file = dir_.File(name + ".port");
    argv.push_back("--port-file=" + port_file);
    auto p = Subprocess::Start(argv, dir_.File(name + ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return "";
    *process = std::move(*p);
    auto port = testing::WaitForFile(port_file, absl::Seconds(30));
    EXPECT_TRUE(port.ok()) << testing::ReadFile(dir_.File(name + ".log"));
    if (!port.ok()) return "";
    return absl::StrCat(host_ip_, ":", absl::StripAsciiWhitespace(*port));
  }

  // The coordinator and checkpointd listen on the host end of the veth pair, not on
  // 127.0.0.1 as every other test's do: the namespaced worker has its own loopback and reaches
  // the host only through the veth. Beyond loopback they serve only TLS, so this cluster runs
  // as a production one does: mutual TLS everywhere (each process presents a certificate from
  // the cluster CA) and a bearer token on every call to the coordinator.
  void StartDaemons() {
    pki_ = std::make_unique<testing::Pki>(std::vector<std::string>{host_ip_});
    ASSERT_TRUE(pki_->status().ok()) << pki_->status();
    testing::WriteFile(dir_.File("tokens"), absl::StrCat(kToken, "\n"));
    std::vector<std::string> coordinator = {
        BinDir() + "/weft-coordinator", absl::StrCat("--listen=", host_ip_, ":0"),
        "--data-dir=" + dir_.File("coordinator-db"), "--metrics-address=none",
        "--tick-interval-ms=50", "--auth-tokens-file=" + dir_.File("tokens")};
    for (const auto& flag : pki_->Flags("server")) coordinator.push_back(flag);
    coordinator_address_ = StartDaemon("coordinator", coordinator, &coordinator_);
    ASSERT_FALSE(coordinator_address_.empty());
    std::vector<std::string> checkpointd = {
        BinDir() + "/weft-checkpointd", absl::StrCat("--listen=", host_ip_, ":0"),
        "--data-dir=" + dir_.File("ckpt"), "--metrics-address=none"};
    for (const auto& flag : pki_->Flags("server")) checkpointd.push_back(flag);
    checkpointd_address_ = StartDaemon("checkpointd", checkpointd, &checkpointd_);
    ASSERT_FALSE(checkpointd_address_.empty());
    auto security = LoadSecurity({.cert_file = pki_->Pem("client-a"),
                                  .key_file = pki_->Key("client-a"),
                                  .ca_file = pki_->Pem("ca-a")},
                                 kToken);
    ASSERT_TRUE(security.ok()) << security.status();
    client_security_ = *security;
    ClientOptions options;
    options.channel.security = &client_security_;
    client_ = std::make_unique<CoordinatorClient>(coordinator_address_, options);
  }

  // Worker "<host>/cpu<device>", in the namespace when `in_netns`. Gloo listens on and
  // advertises --data-address, which must be reachable from the other side of the veth: the
  // default would be 127.0.0.1 only for a loopback coordinator, else the host name.
  void StartWorker(int device, bool in_netns) {
    std::vector<std::string> argv;
    // `ip netns exec` execs the command in place, so the Subprocess pid is the worker's.
    if (in_netns) argv = {ip_, "netns", "exec", netns_};
    const std::vector<std::string> worker = {
        BinDir() + "/weft-worker",
        "--coordinator=" + coordinator_address_,
        "--checkpointd=" + checkpointd_address_,
        absl::StrCat("--device=cpu:", device),
        in_netns ? "--host=netns" : "--host=host",
        in_netns ? "--host-id=netns" : "--host-id=host",
        "--data-address=" + (in_netns ? ns_ip_ : host_ip_),
        "--output-dir=" + dir_.File("models"),
        "--metrics-address=none"};
    argv.insert(argv.end(), worker.begin(), worker.end());
    // A worker's certificate is its client certificate: the servers require one from the CA.
    for (const auto& flag : pki_->Flags("client-a")) argv.push_back(flag);
    auto w = Subprocess::Start(argv, dir_.File(absl::StrCat("worker-cpu", device, ".log")),
                               {{"WEFT_TOKEN", kToken}});
    ASSERT_TRUE(w.ok()) << w.status();
    workers_.push_back(std::move(*w));
  }

  v1::JobStatus Status(const std::string& id) {
    auto job = client_->GetJob(id);
    return job.ok() ? job->status() : v1::JobStatus();
  }

  std::string Logs() {
    std::string all;
    for (const char* name :
         {"coordinator", "checkpointd", "worker-cpu0", "worker-cpu1", "worker-cpu2"}) {
      absl::StrAppend(&all, "\n--- ", name, "\n",
                      testing::ReadFile(dir_.File(absl::StrCat(name, ".log"))));
    }
    return all;
  }

  TempDir dir_;
  std::string corpus_;
  std::string ip_;
  std::string netns_, host_veth_, ns_veth_, host_ip_, ns_ip_;
  bool network_created_ = false;
  std::unique_ptr<Subprocess> coordinator_, checkpointd_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string coordinator_address_, checkpointd_address_;
  std::unique_ptr<testing::Pki> pki_;
  Security client_security_;
  std::unique_ptr<CoordinatorClient> client_;
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

  // Down on the namespace side: the host end only loses carrier and keeps its address and
  // local route, so the host's own traffic to host_ip_ (workers to the coordinator) goes on.
  const CommandResult cut = Ip({"netns", "exec", netns_, ip_, "link", "set", ns_veth_, "down"});
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
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

}  // namespace
}  // namespace weft
