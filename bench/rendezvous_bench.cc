// rendezvous_bench: how fast the coordinator turns N idle workers into one running job.
//
// Starts a real weft-coordinator process, submits a job needing N workers, and runs N simulated
// workers as threads, each with its own channel (its own TCP connection). Every worker
// registers, heartbeats (long-poll) until it is gang-assigned, joins the rendezvous, and then
// rank 0 sets a key in the generation's store that every other rank waits for — the shape of
// an NCCL unique-id exchange. The clock runs from the first Register to the last worker
// holding the key.
//
//   BENCH rendezvous workers=N seconds=S registered_s=.. assigned_s=.. joined_s=..
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <barrier>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc.h"
#include "common/status.h"
#include "tests/testing/subprocess.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace {

struct Milestones {
  std::atomic<int64_t> registered_ns{0};  // last Register answered
  std::atomic<int64_t> assigned_ns{0};    // last JoinJob command received
  std::atomic<int64_t> joined_ns{0};      // last Join answered
  std::atomic<int64_t> done_ns{0};        // last worker holding the key
  std::atomic<int> failures{0};
};

void AtLeast(std::atomic<int64_t>& slot, int64_t value) {
  int64_t cur = slot.load();
  while (value > cur && !slot.compare_exchange_weak(cur, value)) {
  }
}

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

absl::Status RunWorker(int index, const std::string& address, const std::string& job_id,
                       const std::function<void()>& wait_for_start, Milestones& m) {
  weft::ChannelOptions options;
  options.private_connection = true;
  auto channel = weft::MakeChannel(address, options);
  auto stub = weft::v1::Coordinator::NewStub(channel);
  auto store = weft::v1::Store::NewStub(channel);
  wait_for_start();

  weft::v1::RegisterWorkerRequest reg;
  reg.mutable_info()->set_host(absl::StrFormat("node%04d", index / 8));
  reg.mutable_info()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
  reg.mutable_info()->set_device_index(index % 8);
  weft::v1::RegisterWorkerResponse registered;
  {
    grpc::ClientContext ctx;
    weft::SetTimeout(&ctx, absl::Seconds(60));
    grpc::Status s = stub->RegisterWorker(&ctx, reg, &registered);
    if (!s.ok()) return weft::FromGrpcStatus(s);
  }
  AtLeast(m.registered_ns, NowNs());

  weft::v1::JoinJobCommand join;
  while (!join.has_spec()) {
    weft::v1::HeartbeatRequest hb;
    hb.set_worker_id(registered.worker_id());
    hb.set_incarnation(registered.incarnation());
    hb.set_wait_for_command_ms(registered.heartbeat_interval_ms());
    weft::v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    weft::SetTimeout(&ctx, absl::Seconds(60));
    grpc::Status s = stub->Heartbeat(&ctx, hb, &resp);
    if (!s.ok()) return weft::FromGrpcStatus(s);
    for (const auto& c : resp.commands()) {
      if (c.has_join_job() && c.join_job().job_id() == job_id) join = c.join_job();
    }
  }
  AtLeast(m.assigned_ns, NowNs());

  weft::v1::JoinRequest jr;
  jr.set_job_id(join.job_id());
  jr.set_generation(join.generation());
  jr.set_worker_id(registered.worker_id());
  jr.set_incarnation(registered.incarnation());
  weft::v1::JoinResponse joined;
  {
    grpc::ClientContext ctx;
    weft::SetTimeout(&ctx, absl::Seconds(120));
    grpc::Status s = stub->Join(&ctx, jr, &joined);
    if (!s.ok()) return weft::FromGrpcStatus(s);
  }
  AtLeast(m.joined_ns, NowNs());

  weft::v1::StoreScope scope;
  scope.set_job_id(join.job_id());
  scope.set_generation(join.generation());
  const std::string key = "nccl/unique_id";
  if (joined.rank() == 0) {
    weft::v1::StoreSetRequest set;
    *set.mutable_scope() = scope;
    set.set_key(key);
    set.set_value(std::string(128, 'x'));  // the size of an ncclUniqueId
    weft::v1::StoreSetResponse r;
    grpc::ClientContext ctx;
    weft::SetTimeout(&ctx, absl::Seconds(60));
    grpc::Status s = store->Set(&ctx, set, &r);
    if (!s.ok()) return weft::FromGrpcStatus(s);
  } else {
    weft::v1::StoreWaitRequest wait;
    *wait.mutable_scope() = scope;
    wait.add_keys(key);
    wait.set_timeout_ms(120000);
    weft::v1::StoreWaitResponse waited;
    grpc::ClientContext wctx;
    weft::SetTimeout(&wctx, absl::Seconds(130));
    grpc::Status s = store->Wait(&wctx, wait, &waited);
    if (!s.ok()) return weft::FromGrpcStatus(s);
    weft::v1::StoreGetRequest get;
    *get.mutable_scope() = scope;
    get.set_key(key);
    weft::v1::StoreGetResponse got;
    grpc::ClientContext gctx;
    weft::SetTimeout(&gctx, absl::Seconds(60));
    s = store->Get(&gctx, get, &got);
    if (!s.ok()) return weft::FromGrpcStatus(s);
    if (got.value().size() != 128) return absl::DataLossError("wrong value size");
  }
  AtLeast(m.done_ns, NowNs());
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  int workers = 256;
  std::string bin_dir = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  CLI::App app{"rendezvous_bench: N simulated workers rendezvous through a real coordinator"};
  app.add_option("--workers", workers, "simulated workers")->check(CLI::Range(1, 16384));
  app.add_option("--bin-dir", bin_dir, "directory holding weft-coordinator");
  CLI11_PARSE(app, argc, argv);
  weft::RaiseOpenFileLimit();

  weft::testing::TempDir dir;
  // Idle heartbeats are long-polls held up to the interval; a generous timeout keeps thousands
  // of threads on two cores from being declared dead while they start.
  auto coordinator = weft::testing::CoordinatorProcess::Start(
      dir.path(), {"--heartbeat-interval-ms=1000", "--heartbeat-timeout-ms=60000",
                   "--log-level=warn"},
      bin_dir);
  if (!coordinator.ok()) {
    std::fprintf(stderr, "rendezvous_bench: %s\n", std::string(coordinator.status().message()).c_str());
    return 1;
  }
  const std::string address = (*coordinator)->address();

  weft::v1::SubmitJobRequest submit;
  auto* spec = submit.mutable_spec();
  spec->set_name("rendezvous-bench");
  spec->mutable_model()->set_num_layers(1);
  spec->mutable_model()->set_hidden_size(8);
  spec->mutable_model()->set_num_heads(1);
  spec->mutable_model()->set_vocab_size(256);
  spec->mutable_model()->set_context_length(8);
  spec->mutable_data()->set_train_path("/dev/null");
  spec->mutable_data()->set_format(weft::v1::DATA_FORMAT_TEXT_BYTES);
  spec->mutable_optimizer()->set_learning_rate(1e-3);
  spec->mutable_training()->set_total_steps(1);
  spec->mutable_training()->set_micro_batch_size(1);
  spec->mutable_resources()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
  spec->mutable_resources()->set_min_workers(workers);
  spec->mutable_fault()->set_heartbeat_timeout_ms(120000);
  spec->mutable_fault()->set_stall_timeout_ms(600000);
  weft::v1::SubmitJobResponse submitted;
  {
    auto stub = weft::v1::Coordinator::NewStub(weft::MakeChannel(address));
    grpc::ClientContext ctx;
    weft::SetTimeout(&ctx, absl::Seconds(30));
    grpc::Status s = stub->SubmitJob(&ctx, submit, &submitted);
    if (!s.ok()) {
      std::fprintf(stderr, "rendezvous_bench: submit: %s\n", s.error_message().c_str());
      return 1;
    }
  }

  Milestones m;
  // Every worker meets here once its channel exists; the clock starts as the barrier opens.
  std::atomic<int64_t> t0{0};
  auto started = [&t0]() noexcept { t0 = NowNs(); };
  std::barrier start(workers, started);
  const std::function<void()> wait_for_start = [&start] { start.arrive_and_wait(); };
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] {
      absl::Status s = RunWorker(i, address, submitted.job_id(), wait_for_start, m);
      if (!s.ok() && m.failures.fetch_add(1) < 5) {
        std::fprintf(stderr, "worker %d: %s\n", i, std::string(s.message()).c_str());
      }
    });
  }
  for (auto& t : threads) t.join();
  (*coordinator)->process().Signal(SIGTERM);
  (void)(*coordinator)->process().Wait(absl::Seconds(10));

  if (m.failures.load() > 0) {
    std::fprintf(stderr, "rendezvous_bench: %d workers failed\n", m.failures.load());
    return 1;
  }
  auto since = [&t0](const std::atomic<int64_t>& ns) { return (ns.load() - t0.load()) / 1e9; };
  std::printf("BENCH rendezvous workers=%d seconds=%.3f registered_s=%.3f assigned_s=%.3f "
              "joined_s=%.3f\n",
              workers, since(m.done_ns), since(m.registered_ns), since(m.assigned_ns),
              since(m.joined_ns));
  return 0;
}
