// Several hosts on one machine: the CPU workers of two simulated hosts run in two network
// namespaces of their own (each joined to the machine by a veth pair), with the coordinator and
// checkpointd on the machine itself as a third. Nothing but routed IP joins the hosts, so every
// collective between them crosses a real (virtual) network: Gloo's connections from one
// namespace to the other are forwarded by the machine, as a switch would. The same job trains
// with full sharding and with hybrid sharding (ZeRO-3 within a host, replicated across the
// two); the first must give the model the same job gives on one host bit for bit (the network
// changes nothing the ranks compute), the second the same model up to float summation order.
// Then sharding AUTO, which must choose HOST here and train that model bit for bit, the
// optimizer shared out over the replicas (replica_optimizer OPTIMIZER_SHARDED: bit for bit too),
// and the compressed replica all-reduces (bf16, int8), which must cut the bytes rank 0 sends
// across hosts (its StepMetrics) and keep the loss near the exact run's.
// Each host's link is shaped to kLinkMbps each way (tc tbf, as bench/sim_cluster.sh does on the
// GPU machine), and the collectives must have crossed the shaped links.
//
// Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), iproute2's `ip`, and a writable
// /proc/sys/net/ipv4/ip_forward (set to 1 for the test and restored after); skips without them.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
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

  // The four workers idle again after a job (its generation's end reaches them in turn).
  void WaitForIdleWorkers() {
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

TEST_F(MultiHostE2eTest, TwoHostsInTheirOwnNamespacesTrainWithEveryShardingOption) {
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
  // Full sharding's one communicator spans both hosts: all of rank 0's traffic counts across
  // them (hosts told apart by each host's rank count: WORLD does not ask for the peers).
  EXPECT_GT(full.last_metrics().inter_host_bytes(), 0);
  EXPECT_EQ(full.last_metrics().intra_host_bytes(), 0);
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
  ASSERT_NO_FATAL_FAILURE(WaitForIdleWorkers());
  const v1::JobStatus hybrid = Run(hybrid_spec);
  ASSERT_EQ(hybrid.state(), v1::SUCCEEDED) << hybrid.DebugString() << Logs();
  EXPECT_THAT(Logs(), ::testing::HasSubstr("hybrid sharding, 2 replicas of 2 ranks"));
  testing::ExpectModelsClose(hybrid, full, 1e-4);
  // Rank 0's replica all-reduce is its only traffic across hosts; its group stays home.
  const v1::StepMetrics& exact = hybrid.last_metrics();
  EXPECT_GT(exact.inter_host_bytes(), 0);
  EXPECT_GT(exact.intra_host_bytes(), exact.inter_host_bytes());

  // AUTO on two even hosts whose ranks hold a replica: HOST, and with the format left exact,
  // the same job bit for bit. Its event says what it measured and why.
  v1::JobSpec auto_spec = spec;
  auto_spec.set_name("multihost-auto");
  auto_spec.mutable_sharding()->set_scope(v1::ShardingSpec::AUTO);
  ASSERT_NO_FATAL_FAILURE(WaitForIdleWorkers());
  const v1::JobStatus chosen = Run(auto_spec);
  ASSERT_EQ(chosen.state(), v1::SUCCEEDED) << chosen.DebugString() << Logs();
  std::string why;
  for (const auto& e : chosen.events()) {
    if (e.type() == v1::SHARDING_CHOSEN) why = e.message();
  }
  EXPECT_THAT(why, ::testing::StartsWith("HOST: 2 hosts of 2 ranks each"));
  EXPECT_THAT(why, ::testing::HasSubstr("replica all-reduce WIRE_FP32"));
  EXPECT_THAT(why, ::testing::HasSubstr("Gb/s measured across the hosts"));
  testing::ExpectSameModel(chosen, hybrid);

  // The optimizer shared out over the two replicas: a reduce-scatter and an fp32 all-gather
  // across the hosts instead of the all-reduce (as many bytes), every rank writing its piece
  // of the checkpoints, and the same model bit for bit.
  v1::JobSpec sharded_spec = hybrid_spec;
  sharded_spec.set_name("multihost-sharded-optimizer");
  sharded_spec.mutable_sharding()->set_replica_optimizer(v1::ShardingSpec::OPTIMIZER_SHARDED);
  ASSERT_NO_FATAL_FAILURE(WaitForIdleWorkers());
  const v1::JobStatus sharded = Run(sharded_spec);
  ASSERT_EQ(sharded.state(), v1::SUCCEEDED) << sharded.DebugString() << Logs();
  testing::ExpectSameModel(sharded, hybrid);
  EXPECT_NEAR(static_cast<double>(sharded.last_metrics().inter_host_bytes()),
              static_cast<double>(hybrid.last_metrics().inter_host_bytes()),
              0.01 * static_cast<double>(hybrid.last_metrics().inter_host_bytes()));

  // The compressed replica all-reduces: a half and about a quarter of the bytes across the
  // hosts, and the last step's loss near the exact one's (one step of a 40-step run at a high
  // learning rate: int8's noise moves it by a few percent; bench/gpu_train_bench.sh
  // wire_curve compares whole 300-step curves).
  struct Wire {
    v1::ShardingSpec::WireFormat format;
    double most_bytes, loss_tolerance;
  };
  for (const auto& [format, most, tolerance] : {Wire{v1::ShardingSpec::WIRE_BF16, 0.55, 0.02},
                                                Wire{v1::ShardingSpec::WIRE_INT8, 0.3, 0.05}}) {
    v1::JobSpec wire_spec = hybrid_spec;
    wire_spec.set_name(absl::AsciiStrToLower(absl::StrCat(
        "multihost-", v1::ShardingSpec::WireFormat_Name(format))).substr(0, 64));
    std::replace(wire_spec.mutable_name()->begin(), wire_spec.mutable_name()->end(), '_', '-');
    wire_spec.mutable_sharding()->set_replica_reduce_format(format);
    ASSERT_NO_FATAL_FAILURE(WaitForIdleWorkers());
    const v1::JobStatus run = Run(wire_spec);
    ASSERT_EQ(run.state(), v1::SUCCEEDED) << run.DebugString() << Logs();
    const v1::StepMetrics& m = run.last_metrics();
    EXPECT_LT(static_cast<double>(m.inter_host_bytes()), most * exact.inter_host_bytes())
        << v1::ShardingSpec::WireFormat_Name(format);
    EXPECT_EQ(m.intra_host_bytes(), exact.intra_host_bytes());
    EXPECT_NEAR(m.loss(), exact.loss(), tolerance * exact.loss())
        << v1::ShardingSpec::WireFormat_Name(format);
  }
}

}  // namespace
}  // namespace weft
