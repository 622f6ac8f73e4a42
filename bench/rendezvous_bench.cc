// rendezvous_bench: how fast the coordinator turns N idle workers into one running job, and
// what 10K idle workers heartbeating cost it.
//
// Starts a real weft-coordinator process for each measurement and plays every simulated
// worker as a state machine on asynchronous gRPC calls (CompletionQueue API): a few client
// threads (--client-threads, 4, each polling its own queue, plus one for the session streams)
// and a few channels (--channels, 16; each its own TCP connection) carry all of them, so the
// figures measure the coordinator, not the scheduling of thousands of client threads. Each
// worker does what a real one (worker/agent.cc) does, in order: it opens its session stream
// (Coordinator.OpenSession, kept open to the end, as client/worker_session.cc does), registers
// with the session's token, long-polls Heartbeat (wait_for_command_ms = the interval the
// coordinator last gave it) until it receives JoinJob, joins, and then rank 0 sets a key in
// the generation's store that every other rank waits for and reads — the shape of an NCCL
// unique-id exchange. The clock runs from the first call to the last worker holding the key.
// --workers takes a list (8192,16384) and runs each size on a fresh coordinator.
//
//   BENCH rendezvous workers=N seconds=S registered_s=.. assigned_s=.. joined_s=..
//         coordinator_cpu_s=..   (its CPU time from start to the end of the run)
//
// --heartbeat-workers N (e.g. 10000) adds the heartbeat-load phase: N workers register and
// stay idle, long-polling Heartbeat at the interval the coordinator gives them with its
// defaults (it is started without heartbeat flags: 500 ms, stretched past
// --max-idle-heartbeats-per-s, 5000 by default, so 2000 ms at 10K idle workers;
// --coordinator-flag=--max-idle-heartbeats-per-s=0 measures the plain 500 ms). After a
// warm-up, the coordinator process's CPU time (utime+stime from /proc/<pid>/stat) is measured
// over --heartbeat-seconds:
//
//   BENCH rendezvous_heartbeats workers=N interval_ms=.. seconds=.. coordinator_core_pct=..
//        heartbeats_per_s=.. coordinator_us_per_heartbeat=.. client_core_pct=.. declared_dead=..
//
// heartbeats_per_s is what the coordinator answered (N * 1000 / interval_ms when every held
// heartbeat is answered on time and the client keeps up); client_core_pct is this process's
// CPU, to tell a client-bound run from a coordinator-bound one; declared_dead counts workers
// the coordinator declared dead (answers later than the timeout: an overloaded machine).
//
// Limits set for 16K workers: this process raises its open-file soft limit to the hard limit
// (the coordinator inherits it and raises its own); the coordinator runs with
// --log-level=warn (no line per call), and, in the rendezvous runs, an idle heartbeat
// interval of 1 s with a 60 s timeout and a job heartbeat timeout of 120 s, so a client slow
// to start thousands of workers is never mistaken for dead ones. No other flag is needed: the
// coordinator's gRPC server sets no stream, connection or memory cap, and at 16K workers on 16
// channels each connection carries about 2,000 open calls (every worker's session, and its
// held heartbeat or Join).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc.h"
#include "common/status.h"
#include "grpcpp/completion_queue.h"
#include "tests/testing/subprocess.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace {

using weft::v1::Coordinator;
using weft::v1::Store;

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

void AtLeast(std::atomic<int64_t>& slot, int64_t value) {
  int64_t cur = slot.load();
  while (value > cur && !slot.compare_exchange_weak(cur, value)) {
  }
}

// Something waiting on a completion queue; the queue's thread calls Done with the event's ok.
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void Done(bool ok) = 0;
};

// A tag that runs a function and deletes itself (one-shot) or stays (`keep`).
class FnTag final : public Tag {
 public:
  explicit FnTag(std::function<void(bool)> fn, bool keep = false)
      : fn_(std::move(fn)), keep_(keep) {}
  void Done(bool ok) override {
    fn_(ok);
    if (!keep_) delete this;
  }

 private:
  std::function<void(bool)> fn_;
  const bool keep_;
};

// One unary call in flight: its context, request and response live until `then` has run.
template <typename Request, typename Response>
class UnaryCall final : public Tag {
 public:
  using Then = std::function<void(const grpc::Status&, Response&)>;
  using Prepare = std::function<std::unique_ptr<grpc::ClientAsyncResponseReader<Response>>(
      grpc::ClientContext*, const Request&, grpc::CompletionQueue*)>;

  static void Start(const Prepare& prepare, Request request, absl::Duration timeout,
                    grpc::CompletionQueue* cq, Then then) {
    auto* call = new UnaryCall(std::move(request), std::move(then));
    weft::SetTimeout(&call->context_, timeout);
    call->reader_ = prepare(&call->context_, call->request_, cq);
    call->reader_->StartCall();
    call->reader_->Finish(&call->response_, &call->status_, call);
  }
  void Done(bool /*ok*/) override {
    then_(status_, response_);
    delete this;
  }

 private:
  UnaryCall(Request request, Then then) : request_(std::move(request)), then_(std::move(then)) {}

  grpc::ClientContext context_;
  Request request_;
  Response response_;
  grpc::Status status_;
  Then then_;
  std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> reader_;
};

struct Milestones {
  std::atomic<int64_t> registered_ns{0};  // last Register answered
  std::atomic<int64_t> assigned_ns{0};    // last JoinJob command received
  std::atomic<int64_t> joined_ns{0};      // last Join answered
  std::atomic<int64_t> done_ns{0};        // last worker holding the key
  std::atomic<int64_t> heartbeats{0};     // heartbeats answered
  std::atomic<int> registered{0};
  std::atomic<int64_t> interval_ms{0};    // the heartbeat interval last given to a worker
  std::atomic<int> failures{0};
};

// What every simulated worker shares: stubs, queues, the milestones and the end of the run.
struct Fleet {
  std::vector<std::unique_ptr<Coordinator::Stub>> coordinators;  // one per channel
  std::vector<std::unique_ptr<Store::Stub>> stores;
  std::vector<std::unique_ptr<grpc::CompletionQueue>> queues;
  // The session streams' own queue: gRPC's debug builds scan a queue's outstanding operations
  // on every completion, and a session's stays outstanding for the whole run.
  std::unique_ptr<grpc::CompletionQueue> session_queue = std::make_unique<grpc::CompletionQueue>();
  std::string job_id;  // empty: idle workers that heartbeat until `stop`
  bool sessions = true;
  std::atomic<bool> stop{false};
  Milestones m;
  absl::Mutex mu;
  int finished ABSL_GUARDED_BY(mu) = 0;  // workers whose part is over (done or failed)
  int sessions_open ABSL_GUARDED_BY(mu) = 0;
};

// One simulated worker. Its unary calls complete on one queue, so one thread runs all its
// steps after Register (which the session's thread starts).
class SimWorker {
 public:
  SimWorker(int index, Fleet* fleet)
      : index_(index),
        fleet_(fleet),
        coordinator_(fleet->coordinators[index % fleet->coordinators.size()].get()),
        store_(fleet->stores[index % fleet->stores.size()].get()),
        cq_(fleet->queues[index % fleet->queues.size()].get()),
        token_(absl::StrFormat("bench-session-%06d", index)) {}

  void Start() { fleet_->sessions ? OpenSession() : Register(); }
  // Ends the session stream (the run is over).
  void CloseSession() {
    absl::MutexLock lock(&session_mu_);
    if (session_context_) session_context_->TryCancel();
  }

 private:
  void Fail(const std::string& step, const grpc::Status& status) {
    if (fleet_->m.failures.fetch_add(1) < 5) {
      std::fprintf(stderr, "worker %d: %s: %s\n", index_, step.c_str(),
                   status.error_message().c_str());
    }
    Finish();
  }
  void Finish() {
    AtLeast(fleet_->m.done_ns, NowNs());
    absl::MutexLock lock(&fleet_->mu);
    ++fleet_->finished;
  }

  void OpenSession() {
    weft::v1::OpenSessionRequest request;
    request.set_session_token(token_);
    {
      absl::MutexLock lock(&session_mu_);
      session_context_ = std::make_unique<grpc::ClientContext>();
    }
    session_ = coordinator_->PrepareAsyncOpenSession(session_context_.get(), request,
                                                     fleet_->session_queue.get());
    session_read_ = std::make_unique<FnTag>([this](bool ok) { OnSessionEvent(ok); }, true);
    session_->StartCall(new FnTag([this](bool ok) {
      if (ok) return session_->Read(&event_, session_read_.get());
      OnSessionEvent(false);
    }));
  }
  void OnSessionEvent(bool ok) {
    if (ok) {
      if (!session_opened_) {
        session_opened_ = true;
        {
          absl::MutexLock lock(&fleet_->mu);
          ++fleet_->sessions_open;
        }
        Register();
      }
      return session_->Read(&event_, session_read_.get());
    }
    session_->Finish(&session_status_, new FnTag([this](bool) {
      absl::MutexLock lock(&fleet_->mu);
      if (session_opened_) --fleet_->sessions_open;
      if (!session_opened_) {
        ++fleet_->finished;  // never registered
        fleet_->m.failures.fetch_add(1);
        std::fprintf(stderr, "worker %d: session: %s\n", index_,
                     session_status_.error_message().c_str());
      }
    }));
  }

  // Calls `method` of `stub` on this worker's queue; a failure ends the worker, naming `step`.
  template <typename Stub, typename Request, typename Response>
  void Call(Stub* stub,
            std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> (Stub::*method)(
                grpc::ClientContext*, const Request&, grpc::CompletionQueue*),
            Request request, absl::Duration timeout, const char* step,
            std::type_identity_t<std::function<void(Response&)>> then) {
    UnaryCall<Request, Response>::Start(
        [stub, method](grpc::ClientContext* ctx, const Request& req, grpc::CompletionQueue* cq) {
          return (stub->*method)(ctx, req, cq);
        },
        std::move(request), timeout, cq_,
        [this, step, then = std::move(then)](const grpc::Status& s, Response& r) {
          if (!s.ok()) return Fail(step, s);
          then(r);
        });
  }

  void Register() {
    weft::v1::RegisterWorkerRequest request;
    request.mutable_info()->set_host(absl::StrFormat("node%05d", index_ / 8));
    request.mutable_info()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
    request.mutable_info()->set_device_index(index_ % 8);
    if (fleet_->sessions) request.set_session_token(token_);
    Call(coordinator_, &Coordinator::Stub::PrepareAsyncRegisterWorker, std::move(request),
         absl::Seconds(60), "register", [this](weft::v1::RegisterWorkerResponse& r) {
           registered_ = r;
           interval_ms_ = r.heartbeat_interval_ms();
           fleet_->m.registered.fetch_add(1);
           fleet_->m.interval_ms = interval_ms_;
           AtLeast(fleet_->m.registered_ns, NowNs());
           Heartbeat();
         });
  }

  void Heartbeat() {
    if (fleet_->stop.load()) return Finish();
    weft::v1::HeartbeatRequest request;
    request.set_worker_id(registered_.worker_id());
    request.set_incarnation(registered_.incarnation());
    request.set_wait_for_command_ms(interval_ms_);
    Call(coordinator_, &Coordinator::Stub::PrepareAsyncHeartbeat, std::move(request),
         absl::Seconds(60), "heartbeat", [this](weft::v1::HeartbeatResponse& r) {
           fleet_->m.heartbeats.fetch_add(1, std::memory_order_relaxed);
           // As worker/agent.cc: the coordinator may change the interval (many idle workers).
           if (r.heartbeat_interval_ms() > 0) {
             interval_ms_ = r.heartbeat_interval_ms();
             fleet_->m.interval_ms = interval_ms_;
           }
           for (const auto& c : r.commands()) {
             if (c.has_join_job() && c.join_job().job_id() == fleet_->job_id) {
               AtLeast(fleet_->m.assigned_ns, NowNs());
               return Join(c.join_job());
             }
           }
           Heartbeat();
         });
  }

  void Join(const weft::v1::JoinJobCommand& join) {
    scope_.set_job_id(join.job_id());
    scope_.set_generation(join.generation());
    weft::v1::JoinRequest request;
    request.set_job_id(join.job_id());
    request.set_generation(join.generation());
    request.set_worker_id(registered_.worker_id());
    request.set_incarnation(registered_.incarnation());
    Call(coordinator_, &Coordinator::Stub::PrepareAsyncJoin, std::move(request),
         absl::Seconds(120), "join", [this](weft::v1::JoinResponse& r) {
           AtLeast(fleet_->m.joined_ns, NowNs());
           r.rank() == 0 ? SetKey() : WaitKey();
         });
  }

  void SetKey() {
    weft::v1::StoreSetRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(kKey);
    request.set_value(std::string(128, 'x'));  // the size of an ncclUniqueId
    Call(store_, &Store::Stub::PrepareAsyncSet, std::move(request), absl::Seconds(60),
         "store set", [this](weft::v1::StoreSetResponse&) { Finish(); });
  }

  void WaitKey() {
    weft::v1::StoreWaitRequest request;
    *request.mutable_scope() = scope_;
    request.add_keys(kKey);
    request.set_timeout_ms(120000);
    Call(store_, &Store::Stub::PrepareAsyncWait, std::move(request), absl::Seconds(130),
         "store wait", [this](weft::v1::StoreWaitResponse&) { GetKey(); });
  }

  void GetKey() {
    weft::v1::StoreGetRequest request;
    *request.mutable_scope() = scope_;
    request.set_key(kKey);
    Call(store_, &Store::Stub::PrepareAsyncGet, std::move(request), absl::Seconds(60),
         "store get", [this](weft::v1::StoreGetResponse& r) {
           if (r.value().size() != 128) {
             return Fail("store get", grpc::Status(grpc::StatusCode::DATA_LOSS, "wrong size"));
           }
           Finish();
         });
  }

  static constexpr char kKey[] = "nccl/unique_id";

  const int index_;
  Fleet* const fleet_;
  Coordinator::Stub* const coordinator_;
  Store::Stub* const store_;
  grpc::CompletionQueue* const cq_;
  const std::string token_;
  weft::v1::RegisterWorkerResponse registered_;
  int64_t interval_ms_ = 0;  // wait_for_command_ms of the next heartbeat
  weft::v1::StoreScope scope_;
  // The session stream; its context is cancelled from the main thread at the end.
  absl::Mutex session_mu_;
  std::unique_ptr<grpc::ClientContext> session_context_ ABSL_GUARDED_BY(session_mu_);
  std::unique_ptr<grpc::ClientAsyncReader<weft::v1::SessionEvent>> session_;
  std::unique_ptr<FnTag> session_read_;
  weft::v1::SessionEvent event_;
  grpc::Status session_status_;
  bool session_opened_ = false;
};

// Channels, stubs and queue threads for one run.
class Client {
 public:
  Client(const std::string& address, int channels, int threads, Fleet* fleet) : fleet_(fleet) {
    for (int i = 0; i < channels; ++i) {
      weft::ChannelOptions options;
      options.private_connection = true;  // its own TCP connection
      auto channel = weft::MakeChannel(address, options);
      channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10));
      fleet->coordinators.push_back(Coordinator::NewStub(channel));
      fleet->stores.push_back(Store::NewStub(channel));
    }
    for (int i = 0; i < threads; ++i) {
      fleet->queues.push_back(std::make_unique<grpc::CompletionQueue>());
    }
    std::vector<grpc::CompletionQueue*> all;
    for (auto& q : fleet->queues) all.push_back(q.get());
    all.push_back(fleet->session_queue.get());
    for (grpc::CompletionQueue* q : all) {
      threads_.emplace_back([cq = q] {
        void* tag = nullptr;
        bool ok = false;
        while (cq->Next(&tag, &ok)) static_cast<Tag*>(tag)->Done(ok);
      });
    }
  }
  // Ends the sessions, waits for their streams to finish, drains and joins the queues.
  ~Client() {
    for (auto& w : workers_) w->CloseSession();
    {
      absl::MutexLock lock(&fleet_->mu);
      auto closed = [this]() ABSL_SHARED_LOCKS_REQUIRED(fleet_->mu) {
        return fleet_->sessions_open == 0;
      };
      fleet_->mu.AwaitWithTimeout(absl::Condition(&closed), absl::Seconds(30));
    }
    for (auto& q : fleet_->queues) q->Shutdown();
    fleet_->session_queue->Shutdown();
    for (auto& t : threads_) t.join();
  }

  void StartWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      workers_.push_back(std::make_unique<SimWorker>(i, fleet_));
      workers_.back()->Start();
    }
  }
  // Waits until `n` workers have finished their part (at most `timeout`).
  bool AwaitFinished(int n, absl::Duration timeout) {
    absl::MutexLock lock(&fleet_->mu);
    auto done = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(fleet_->mu) {
      return fleet_->finished >= n;
    };
    return fleet_->mu.AwaitWithTimeout(absl::Condition(&done), timeout);
  }

 private:
  Fleet* fleet_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
};

struct Options {
  std::string bin_dir;
  int channels = 16;
  int client_threads = 4;
  bool sessions = true;
  std::vector<std::string> coordinator_flags;  // added to every coordinator's command line
};

absl::StatusOr<std::string> Submit(const std::string& address, int workers) {
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
  auto stub = Coordinator::NewStub(weft::MakeChannel(address));
  grpc::ClientContext ctx;
  weft::SetTimeout(&ctx, absl::Seconds(30));
  grpc::Status s = stub->SubmitJob(&ctx, submit, &submitted);
  if (!s.ok()) return weft::FromGrpcStatus(s);
  return submitted.job_id();
}

absl::StatusOr<std::unique_ptr<weft::testing::CoordinatorProcess>> StartCoordinator(
    const std::string& dir, const std::vector<std::string>& flags, const Options& options) {
  std::vector<std::string> args = {"--log-level=warn"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), options.coordinator_flags.begin(), options.coordinator_flags.end());
  return weft::testing::CoordinatorProcess::Start(dir, args, options.bin_dir);
}

// utime + stime of process `pid`, in seconds.
absl::StatusOr<double> CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which may hold spaces) start at field 3, "state".
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return absl::NotFoundError("no /proc/<pid>/stat");
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  if (fields.size() < 13) return absl::DataLossError("short /proc/<pid>/stat");
  const double ticks = std::stod(fields[11]) + std::stod(fields[12]);  // fields 14 and 15
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// One rendezvous of `workers` workers on a fresh coordinator; prints its BENCH line.
absl::Status RunRendezvous(int workers, const Options& options) {
  weft::testing::TempDir dir;
  WEFT_ASSIGN_OR_RETURN(auto coordinator,
                        StartCoordinator(dir.path(),
                                         {"--heartbeat-interval-ms=1000",
                                          "--heartbeat-timeout-ms=60000"},
                                         options));
  Fleet fleet;
  fleet.sessions = options.sessions;
  WEFT_ASSIGN_OR_RETURN(fleet.job_id, Submit(coordinator->address(), workers));
  int64_t t0 = 0;
  bool all = false;
  {
    Client client(coordinator->address(), options.channels, options.client_threads, &fleet);
    t0 = NowNs();
    client.StartWorkers(workers);
    all = client.AwaitFinished(workers, absl::Seconds(300));
  }
  // Its CPU time shows its share when other processes load the machine.
  WEFT_ASSIGN_OR_RETURN(const double cpu, CpuSeconds(coordinator->process().pid()));
  coordinator->process().Signal(SIGTERM);
  (void)coordinator->process().Wait(absl::Seconds(10));
  if (!all) return absl::DeadlineExceededError("workers did not all finish within 300 s");
  if (int f = fleet.m.failures.load(); f > 0) {
    return absl::InternalError(absl::StrCat(f, " workers failed"));
  }
  auto since = [t0](const std::atomic<int64_t>& ns) { return (ns.load() - t0) / 1e9; };
  std::printf("BENCH rendezvous workers=%d seconds=%.3f registered_s=%.3f assigned_s=%.3f "
              "joined_s=%.3f coordinator_cpu_s=%.2f\n",
              workers, since(fleet.m.done_ns), since(fleet.m.registered_ns),
              since(fleet.m.assigned_ns), since(fleet.m.joined_ns), cpu);
  std::fflush(stdout);
  return absl::OkStatus();
}

// Workers the coordinator declared dead so far (DEAD now, or revived since): a heartbeat
// answered later than the timeout, which a loaded machine can cause.
absl::StatusOr<int> DeclaredDead(const std::string& address) {
  auto stub = Coordinator::NewStub(weft::MakeChannel(address));
  grpc::ClientContext ctx;
  weft::SetTimeout(&ctx, absl::Seconds(30));
  weft::v1::ListWorkersResponse listed;
  grpc::Status s = stub->ListWorkers(&ctx, weft::v1::ListWorkersRequest(), &listed);
  if (!s.ok()) return weft::FromGrpcStatus(s);
  int dead = 0;
  for (const auto& w : listed.workers()) {
    if (w.state() == weft::v1::WORKER_DEAD || absl::StrContains(w.reason(), "declared dead")) {
      ++dead;
    }
  }
  return dead;
}

// `workers` idle workers heartbeating at the coordinator's default interval; prints the
// coordinator's CPU use over `seconds`.
absl::Status RunHeartbeats(int workers, double seconds, const Options& options) {
  weft::testing::TempDir dir;
  WEFT_ASSIGN_OR_RETURN(auto coordinator, StartCoordinator(dir.path(), {}, options));
  Fleet fleet;
  fleet.sessions = options.sessions;
  std::string line;
  {
    Client client(coordinator->address(), options.channels, options.client_threads, &fleet);
    client.StartWorkers(workers);
    const absl::Time give_up = absl::Now() + absl::Seconds(120);
    while (fleet.m.registered.load() < workers && fleet.m.failures.load() == 0 &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    // Warm-up: every worker in its heartbeat loop, at the interval it was last given.
    absl::SleepFor(std::max(absl::Seconds(3), absl::Milliseconds(3 * fleet.m.interval_ms)));
    const pid_t pid = coordinator->process().pid();
    WEFT_ASSIGN_OR_RETURN(double cpu0, CpuSeconds(pid));
    WEFT_ASSIGN_OR_RETURN(double client0, CpuSeconds(getpid()));
    const int64_t beats0 = fleet.m.heartbeats.load();
    const absl::Time start = absl::Now();
    absl::SleepFor(absl::Seconds(seconds));
    WEFT_ASSIGN_OR_RETURN(double cpu1, CpuSeconds(pid));
    WEFT_ASSIGN_OR_RETURN(double client1, CpuSeconds(getpid()));
    const double wall = absl::ToDoubleSeconds(absl::Now() - start);
    const int64_t beats = fleet.m.heartbeats.load() - beats0;
    WEFT_ASSIGN_OR_RETURN(const int dead, DeclaredDead(coordinator->address()));
    line = absl::StrFormat(
        "BENCH rendezvous_heartbeats workers=%d interval_ms=%d seconds=%.1f "
        "coordinator_core_pct=%.1f heartbeats_per_s=%.0f coordinator_us_per_heartbeat=%.1f "
        "client_core_pct=%.1f declared_dead=%d\n",
        workers, fleet.m.interval_ms.load(), wall, 100 * (cpu1 - cpu0) / wall, beats / wall,
        1e6 * (cpu1 - cpu0) / std::max<int64_t>(beats, 1), 100 * (client1 - client0) / wall,
        dead);
    fleet.stop = true;
    client.AwaitFinished(workers, absl::Seconds(30));
  }
  coordinator->process().Signal(SIGTERM);
  (void)coordinator->process().Wait(absl::Seconds(10));
  if (fleet.m.registered.load() < workers) {
    return absl::DeadlineExceededError(
        absl::StrCat(fleet.m.registered.load(), " of ", workers, " workers registered"));
  }
  if (int f = fleet.m.failures.load(); f > 0) {
    return absl::InternalError(absl::StrCat(f, " workers failed"));
  }
  std::fputs(line.c_str(), stdout);
  std::fflush(stdout);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> workers = {256};
  int heartbeat_workers = 0;
  double heartbeat_seconds = 20;
  Options options;
  options.bin_dir = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  CLI::App app{"rendezvous_bench: simulated workers rendezvous through a real coordinator"};
  app.add_option("--workers", workers, "simulated workers; repeat or list (8192,16384)")
      ->delimiter(',')
      ->check(CLI::Range(0, 65536))
      ->capture_default_str();
  app.add_option("--heartbeat-workers", heartbeat_workers,
                 "idle workers of the heartbeat-load phase (0: skip it)")
      ->check(CLI::Range(0, 65536));
  app.add_option("--heartbeat-seconds", heartbeat_seconds, "length of the measured window")
      ->check(CLI::Range(1.0, 600.0))
      ->capture_default_str();
  app.add_option("--channels", options.channels, "client channels (TCP connections)")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--client-threads", options.client_threads, "completion-queue threads")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_flag("!--no-sessions", options.sessions,
               "register without a session stream (as a worker of an older coordinator)");
  app.add_option("--bin-dir", options.bin_dir, "directory holding weft-coordinator");
  app.add_option("--coordinator-flag", options.coordinator_flags,
                 "a flag for every coordinator started (repeatable), e.g. "
                 "--coordinator-flag=--max-idle-heartbeats-per-s=0");
  CLI11_PARSE(app, argc, argv);
  weft::RaiseOpenFileLimit();

  for (int n : workers) {
    if (n == 0) continue;
    if (absl::Status s = RunRendezvous(n, options); !s.ok()) {
      std::fprintf(stderr, "rendezvous_bench: workers=%d: %s\n", n, s.ToString().c_str());
      return 1;
    }
  }
  if (heartbeat_workers > 0) {
    if (absl::Status s = RunHeartbeats(heartbeat_workers, heartbeat_seconds, options); !s.ok()) {
      std::fprintf(stderr, "rendezvous_bench: heartbeats: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
