// Several hosts on one machine: the CPU workers of two simulated hosts run in two network
// namespaces of their own (each joined to the machine by a veth pair), with the coordinator and
// checkpointd on the machine itself as a third. Nothing but routed IP joins the hosts, so every
// collective between them crosses a real (virtual) network: Gloo's connections from one
// namespace to the other are forwarded by the machine, as a switch would. The same job trains
// with full sharding and with hybrid sharding (ZeRO-3 within a host, replicated across the
// two); the first must give the model the same job gives on one host bit for bit (the network
// changes nothing the ranks compute), the second the same model up to float summation order.
// Each host's link is shaped to kLinkMbps each way (tc tbf, as bench/sim_cluster.sh does on the
// GPU machine), and the collectives must have crossed the shaped links.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2's `ip`, and a writable
// /proc/sys/net/ipv4/ip_forward (set to 1 for the test and restored after); skips without them.
#include <signal.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
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
using testing::Subprocess;
using testing::TempDir;
using ::testing::EndsWith;

constexpr int kSteps = 40;
constexpr int kLinkMbps = 200;
constexpr char kIpForward[] = "/proc/sys/net/ipv4/ip_forward";

class MultiHostE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_ = dir_.File("corpus.txt");
    testing::WriteFile(corpus_, testing::WordCorpus());
    for (int h = 0; h < 2; ++h) {
      auto netns = testing::Netns::Create();
      if (!netns.ok()) GTEST_SKIP() << netns.status();
      hosts_.push_back(std::move(*netns));
      if (absl::Status shaped = hosts_.back()->Shape(kLinkMbps); !shaped.ok()) {
        GTEST_SKIP() << shaped;
      }
    }
    // Packets from one namespace to the other pass the machine, which must forward them.
    saved_ip_forward_ = testing::ReadFile(kIpForward);
    if (saved_ip_forward_.empty() || !WriteIpForward("1")) {
      GTEST_SKIP() << "cannot enable " << kIpForward << " to route between the namespaces";
    }
  }

  void TearDown() override {
    for (auto& w : workers_) w->Signal(SIGKILL);
    for (auto& w : workers_) (void)w->Wait(absl::Seconds(10));
    daemons_.Kill();
    hosts_.clear();  // after their processes are gone
    if (!saved_ip_forward_.empty()) WriteIpForward(absl::StripAsciiWhitespace(saved_ip_forward_));
  }

  static bool WriteIpForward(absl::string_view value) {
    FILE* f = std::fopen(kIpForward, "w");
    if (f == nullptr) return false;
    const bool ok = std::fputs(std::string(value).c_str(), f) >= 0;
    return std::fclose(f) == 0 && ok;
  }

  // Worker "host-<h>/cpu<device>" in namespace h, dialing the daemons at its end of the pair.
  void StartWorker(int h, int device) {
    const testing::Netns& ns = *hosts_[h];
    const std::string host = absl::StrCat("host-", std::string(1, static_cast<char>('a' + h)));
    std::vector<std::string> argv = {BinDir() + "/weft-worker",
                                     absl::StrCat("--device=cpu:", device),
                                     "--host=" + host,
                                     "--host-id=" + host,
                                     "--data-address=" + ns.ns_ip(),
                                     "--collective-timeout-ms=30000",
                                     "--output-dir=" + dir_.File("models"),
                                     "--metrics-address=none"};
    for (const auto& flag : daemons_.WorkerFlags(ns.host_ip())) argv.push_back(flag);
    auto w = Subprocess::Start(ns.Wrap(argv),
                               dir_.File(absl::StrCat("worker-", host, "-", device, ".log")),
                               testing::TlsDaemons::Env());
    ASSERT_TRUE(w.ok()) << w.status();
    workers_.push_back(std::move(*w));
  }

  // Submits `spec` and waits for its end.
  v1::JobStatus Run(const v1::JobSpec& spec) {
    auto job = daemons_.client().SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    return testing::WaitForJobEnd(daemons_.client(), job->job_id(), absl::Seconds(180));
  }

  std::string Logs() {
    std::string all = daemons_.Logs();
    for (const char* host : {"host-a", "host-b"}) {
      for (int device : {0, 1}) {
        const std::string name = absl::StrCat("worker-", host, "-", device, ".log");
        absl::StrAppend(&all, "\n--- ", name, "\n", testing::ReadFile(dir_.File(name)));
      }
    }
    return all;
  }

  TempDir dir_;
  std::string corpus_;
  std::vector<std::unique_ptr<testing::Netns>> hosts_;
  std::string saved_ip_forward_;
  testing::TlsDaemons daemons_{dir_.path()};
  std::vector<std::unique_ptr<Subprocess>> workers_;
};

TEST_F(MultiHostE2eTest, TwoHostsInTheirOwnNamespacesTrainFullAndHybridSharded) {
  const v1::JobSpec spec = testing::RecoveryJobSpec("multihost", corpus_, 4, kSteps);
  const v1::JobStatus one_host = testing::RunUninterrupted(dir_.File("one-host"), 4, spec);
  ASSERT_EQ(one_host.state(), v1::SUCCEEDED);

  // Every daemon address a namespace dials: its own end of its pair.
  ASSERT_NO_FATAL_FAILURE(
      daemons_.Start("0.0.0.0", {hosts_[0]->host_ip(), hosts_[1]->host_ip()}));
  // Registration order interleaves the hosts; ranks must not.
  for (int device : {0, 1}) {
    for (int h : {1, 0}) ASSERT_NO_FATAL_FAILURE(StartWorker(h, device));
  }

  const v1::JobStatus full = Run(spec);
  ASSERT_EQ(full.state(), v1::SUCCEEDED) << full.DebugString() << Logs();
  // The generation's members in rank order, as its event lists them.
  std::string members;
  for (const auto& e : full.events()) {
    if (e.type() == v1::GENERATION_STARTED) members = e.message();
  }
  EXPECT_THAT(members, EndsWith("on 2 hosts (min 4, max 4): host-a/cpu0, host-a/cpu1, "
                                "host-b/cpu0, host-b/cpu1"));
  testing::ExpectSameModel(full, one_host);
  // Every rank's gathers and reduce-scatters crossed its host's shaped link: more than the
  // model's parameters (full sharding gathers each unit from the other host every step).
  for (const auto& host : hosts_) {
    auto bytes = host->ShapedBytes();
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_GT(*bytes, int64_t{1} << 20) << host->name();
  }

  v1::JobSpec hybrid_spec = spec;
  hybrid_spec.set_name("multihost-hybrid");
  hybrid_spec.mutable_sharding()->set_scope(v1::ShardingSpec::HOST);
  ASSERT_TRUE(Eventually(
      [&] {
        auto workers = daemons_.client().ListWorkers();
        if (!workers.ok()) return false;
        int idle = 0;
        for (const auto& w : *workers) idle += w.state() == v1::WORKER_IDLE;
        return idle == 4;
      },
      absl::Seconds(20)))
      << Logs();
  const v1::JobStatus hybrid = Run(hybrid_spec);
  ASSERT_EQ(hybrid.state(), v1::SUCCEEDED) << hybrid.DebugString() << Logs();
  EXPECT_THAT(Logs(), ::testing::HasSubstr("hybrid sharding, 2 replicas of 2 ranks"));
  testing::ExpectModelsClose(hybrid, full, 1e-4);
}

}  // namespace
}  // namespace weft
