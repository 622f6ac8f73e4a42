// The coordinator as a real process on 127.0.0.1: rendezvous store semantics, rank assignment,
// failure detection with real stopped processes, hostile input, crash recovery and metrics;
// the store also through the worker's client of it, RemoteStore.
#include <signal.h>

#include <atomic>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "client/remote_store.h"
#include "common/job_spec.h"
#include "common/rpc.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace weft {
namespace {

using testing::CoordinatorProcess;
using testing::Eventually;
using testing::Subprocess;
using testing::TcpProxy;
using testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kSpecText[] = R"pb(
  name: "tiny"
  model { num_layers: 2 hidden_size: 64 num_heads: 4 vocab_size: 256 context_length: 64 }
  data { train_path: "/tmp/x.txt" format: DATA_FORMAT_TEXT_BYTES }
  optimizer { learning_rate: 0.001 }
  training { total_steps: 10 micro_batch_size: 4 }
  resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
  fault { heartbeat_interval_ms: 100 heartbeat_timeout_ms: 800 }
)pb";

// Workers driven by the test thread stop heartbeating while the test works; a long heartbeat
// timeout keeps their generation alive unless a test is about liveness.
v1::JobSpec Spec(int min_workers = 2, int64_t heartbeat_timeout_ms = 10000) {
  auto spec = ParseJobSpecText(kSpecText, "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_resources()->set_min_workers(min_workers);
  spec->mutable_fault()->set_heartbeat_timeout_ms(heartbeat_timeout_ms);
  return *spec;
}


class CoordinatorProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { StartCoordinator(); }

  // A coordinator on dir_ (a restarted one finds its state there) with fast liveness checks.
  void StartCoordinator() {
    auto cp = CoordinatorProcess::Start(dir_.path(), {"--heartbeat-interval-ms=100",
                                                      "--heartbeat-timeout-ms=800",
                                                      "--tick-interval-ms=20"});
    ASSERT_TRUE(cp.ok()) << cp.status();
    coordinator_ = std::move(*cp);
    Connect();
  }

  void Connect() {
    channel_ = MakeChannel(coordinator_->address());
    stub_ = v1::Coordinator::NewStub(channel_);
    store_stub_ = v1::Store::NewStub(channel_);
  }

  void Restart() {
    coordinator_->process().Signal(SIGKILL);
    ASSERT_TRUE(coordinator_->process().Wait(absl::Seconds(10)).ok());
    StartCoordinator();
  }

  absl::StatusOr<std::string> Submit(const v1::JobSpec& spec) {
    v1::SubmitJobRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitJobResponse resp;
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(10));
    grpc::Status s = stub_->SubmitJob(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    return resp.job_id();
  }

  // Calls `method` on the stub with a 10 s deadline; a failed call fails the test.
  template <typename Request, typename Response>
  Response Call(grpc::Status (v1::Coordinator::Stub::*method)(grpc::ClientContext*,
                                                              const Request&, Response*),
                const Request& request) {
    Response response;
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(10));
    grpc::Status s = (stub_.get()->*method)(&ctx, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  v1::Job GetJob(const std::string& id) {
    v1::GetJobRequest req;
    req.set_job_id(id);
    return Call(&v1::Coordinator::Stub::GetJob, req);
  }

  std::vector<v1::WorkerStatus> Workers() {
    const v1::ListWorkersResponse resp =
        Call(&v1::Coordinator::Stub::ListWorkers, v1::ListWorkersRequest());
    return {resp.workers().begin(), resp.workers().end()};
  }

  // An in-process worker: registers, then heartbeats until it is told to join.
  struct ThreadWorker {
    v1::RegisterWorkerResponse registration;
    v1::JoinJobCommand join;
  };

  v1::RegisterWorkerResponse Register(const std::string& host, int device_index) {
    v1::RegisterWorkerRequest req;
    req.mutable_info()->set_host(host);
    req.mutable_info()->set_device_kind(v1::DEVICE_KIND_CPU);
    req.mutable_info()->set_device_index(device_index);
    req.mutable_info()->set_address(absl::StrCat(host, ":", 20000 + device_index));
    return Call(&v1::Coordinator::Stub::RegisterWorker, req);
  }

  // One idle heartbeat of `reg` over `stub` (held up to 100 ms for a command).
  static grpc::Status Beat(v1::Coordinator::Stub& stub, const v1::RegisterWorkerResponse& reg,
                           v1::HeartbeatResponse* response) {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(reg.worker_id());
    hb.set_incarnation(reg.incarnation());
    hb.set_wait_for_command_ms(100);
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(5));
    return stub.Heartbeat(&ctx, hb, response);
  }

  absl::StatusOr<v1::JoinJobCommand> AwaitJoinCommand(const v1::RegisterWorkerResponse& reg,
                                                      absl::Duration timeout = absl::Seconds(10)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      v1::HeartbeatResponse resp;
      grpc::Status s = Beat(*stub_, reg, &resp);
      if (!s.ok()) return FromGrpcStatus(s);
      for (const auto& c : resp.commands()) {
        if (c.has_join_job()) return c.join_job();
      }
    }
    return absl::DeadlineExceededError("no join command");
  }

  absl::StatusOr<v1::JoinResponse> Join(const v1::RegisterWorkerResponse& reg,
                                        const v1::JoinJobCommand& cmd,
                                        absl::Duration timeout = absl::Seconds(10)) {
    v1::JoinRequest req;
    req.set_job_id(cmd.job_id());
    req.set_generation(cmd.generation());
    req.set_worker_id(reg.worker_id());
    req.set_incarnation(reg.incarnation());
    req.set_include_peers(true);
    v1::JoinResponse resp;
    grpc::ClientContext ctx;
    SetTimeout(&ctx, timeout);
    grpc::Status s = stub_->Join(&ctx, req, &resp);
    if (!s.ok()) return FromGrpcStatus(s);
    return resp;
  }

  // Submits a 2-worker job and forms its generation 1 with two in-process workers.
  v1::StoreScope StartGeneration() {
    auto id = Submit(Spec(2));
    EXPECT_TRUE(id.ok()) << id.status();
    auto a = Register("host-a", 0);
    auto b = Register("host-a", 1);
    auto ja = AwaitJoinCommand(a);
    auto jb = AwaitJoinCommand(b);
    EXPECT_TRUE(ja.ok() && jb.ok());
    v1::StoreScope scope;
    scope.set_job_id(*id);
    scope.set_generation(ja->generation());
    return scope;
  }

  // weft-sim-worker processes <host>/cpu0..n-1, logging to <host><i>.log.
  std::vector<std::unique_ptr<Subprocess>> StartSimWorkers(
      int n, const std::vector<std::string>& extra_args = {}, const std::string& host = "node") {
    std::vector<std::unique_ptr<Subprocess>> workers;
    for (int i = 0; i < n; ++i) {
      std::vector<std::string> argv = {testing::BinDir() + "/weft-sim-worker",
                                       "--coordinator=" + coordinator_->address(), "--host=" + host,
                                       absl::StrCat("--device-index=", i)};
      argv.insert(argv.end(), extra_args.begin(), extra_args.end());
      auto p = Subprocess::Start(argv, dir_.File(absl::StrCat(host, i, ".log")));
      EXPECT_TRUE(p.ok()) << p.status();
      if (p.ok()) workers.push_back(std::move(*p));
    }
    return workers;
  }

  TempDir dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  std::unique_ptr<v1::Store::Stub> store_stub_;
};

// ---- store ---------------------------------------------------------------------------------

TEST_F(CoordinatorProcessTest, StoreSetGetAddCompareSetDelete) {
  const v1::StoreScope scope = StartGeneration();
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(5));
    return (store_stub_.get()->*method)(&ctx, req, resp);
  };
  v1::StoreGetRequest get;
  *get.mutable_scope() = scope;
  get.set_key("nccl/unique_id");
  v1::StoreGetResponse got;
  EXPECT_EQ(call(&v1::Store::Stub::Get, get, &got).error_code(), grpc::StatusCode::NOT_FOUND);

  v1::StoreSetRequest set;
  *set.mutable_scope() = scope;
  set.set_key("nccl/unique_id");
  set.set_value(std::string("\x00\x01\xff", 3));
  v1::StoreSetResponse set_resp;
  ASSERT_TRUE(call(&v1::Store::Stub::Set, set, &set_resp).ok());
  ASSERT_TRUE(call(&v1::Store::Stub::Get, get, &got).ok());
  EXPECT_EQ(got.value(), std::string("\x00\x01\xff", 3));

  v1::StoreAddRequest add;
  *add.mutable_scope() = scope;
  add.set_key("arrivals");
  add.set_delta(5);
  v1::StoreAddResponse added;
  ASSERT_TRUE(call(&v1::Store::Stub::Add, add, &added).ok());
  EXPECT_EQ(added.value(), 5);
  add.set_delta(-2);
  ASSERT_TRUE(call(&v1::Store::Stub::Add, add, &added).ok());
  EXPECT_EQ(added.value(), 3);
  add.set_key("nccl/unique_id");  // not a number
  EXPECT_EQ(call(&v1::Store::Stub::Add, add, &added).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);

  v1::StoreCompareSetRequest cas;
  *cas.mutable_scope() = scope;
  cas.set_key("leader");
  cas.set_expect_absent(true);
  cas.set_desired_value("w1");
  v1::StoreCompareSetResponse cas_resp;
  ASSERT_TRUE(call(&v1::Store::Stub::CompareSet, cas, &cas_resp).ok());
  EXPECT_TRUE(cas_resp.swapped());
  cas.set_desired_value("w2");
  ASSERT_TRUE(call(&v1::Store::Stub::CompareSet, cas, &cas_resp).ok());
  EXPECT_FALSE(cas_resp.swapped());
  EXPECT_EQ(cas_resp.value(), "w1");
  cas.set_expect_absent(false);
  cas.set_expected_value("w1");
  ASSERT_TRUE(call(&v1::Store::Stub::CompareSet, cas, &cas_resp).ok());
  EXPECT_TRUE(cas_resp.swapped());
  EXPECT_EQ(cas_resp.value(), "w2");

  v1::StoreDeleteRequest del;
  *del.mutable_scope() = scope;
  del.set_key("leader");
  v1::StoreDeleteResponse deleted;
  ASSERT_TRUE(call(&v1::Store::Stub::Delete, del, &deleted).ok());
  EXPECT_TRUE(deleted.deleted());
  ASSERT_TRUE(call(&v1::Store::Stub::Delete, del, &deleted).ok());
  EXPECT_FALSE(deleted.deleted());

  // Bad input names the field; a scope naming a generation that never existed is NOT_FOUND.
  set.set_key("");
  grpc::Status empty_key = call(&v1::Store::Stub::Set, set, &set_resp);
  EXPECT_EQ(empty_key.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty_key.error_message(), HasSubstr("key"));
  get.mutable_scope()->set_generation(99);
  grpc::Status future = call(&v1::Store::Stub::Get, get, &got);
  EXPECT_EQ(future.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(future.error_message(), HasSubstr("generation"));
}

TEST_F(CoordinatorProcessTest, StoreWaitTimesOutNamingMissingKeysAndWakesOnSet) {
  const v1::StoreScope scope = StartGeneration();
  v1::StoreWaitRequest wait;
  *wait.mutable_scope() = scope;
  wait.add_keys("a");
  wait.add_keys("b");
  wait.set_timeout_ms(300);
  {
    v1::StoreSetRequest set;
    *set.mutable_scope() = scope;
    set.set_key("a");
    v1::StoreSetResponse r;
    grpc::ClientContext ctx;
    ASSERT_TRUE(store_stub_->Set(&ctx, set, &r).ok());
  }
  const absl::Time start = absl::Now();
  v1::StoreWaitResponse waited;
  grpc::ClientContext ctx;
  SetTimeout(&ctx, absl::Seconds(5));
  grpc::Status s = store_stub_->Wait(&ctx, wait, &waited);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(s.error_message(), HasSubstr("missing keys: b"));
  EXPECT_GE(took, absl::Milliseconds(290));
  EXPECT_LT(took, absl::Seconds(3));

  // A waiter on another connection is released by a later Set.
  wait.set_timeout_ms(10000);
  std::atomic<bool> released{false};
  grpc::Status waiter_status;
  std::thread waiter([&] {
    auto stub = v1::Store::NewStub(MakeChannel(coordinator_->address(), {.private_connection = true}));
    grpc::ClientContext wctx;
    SetTimeout(&wctx, absl::Seconds(15));
    v1::StoreWaitResponse r;
    waiter_status = stub->Wait(&wctx, wait, &r);
    released = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(released.load());
  v1::StoreSetRequest set;
  *set.mutable_scope() = scope;
  set.set_key("b");
  v1::StoreSetResponse r;
  grpc::ClientContext sctx;
  ASSERT_TRUE(store_stub_->Set(&sctx, set, &r).ok());
  waiter.join();
  EXPECT_TRUE(waiter_status.ok()) << waiter_status.error_message();
}

TEST_F(CoordinatorProcessTest, CompareSetRaceAcrossConnectionsLosesNoIncrement) {
  const v1::StoreScope scope = StartGeneration();
  constexpr int kThreads = 6, kIncrements = 40;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      auto stub =
          v1::Store::NewStub(MakeChannel(coordinator_->address(), {.private_connection = true}));
      for (int i = 0; i < kIncrements; ++i) {
        while (true) {
          v1::StoreCompareSetRequest read;  // read by a CAS that cannot succeed
          *read.mutable_scope() = scope;
          read.set_key("counter");
          read.set_expected_value("\x01impossible");
          read.set_desired_value("");
          v1::StoreCompareSetResponse current;
          grpc::ClientContext rctx;
          if (!stub->CompareSet(&rctx, read, &current).ok()) {
            ++failures;
            return;
          }
          const int value = current.exists() ? std::stoi(current.value()) : 0;
          v1::StoreCompareSetRequest cas;
          *cas.mutable_scope() = scope;
          cas.set_key("counter");
          if (current.exists()) {
            cas.set_expected_value(current.value());
          } else {
            cas.set_expect_absent(true);
          }
          cas.set_desired_value(std::to_string(value + 1));
          v1::StoreCompareSetResponse swapped;
          grpc::ClientContext cctx;
          if (!stub->CompareSet(&cctx, cas, &swapped).ok()) {
            ++failures;
            return;
          }
          if (swapped.swapped()) break;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  v1::StoreGetRequest get;
  *get.mutable_scope() = scope;
  get.set_key("counter");
  v1::StoreGetResponse got;
  grpc::ClientContext ctx;
  ASSERT_TRUE(store_stub_->Get(&ctx, get, &got).ok());
  EXPECT_EQ(got.value(), std::to_string(kThreads * kIncrements));
}

TEST_F(CoordinatorProcessTest, EndedGenerationAbortsBlockedWaitAndStoreCalls) {
  const v1::StoreScope scope = StartGeneration();
  grpc::Status waiter_status;
  std::thread waiter([&] {
    auto stub = v1::Store::NewStub(MakeChannel(coordinator_->address(), {.private_connection = true}));
    v1::StoreWaitRequest wait;
    *wait.mutable_scope() = scope;
    wait.add_keys("never");
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(30));
    v1::StoreWaitResponse r;
    waiter_status = stub->Wait(&ctx, wait, &r);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const absl::Time cancelled_at = absl::Now();
  {
    v1::CancelJobRequest cancel;
    cancel.set_job_id(scope.job_id());
    v1::JobStatus status;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CancelJob(&ctx, cancel, &status).ok());
    EXPECT_EQ(status.state(), v1::CANCELLED);
  }
  waiter.join();
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(2));
  EXPECT_EQ(waiter_status.error_code(), grpc::StatusCode::ABORTED);
  v1::StoreSetRequest set;
  *set.mutable_scope() = scope;
  set.set_key("x");
  v1::StoreSetResponse r;
  grpc::ClientContext ctx;
  EXPECT_EQ(store_stub_->Set(&ctx, set, &r).error_code(), grpc::StatusCode::ABORTED);
}

// The worker's view of the store (client/remote_store.h) against the same process: every
// Store method through RemoteStore and a PrefixStore over it, Wait's three timeout modes, and
// the ABORTED that a generation's end gives a waiter and every later call.
TEST_F(CoordinatorProcessTest, RemoteStoreKeepsTheStoreContract) {
  const v1::StoreScope scope = StartGeneration();
  RemoteStore store({channel_, "coordinator"}, scope.job_id(), scope.generation());
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kNotFound);
  const std::string binary("\x00\x01\xff", 3);
  ASSERT_TRUE(store.Set("k", binary).ok());
  auto got = store.Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, binary);
  ASSERT_TRUE(store.Set("empty", "").ok());
  got = store.Get("empty");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");

  auto sum = store.Add("n", 7);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, 7);
  sum = store.Add("n", -10);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(*sum, -3);
  EXPECT_EQ(store.Add("k", 1).status().code(), absl::StatusCode::kInvalidArgument);

  // Absent versus empty: the flag RemoteStore sets, since proto3 bytes cannot tell them apart.
  auto cas = store.CompareSet("empty", std::nullopt, "x");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_FALSE(cas->swapped);
  EXPECT_EQ(cas->value, std::optional<std::string>(""));
  cas = store.CompareSet("empty", std::string(""), "x");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_TRUE(cas->swapped);
  EXPECT_EQ(cas->value, std::optional<std::string>("x"));
  cas = store.CompareSet("fresh", std::string(""), "y");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_FALSE(cas->swapped);
  EXPECT_EQ(cas->value, std::nullopt) << "an expected value must not create the key";
  cas = store.CompareSet("fresh", std::nullopt, "y");
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_TRUE(cas->swapped);

  auto deleted = store.Delete("fresh");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_TRUE(*deleted);
  deleted = store.Delete("fresh");
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_FALSE(*deleted);

  // A prefix namespaces the keys on the server, where an unprefixed view sees them whole.
  PrefixStore gloo("gloo", &store);
  ASSERT_TRUE(gloo.Set("addr/0", "a").ok());
  got = store.Get("gloo/addr/0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "a");
  EXPECT_EQ(gloo.Get("k").status().code(), absl::StatusCode::kNotFound);

  // Wait: zero checks once, a finite timeout names what is missing, infinity waits for a Set
  // from another connection.
  EXPECT_TRUE(store.Wait({"k", "n"}, absl::ZeroDuration()).ok());
  absl::Status once = store.Wait({"k", "late"}, absl::ZeroDuration());
  EXPECT_EQ(once.code(), absl::StatusCode::kDeadlineExceeded);
  absl::Status timed = store.Wait({"k", "late"}, absl::Milliseconds(200));
  EXPECT_EQ(timed.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(timed.message(), HasSubstr("late"));
  std::atomic<bool> released{false};
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] {
    RemoteStore own({MakeChannel(coordinator_->address(), {.private_connection = true}),
                     "coordinator"},
                    scope.job_id(), scope.generation());
    waited = own.Wait({"late"}, absl::InfiniteDuration());
    released = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_FALSE(released.load());
  ASSERT_TRUE(store.Set("late", "1").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;

  // The generation ends under a waiter that would otherwise wait forever.
  absl::Status aborted = absl::UnknownError("not run");
  std::thread forever([&] { aborted = store.Wait({"never"}, absl::InfiniteDuration()); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  {
    v1::CancelJobRequest cancel;
    cancel.set_job_id(scope.job_id());
    v1::JobStatus status;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CancelJob(&ctx, cancel, &status).ok());
  }
  forever.join();
  EXPECT_EQ(aborted.code(), absl::StatusCode::kAborted) << aborted;
  EXPECT_EQ(store.Set("k", "v").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kAborted);
}

// A connection lost under the store's calls while the coordinator lives (a proxy in between
// resets it): what is safe to send twice goes again and succeeds, so a rendezvous or a
// checkpoint commit is not lost with it; Add is sent once, and fails rather than risk adding
// twice.
TEST_F(CoordinatorProcessTest, RemoteStoreCallsOutlastALostConnection) {
  const v1::StoreScope scope = StartGeneration();
  auto proxy = testing::TcpProxy::Start(coordinator_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  TcpProxy& link = **proxy;
  const std::string who = "coordinator " + link.address();
  RemoteStore store({MakeChannel(link.address(), {.private_connection = true}), who},
                    scope.job_id(), scope.generation());
  RemoteStore direct({channel_, "coordinator"}, scope.job_id(), scope.generation());
  ASSERT_TRUE(store.Set("warm", "1").ok());

  // The reply is lost after the server got the request.
  link.CutOnNextGrpcResponse();
  absl::Status set = store.Set("k", "v");
  EXPECT_TRUE(set.ok()) << set;
  link.CutOnNextGrpcResponse();
  auto got = store.Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  EXPECT_EQ(link.cuts(), 2);

  // A waiter's connection reset while the server holds its call: it waits again, within its
  // timeout, and sees the key that another rank sets later.
  absl::Status waited = absl::UnknownError("not run");
  const int64_t before = link.bytes_to_server();
  std::thread waiter([&] { waited = store.Wait({"late"}, absl::Seconds(30)); });
  ASSERT_TRUE(Eventually([&] { return link.bytes_to_server() > before; }, absl::Seconds(10)));
  // Time for the server to read the request and start waiting.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  link.CutAll();
  EXPECT_EQ(link.cuts(), 3);
  // The key appears only once the waiter is back (had it come first, the repeated Wait would
  // find it at once, and pass the same).
  const int64_t after_cut = link.bytes_to_server();
  ASSERT_TRUE(
      Eventually([&] { return link.bytes_to_server() > after_cut; }, absl::Seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(direct.Set("late", "1").ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
  EXPECT_GE(link.accepted(), 2) << "the waiter came back over a new connection";

  // Add's reply lost: it reports the failure; the server applied it once at most.
  link.CutOnNextGrpcResponse();
  auto sum = store.Add("n", 1);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kUnavailable) << sum.status();
  EXPECT_THAT(sum.status().message(), HasSubstr(who + " unreachable"));
  auto applied = direct.Add("n", 0);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_LE(*applied, 1) << "an Add whose reply was lost must not be sent again";
}

// ---- rendezvous ----------------------------------------------------------------------------

TEST_F(CoordinatorProcessTest, RanksAreContiguousPerHostAndOrderedByDevice) {
  auto id = Submit(Spec(4));
  ASSERT_TRUE(id.ok()) << id.status();
  // Registered in scrambled order.
  std::vector<std::pair<std::string, int>> order = {
      {"host-b", 1}, {"host-a", 1}, {"host-b", 0}, {"host-a", 0}};
  std::vector<v1::RegisterWorkerResponse> regs;
  for (const auto& [host, dev] : order) regs.push_back(Register(host, dev));
  std::vector<v1::JoinJobCommand> cmds;
  for (const auto& reg : regs) {
    auto cmd = AwaitJoinCommand(reg);
    ASSERT_TRUE(cmd.ok()) << cmd.status();
    cmds.push_back(*cmd);
  }
  std::vector<absl::StatusOr<v1::JoinResponse>> joins(regs.size(),
                                                      absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < regs.size(); ++i) {
    threads.emplace_back([&, i] { joins[i] = Join(regs[i], cmds[i]); });
  }
  for (auto& t : threads) t.join();
  const std::map<std::string, int> expected_rank = {
      {"host-a/cpu0", 0}, {"host-a/cpu1", 1}, {"host-b/cpu0", 2}, {"host-b/cpu1", 3}};
  for (size_t i = 0; i < regs.size(); ++i) {
    ASSERT_TRUE(joins[i].ok()) << joins[i].status();
    EXPECT_EQ(joins[i]->rank(), expected_rank.at(regs[i].worker_id()));
    EXPECT_EQ(cmds[i].rank(), joins[i]->rank());
    EXPECT_EQ(joins[i]->world_size(), 4);
    EXPECT_EQ(joins[i]->local_world_size(), 2);
    EXPECT_EQ(joins[i]->local_rank(), joins[i]->rank() % 2);
    ASSERT_EQ(joins[i]->peers_size(), 4);
    EXPECT_EQ(joins[i]->peers(2).worker_id(), "host-b/cpu0");
    EXPECT_EQ(joins[i]->peers(2).address(), "host-b:20000");
  }
  EXPECT_EQ(GetJob(*id).status().state(), v1::RUNNING);
}

// The connection of a member is reset twice in its rendezvous, as a flaky network or a
// restarted proxy does it, and the generation still forms: the heartbeat answer that carried
// its JoinJob is lost after the coordinator wrote it (its next heartbeat, which names no job,
// gets the JoinJob again), and its Join is cut while the coordinator holds it for the other
// member (CoordinatorClient::Join goes again, and the coordinator answers the repeat like the
// first). GetJob names the members that have not joined all along.
TEST_F(CoordinatorProcessTest, ARendezvousOutlastsLostConnections) {
  auto id = Submit(Spec(2));
  ASSERT_TRUE(id.ok()) << id.status();
  const auto a = Register("h", 0);
  const auto b = Register("h", 1);
  auto joined_a = AwaitJoinCommand(a);
  ASSERT_TRUE(joined_a.ok()) << joined_a.status();
  auto proxy = TcpProxy::Start(coordinator_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  TcpProxy& link = **proxy;
  const auto b_channel = MakeChannel(link.address(), {.private_connection = true});
  const auto b_stub = v1::Coordinator::NewStub(b_channel);

  // b's JoinJob is lost with the answer that carried it.
  link.CutOnNextGrpcResponse();
  v1::HeartbeatResponse lost;
  const grpc::Status cut = Beat(*b_stub, b, &lost);
  ASSERT_EQ(cut.error_code(), grpc::StatusCode::UNAVAILABLE) << cut.error_message();
  ASSERT_EQ(link.cuts(), 1);
  // Its next heartbeat names no job, and gets it again.
  auto joined_b = AwaitJoinCommand(b, absl::Seconds(5));
  ASSERT_TRUE(joined_b.ok()) << "the lost JoinJob was not sent again: " << joined_b.status();
  EXPECT_EQ(joined_b->job_id(), *id);
  EXPECT_EQ(joined_b->generation(), joined_a->generation());
  EXPECT_EQ(joined_b->rank(), 1);
  EXPECT_EQ(joined_b->world_size(), 2);
  EXPECT_THAT(testing::ReadFile(coordinator_->log_path()),
              HasSubstr("the answer that carried its JoinJob was lost; sending it again"));
  const auto awaiting = [&] {
    const v1::JobStatus s = GetJob(*id).status();
    return std::vector<std::string>(s.awaiting_join().begin(), s.awaiting_join().end());
  };
  EXPECT_EQ(awaiting(), (std::vector<std::string>{"h/cpu0", "h/cpu1"}));

  // b's Join is cut while the coordinator holds it for a.
  CoordinatorClient b_client(b_channel);
  v1::JoinRequest join;
  join.set_job_id(*id);
  join.set_generation(joined_b->generation());
  join.set_worker_id(b.worker_id());
  join.set_incarnation(b.incarnation());
  absl::StatusOr<v1::JoinResponse> b_joined = absl::UnknownError("not run");
  std::thread b_thread([&] { b_joined = b_client.Join(join, absl::Seconds(30)); });
  ASSERT_TRUE(Eventually([&] { return awaiting() == std::vector<std::string>{"h/cpu0"}; },
                         absl::Seconds(10)))
      << "b's Join never reached the coordinator";
  link.CutAll();
  EXPECT_EQ(link.cuts(), 2);
  // b comes back over a new connection before a completes the group (had a come first, the
  // repeat would be answered at once and pass the same).
  EXPECT_TRUE(Eventually([&] { return link.accepted() >= 3; }, absl::Seconds(10)));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  auto a_joined = Join(a, *joined_a);
  b_thread.join();
  ASSERT_TRUE(a_joined.ok()) << a_joined.status();
  ASSERT_TRUE(b_joined.ok()) << "a Join cut while held must go again: " << b_joined.status();
  EXPECT_EQ(b_joined->rank(), 1);
  EXPECT_EQ(b_joined->world_size(), 2);
  EXPECT_TRUE(awaiting().empty());
  EXPECT_EQ(GetJob(*id).status().restarts(), 0);
}

// Rank 0's report that the job finished has its answer lost: it goes again, and the repeat,
// which meets an ended generation, is answered like the first. Sent once, the job would wait
// for its stall timeout and restart.
TEST_F(CoordinatorProcessTest, AFinishedReportWhoseAnswerIsLostStillEndsTheJob) {
  auto id = Submit(Spec(2));
  ASSERT_TRUE(id.ok()) << id.status();
  const auto a = Register("h", 0);
  const auto b = Register("h", 1);
  auto ja = AwaitJoinCommand(a);
  auto jb = AwaitJoinCommand(b);
  ASSERT_TRUE(ja.ok() && jb.ok());
  std::thread b_joins([&] { EXPECT_TRUE(Join(b, *jb).ok()); });
  ASSERT_TRUE(Join(a, *ja).ok());
  b_joins.join();
  auto proxy = TcpProxy::Start(coordinator_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  TcpProxy& link = **proxy;
  CoordinatorClient rank0(MakeChannel(link.address(), {.private_connection = true}));

  v1::ReportProgressRequest done;
  done.set_job_id(*id);
  done.set_generation(ja->generation());
  done.set_worker_id(a.worker_id());
  done.set_rank(0);
  done.set_finished(true);
  done.set_model_path("/models/m.safetensors");
  link.CutOnNextGrpcResponse();
  auto answer = rank0.ReportProgress(done);
  ASSERT_TRUE(answer.ok()) << "a finished report whose answer was lost must go again: "
                           << answer.status();
  EXPECT_FALSE(answer->continue_training());
  EXPECT_EQ(link.cuts(), 1);
  const v1::JobStatus s = GetJob(*id).status();
  EXPECT_EQ(s.state(), v1::SUCCEEDED);
  EXPECT_EQ(s.model_path(), "/models/m.safetensors");
  EXPECT_EQ(s.restarts(), 0);
}

TEST_F(CoordinatorProcessTest, JoinTimesOutNamingTheMissingWorker) {
  auto id = Submit(Spec(2));
  ASSERT_TRUE(id.ok());
  auto a = Register("h", 0);
  auto b = Register("h", 1);
  auto cmd = AwaitJoinCommand(a);
  ASSERT_TRUE(cmd.ok());
  auto joined = Join(a, *cmd, absl::Milliseconds(400));
  EXPECT_EQ(joined.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(joined.status().message()), HasSubstr("h/cpu1"));
  // A worker that is not a member is refused.
  auto c = Register("h", 2);
  auto stranger = Join(c, *cmd);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kFailedPrecondition);
}

// ---- failure detection with real processes -------------------------------------------------

TEST_F(CoordinatorProcessTest, StoppedWorkerProcessIsDeclaredDeadAndGenerationEnds) {
  auto id = Submit(Spec(2, /*heartbeat_timeout_ms=*/800));
  ASSERT_TRUE(id.ok());
  auto workers = StartSimWorkers(2);
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_TRUE(Eventually([&] {
    return GetJob(*id).status().state() == v1::RUNNING;
  })) << testing::ReadFile(coordinator_->log_path());
  workers[1]->Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(Eventually([&] {
    return GetJob(*id).status().state() != v1::RUNNING;
  }));
  const absl::Duration detect = absl::Now() - stopped;
  const v1::Job job = GetJob(*id);
  // One worker left of the two it needs: it waits for another.
  EXPECT_EQ(job.status().state(), v1::PENDING);
  EXPECT_EQ(job.status().restarts(), 1);
  bool lost_event = false;
  for (const auto& e : job.status().events()) {
    if (e.type() == v1::WORKER_LOST) {
      lost_event = true;
      EXPECT_THAT(e.message(), HasSubstr("node/cpu1"));
      EXPECT_THAT(e.message(), HasSubstr("missed heartbeats"));
    }
  }
  EXPECT_TRUE(lost_event);
  // Timeout 800 ms, ticks of 20 ms: detected well before twice the timeout.
  EXPECT_GE(detect, absl::Milliseconds(700));
  EXPECT_LT(detect, absl::Seconds(3));
  bool dead = false;
  for (const auto& w : Workers()) {
    if (w.info().worker_id() == "node/cpu1") dead = w.state() == v1::WORKER_DEAD;
  }
  EXPECT_TRUE(dead);
  // The survivor was told to abort, and the stopped worker, once resumed, is idle again.
  EXPECT_TRUE(Eventually([&] {
    return absl::StrContains(testing::ReadFile(dir_.File("node0.log")), "abort " + *id);
  }));
  workers[1]->Signal(SIGCONT);
  EXPECT_TRUE(Eventually([&] { return GetJob(*id).status().state() == v1::RUNNING; }))
      << "the two workers should form generation 2";
  EXPECT_EQ(GetJob(*id).status().generation(), 2);
}

TEST_F(CoordinatorProcessTest, KilledWorkerProcessFailsJobWhenRestartBudgetIsZero) {
  v1::JobSpec spec = Spec(2, /*heartbeat_timeout_ms=*/800);
  spec.mutable_fault()->set_max_restarts(0);
  auto id = Submit(spec);
  ASSERT_TRUE(id.ok());
  auto workers = StartSimWorkers(2);
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_TRUE(Eventually([&] { return GetJob(*id).status().state() == v1::RUNNING; }));
  workers[0]->Signal(SIGKILL);
  ASSERT_TRUE(Eventually([&] { return GetJob(*id).status().state() == v1::FAILED; }));
  const v1::Job job = GetJob(*id);
  EXPECT_THAT(job.status().error(), HasSubstr("node/cpu0"));
  EXPECT_THAT(job.status().error(), HasSubstr("restart budget exhausted"));
}

// An exited process drops its connection: its session is cancelled and the worker is dead
// after the 1 s grace, not after the job's 30 s heartbeat timeout — whenever it dies. Each
// round kills at a different moment (as it takes its JoinJob answer, while joining, while
// training); a held heartbeat missed the deaths that fell between two calls.
TEST_F(CoordinatorProcessTest, KilledWorkerIsDeclaredDeadFromItsDroppedSession) {
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrCat("round ", round));
    auto id = Submit(Spec(2, /*heartbeat_timeout_ms=*/30000));
    ASSERT_TRUE(id.ok());
    // Fresh worker ids each round: the last round's survivor may not be declared dead yet.
    const std::string host = absl::StrCat("round", round);
    auto workers = StartSimWorkers(2, {}, host);
    ASSERT_EQ(workers.size(), 2u);
    ASSERT_TRUE(Eventually([&] { return GetJob(*id).status().state() == v1::RUNNING; }));
    absl::SleepFor(absl::Milliseconds(37) * round * round);
    workers[1]->Signal(SIGKILL);
    const absl::Time killed = absl::Now();
    ASSERT_TRUE(Eventually([&] { return GetJob(*id).status().state() != v1::RUNNING; },
                           absl::Seconds(10)))
        << testing::ReadFile(coordinator_->log_path());
    const absl::Duration detect = absl::Now() - killed;
    EXPECT_GE(detect, absl::Milliseconds(900));  // the grace (1000 ms) less tick jitter
    EXPECT_LT(detect, absl::Seconds(3));
    bool lost_event = false;
    const v1::Job job = GetJob(*id);
    for (const auto& e : job.status().events()) {
      if (e.type() == v1::CONNECTION_LOST) {
        lost_event = true;
        EXPECT_THAT(e.message(), HasSubstr(host + "/cpu1"));
        EXPECT_THAT(e.message(), HasSubstr("lost its connection"));
      }
    }
    EXPECT_TRUE(lost_event);
    {
      v1::CancelJobRequest cancel;
      cancel.set_job_id(*id);
      v1::JobStatus status;
      grpc::ClientContext ctx;
      ASSERT_TRUE(stub_->CancelJob(&ctx, cancel, &status).ok());
    }
    workers.clear();  // SIGKILLs the survivor
    // An idle process that exits is caught the same way; the next round must not be handed
    // this round's survivor before it is.
    ASSERT_TRUE(Eventually([&] {
      for (const auto& w : Workers()) {
        if (w.state() != v1::WORKER_DEAD) return false;
      }
      return true;
    }, absl::Seconds(5)));
  }
}

// A worker that holds no session (an older or third-party client) is still caught, by the
// heartbeat timeout.
TEST_F(CoordinatorProcessTest, KilledWorkerWithoutASessionIsDeadAtTheHeartbeatTimeout) {
  auto id = Submit(Spec(2, /*heartbeat_timeout_ms=*/2000));
  ASSERT_TRUE(id.ok());
  auto workers = StartSimWorkers(2, {"--no-session"});
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_TRUE(Eventually([&] { return GetJob(*id).status().state() == v1::RUNNING; }));
  workers[1]->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(Eventually([&] { return GetJob(*id).status().state() != v1::RUNNING; },
                         absl::Seconds(10)));
  EXPECT_GE(absl::Now() - killed, absl::Milliseconds(1500));
  const v1::Job job = GetJob(*id);
  bool missed = false;
  for (const auto& e : job.status().events()) {
    if (e.type() == v1::WORKER_LOST) missed = absl::StrContains(e.message(), "missed heartbeats");
  }
  EXPECT_TRUE(missed) << job.status().DebugString();
}

TEST_F(CoordinatorProcessTest, WatchStreamsStateChangesAndStepsUntilTheJobEnds) {
  auto id = Submit(Spec(2));
  ASSERT_TRUE(id.ok());
  std::vector<v1::JobStatus> seen;
  grpc::Status watch_status;
  std::thread watcher([&] {
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(30));
    v1::WatchJobRequest req;
    req.set_job_id(*id);
    auto reader = stub_->WatchJob(&ctx, req);
    v1::JobStatus status;
    while (reader->Read(&status)) seen.push_back(status);
    watch_status = reader->Finish();
  });
  auto workers = StartSimWorkers(2, {"--report-steps=10", "--step-interval-ms=30"});
  ASSERT_EQ(workers.size(), 2u);
  watcher.join();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front().state(), v1::PENDING);
  EXPECT_EQ(seen.back().state(), v1::SUCCEEDED);
  EXPECT_EQ(seen.back().step(), 10);
  bool saw_running_with_steps = false;
  int64_t last_step = 0;
  for (const auto& s : seen) {
    EXPECT_GE(s.step(), last_step) << "updates arrive in order";
    last_step = s.step();
    if (s.state() == v1::RUNNING && s.step() > 0) saw_running_with_steps = true;
  }
  EXPECT_TRUE(saw_running_with_steps);
  EXPECT_NEAR(seen.back().last_metrics().loss(), 0.5, 1e-9);
  EXPECT_TRUE(Eventually([&] {
    for (const auto& w : Workers()) {
      if (w.state() != v1::WORKER_IDLE) return false;
    }
    return true;
  })) << "workers return to idle when the job ends";
}

// ---- hostile input -------------------------------------------------------------------------

TEST_F(CoordinatorProcessTest, InvalidSpecIsRejectedWithEveryViolationAndServingContinues) {
  v1::JobSpec spec = Spec(2);
  spec.mutable_model()->set_num_heads(5);
  spec.mutable_optimizer()->set_learning_rate(-1);
  spec.mutable_resources()->set_max_workers(1);
  spec.set_name("bad name!");
  auto id = Submit(spec);
  ASSERT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(id.status().message());
  EXPECT_THAT(msg, HasSubstr("model.hidden_size: must be divisible by model.num_heads"));
  EXPECT_THAT(msg, HasSubstr("optimizer.learning_rate: must be > 0"));
  EXPECT_THAT(msg, HasSubstr("resources.max_workers"));
  EXPECT_THAT(msg, HasSubstr("name:"));
  EXPECT_THAT(msg, HasSubstr("4 problems"));
  // An empty spec names the required fields.
  auto empty = Submit(v1::JobSpec());
  ASSERT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("data.train_path: required"));
  // Still serving, and nothing was stored.
  v1::ListJobsResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  EXPECT_TRUE(Submit(Spec(2)).ok());
}

TEST_F(CoordinatorProcessTest, RandomBytesAsSubmitPayloadAreRejectedCleanly) {
  grpc::GenericStub generic(channel_);
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int i = 0; i < 200; ++i) {
    std::string payload(1 + rng() % 512, '\0');
    for (auto& c : payload) c = static_cast<char>(rng());
    grpc::Slice slice(payload);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    SetTimeout(&ctx, absl::Seconds(5));
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    grpc::Status status;
    generic.UnaryCall(&ctx, "/weft.v1.Coordinator/SubmitJob", grpc::StubOptions(), &request,
                      &response, [&](grpc::Status s) {
                        std::lock_guard<std::mutex> lock(mu);
                        status = s;
                        done = true;
                        cv.notify_one();
                      });
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    EXPECT_FALSE(status.ok()) << "payload " << i << " was accepted";
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE) << "coordinator died";
    if (!status.ok()) ++rejected;
  }
  EXPECT_EQ(rejected, 200);
  EXPECT_TRUE(coordinator_->process().Running());
  EXPECT_TRUE(Submit(Spec(2)).ok());
}

// ---- durability ----------------------------------------------------------------------------

TEST_F(CoordinatorProcessTest, SigkillAndRestartKeepsEveryJob) {
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = Submit(Spec(2));
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  {
    v1::CancelJobRequest cancel;
    cancel.set_job_id(ids[3]);
    cancel.set_reason("changed my mind");
    v1::JobStatus status;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CancelJob(&ctx, cancel, &status).ok());
  }
  // Job 0 is running (two workers) when the coordinator dies.
  auto a = Register("h", 0);
  auto b = Register("h", 1);
  ASSERT_TRUE(AwaitJoinCommand(a).ok());
  ASSERT_EQ(GetJob(ids[0]).status().state(), v1::RUNNING);

  Restart();

  v1::ListJobsResponse list;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->ListJobs(&ctx, v1::ListJobsRequest(), &list).ok());
  ASSERT_EQ(list.jobs_size(), 4);
  std::map<std::string, v1::JobState> states;
  for (const auto& j : list.jobs()) states[j.job_id()] = j.state();
  // The restarted coordinator marks the running job RECOVERING; with no idle workers its
  // next tick (every 20 ms here) sends it on to PENDING, which a slow test may see already.
  EXPECT_THAT(states[ids[0]], ::testing::AnyOf(v1::RECOVERING, v1::PENDING));
  EXPECT_EQ(states[ids[1]], v1::PENDING);
  EXPECT_EQ(states[ids[2]], v1::PENDING);
  EXPECT_EQ(states[ids[3]], v1::CANCELLED);
  const v1::Job job0 = GetJob(ids[0]);
  EXPECT_EQ(job0.spec().model().hidden_size(), 64);
  EXPECT_EQ(job0.status().restarts(), 0) << "a coordinator restart is not the job's failure";
  // Its events end with the restart, followed at most by the wait for workers.
  const auto& events = job0.status().events();
  int restarted = -1;
  for (int i = 0; i < events.size(); ++i) {
    if (absl::StrContains(events[i].message(), "coordinator restarted")) restarted = i;
  }
  ASSERT_GE(restarted, 0) << "no 'coordinator restarted' event";
  for (int i = restarted + 1; i < events.size(); ++i) {
    EXPECT_THAT(events[i].message(), HasSubstr("waiting for workers"));
  }
  // Ids are never reused.
  auto next = Submit(Spec(2));
  ASSERT_TRUE(next.ok());
  EXPECT_THAT(*next, ::testing::MatchesRegex("tiny-5-[a-z][a-z2-7]{5}"));
  // Workers of the old process must register again.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(a.worker_id());
  hb.set_incarnation(a.incarnation());
  v1::HeartbeatResponse resp;
  grpc::ClientContext hctx;
  EXPECT_EQ(stub_->Heartbeat(&hctx, hb, &resp).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Re-registered workers resume the oldest waiting job as generation 2.
  auto a2 = Register("h", 0);
  auto b2 = Register("h", 1);
  auto cmd = AwaitJoinCommand(a2);
  ASSERT_TRUE(cmd.ok());
  EXPECT_EQ(cmd->job_id(), ids[0]);
  EXPECT_EQ(cmd->generation(), 2);
}

// A second coordinator (its own data directory) on the port another one serves must not
// start: sharing the port (gRPC's default SO_REUSEPORT), clients would alternate between the
// two. The same for its metrics port. The first one serves on.
TEST_F(CoordinatorProcessTest, ASecondCoordinatorOnAServedPortExitsNamingThePort) {
  TempDir other;
  const std::string listen = coordinator_->address();
  testing::CommandResult r = testing::RunCommand(
      {testing::BinDir() + "/weft-coordinator", "--listen=" + listen,
       "--data-dir=" + other.File("db"), "--metrics-address=none"},
      {}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.err;  // not killed at the timeout, still serving
  EXPECT_THAT(r.err, AllOf(HasSubstr("--listen " + listen),
                           HasSubstr(absl::StrCat("port ", coordinator_->port())),
                           HasSubstr("Address already in use")));
  const std::string metrics = coordinator_->metrics_address();
  r = testing::RunCommand({testing::BinDir() + "/weft-coordinator", "--listen=127.0.0.1:0",
                           "--data-dir=" + other.File("db"), "--metrics-address=" + metrics},
                          {}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("--metrics-address " + metrics),
                           HasSubstr("Address already in use")));
  EXPECT_TRUE(Submit(Spec(2)).ok());
}

// A second coordinator on the data directory of a running one fails at once, naming the
// directory and the process that holds it.
TEST_F(CoordinatorProcessTest, ASecondCoordinatorOnTheSameDataDirectoryExitsNamingIt) {
  const testing::CommandResult r = testing::RunCommand(
      {testing::BinDir() + "/weft-coordinator", "--listen=127.0.0.1:0",
       "--data-dir=" + dir_.File("db"), "--metrics-address=none"},
      {}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, AllOf(HasSubstr("--data-dir " + dir_.File("db")),
                           HasSubstr(absl::StrCat("in use by weft-coordinator (pid ",
                                                  coordinator_->process().pid(), ")"))));
  EXPECT_TRUE(Submit(Spec(2)).ok());
}

TEST_F(CoordinatorProcessTest, MetricsEndpointExportsCoordinatorMetrics) {
  auto id = Submit(Spec(2));
  ASSERT_TRUE(id.ok());
  auto a = Register("h", 0);
  auto b = Register("h", 1);
  auto ca = AwaitJoinCommand(a);
  auto cb = AwaitJoinCommand(b);
  ASSERT_TRUE(ca.ok() && cb.ok());
  std::thread t([&] { ASSERT_TRUE(Join(a, *ca).ok()); });
  ASSERT_TRUE(Join(b, *cb).ok());
  t.join();
  std::string body;
  ASSERT_TRUE(Eventually([&] {
    auto got = testing::HttpGet(coordinator_->metrics_address(), "/metrics");
    body = got.ok() ? *got : "";
    return absl::StrContains(body, "weft_coordinator_jobs{state=\"RUNNING\"} 1");
  })) << body;
  EXPECT_THAT(body, HasSubstr("weft_coordinator_workers{state=\"WORKER_BUSY\"} 2"));
  EXPECT_THAT(body, HasSubstr("weft_coordinator_jobs_submitted_total 1"));
  EXPECT_THAT(body, HasSubstr("weft_coordinator_rendezvous_latency_seconds_count 1"));
  EXPECT_THAT(body, HasSubstr("weft_coordinator_heartbeats_total"));
  EXPECT_THAT(body, HasSubstr("weft_coordinator_failures_detected_total{kind=\"heartbeat_timeout\"} 0"));
  EXPECT_THAT(body, HasSubstr("weft_coordinator_failures_detected_total{kind=\"connection_lost\"} 0"));
}

}  // namespace
}  // namespace weft
