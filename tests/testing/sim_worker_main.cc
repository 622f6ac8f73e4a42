// weft-sim-worker: a worker process without a training engine, for tests of the control plane.
// It registers, heartbeats (long-polling for commands), joins every generation it is assigned,
// reports progress as rank 0 when asked to, drops generations it is told to abort, registers
// again when the coordinator no longer knows it, and exits when told to stop. Tests stop, kill
// or let it run to exercise failure detection with a real process.
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "client/worker_session.h"
#include "common/rpc.h"
#include "common/status.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace {

struct Flags {
  std::string coordinator;
  std::string host = "sim-host";
  int device_index = 0;
  std::string worker_id;
  // Rank 0 reports this many steps (one per step_interval_ms) and then finished; 0: never.
  int report_steps = 0;
  int step_interval_ms = 50;
  // Hold a session (Coordinator.OpenSession), as weft-worker does.
  bool session = true;
};

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"weft-sim-worker: control-plane-only worker for tests"};
  app.add_option("--coordinator", flags.coordinator, "coordinator host:port")->required();
  app.add_option("--host", flags.host, "host name to register");
  app.add_option("--device-index", flags.device_index, "device index to register");
  app.add_option("--worker-id", flags.worker_id, "worker id (default host/cpuN)");
  app.add_option("--report-steps", flags.report_steps, "steps rank 0 reports before finishing");
  app.add_option("--step-interval-ms", flags.step_interval_ms, "time per reported step");
  app.add_flag("--session,!--no-session", flags.session,
               "hold a session so the coordinator sees this process exit (default on)");
  CLI11_PARSE(app, argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);

  auto channel = weft::MakeChannel(flags.coordinator);
  auto stub = weft::v1::Coordinator::NewStub(channel);

  weft::v1::RegisterWorkerRequest reg;
  reg.mutable_info()->set_worker_id(flags.worker_id);
  reg.mutable_info()->set_host(flags.host);
  reg.mutable_info()->set_device_kind(weft::v1::DEVICE_KIND_CPU);
  reg.mutable_info()->set_device_index(flags.device_index);
  reg.mutable_info()->set_pid(::getpid());
  weft::v1::RegisterWorkerResponse registered;
  weft::WorkerSession session(channel);
  if (flags.session) {
    session.Start();
    session.WaitOpen(absl::Seconds(5));
    reg.set_session_token(session.token());
  }
  auto register_worker = [&] {
    while (true) {
      grpc::ClientContext ctx;
      weft::SetTimeout(&ctx, absl::Seconds(5));
      grpc::Status s = stub->RegisterWorker(&ctx, reg, &registered);
      if (s.ok()) break;
      std::fprintf(stderr, "register: %s\n", s.error_message().c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::printf("registered %s incarnation %ld\n", registered.worker_id().c_str(),
                static_cast<long>(registered.incarnation()));
  };
  register_worker();

  std::mutex mu;
  std::string job_id;
  int64_t generation = 0;
  std::atomic<int64_t> step{0};
  int64_t interval_ms = registered.heartbeat_interval_ms();

  while (true) {
    weft::v1::HeartbeatRequest hb;
    hb.set_worker_id(registered.worker_id());
    hb.set_incarnation(registered.incarnation());
    {
      std::lock_guard<std::mutex> lock(mu);
      hb.set_job_id(job_id);
      hb.set_generation(generation);
    }
    hb.set_step(step.load());
    hb.set_wait_for_command_ms(interval_ms);
    weft::v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    weft::SetTimeout(&ctx, absl::Milliseconds(interval_ms) + absl::Seconds(5));
    grpc::Status s = stub->Heartbeat(&ctx, hb, &resp);
    if (!s.ok()) {
      std::fprintf(stderr, "heartbeat: %s\n", s.error_message().c_str());
      if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        {
          std::lock_guard<std::mutex> lock(mu);
          job_id.clear();
          generation = 0;
        }
        register_worker();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    interval_ms = resp.heartbeat_interval_ms();
    for (const auto& command : resp.commands()) {
      if (command.has_stop()) {
        std::printf("stop: %s\n", command.stop().reason().c_str());
        std::fflush(stdout);
        std::_Exit(0);
      }
      if (command.has_abort_generation()) {
        std::printf("abort %s gen %ld: %s\n", command.abort_generation().job_id().c_str(),
                    static_cast<long>(command.abort_generation().generation()),
                    command.abort_generation().reason().c_str());
        std::lock_guard<std::mutex> lock(mu);
        if (command.abort_generation().job_id() == job_id &&
            command.abort_generation().generation() == generation) {
          job_id.clear();
          generation = 0;
        }
      } else if (command.has_join_job()) {
        const auto join = command.join_job();
        std::printf("join %s gen %ld rank %d/%d\n", join.job_id().c_str(),
                    static_cast<long>(join.generation()), join.rank(), join.world_size());
        {
          std::lock_guard<std::mutex> lock(mu);
          job_id = join.job_id();
          generation = join.generation();
        }
        std::thread([&, join, worker_id = registered.worker_id(),
                     incarnation = registered.incarnation()] {
          weft::v1::JoinRequest req;
          req.set_job_id(join.job_id());
          req.set_generation(join.generation());
          req.set_worker_id(worker_id);
          req.set_incarnation(incarnation);
          weft::v1::JoinResponse joined;
          grpc::ClientContext jctx;
          weft::SetTimeout(&jctx, absl::Seconds(60));
          grpc::Status js = stub->Join(&jctx, req, &joined);
          std::printf("joined %s gen %ld: %s rank %d\n", join.job_id().c_str(),
                      static_cast<long>(join.generation()),
                      js.ok() ? "ok" : js.error_message().c_str(), joined.rank());
          if (!js.ok() || joined.rank() != 0 || flags.report_steps <= 0) return;
          for (int i = 1; i <= flags.report_steps; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(flags.step_interval_ms));
            weft::v1::ReportProgressRequest rp;
            rp.set_job_id(join.job_id());
            rp.set_generation(join.generation());
            rp.set_worker_id(worker_id);
            rp.set_rank(0);
            rp.mutable_metrics()->set_step(i);
            rp.mutable_metrics()->set_loss(5.0 / i);
            rp.set_finished(i == flags.report_steps);
            step = i;
            weft::v1::ReportProgressResponse rr;
            grpc::ClientContext rctx;
            weft::SetTimeout(&rctx, absl::Seconds(5));
            if (!stub->ReportProgress(&rctx, rp, &rr).ok() || !rr.continue_training()) return;
          }
        }).detach();
      }
    }
  }
}
