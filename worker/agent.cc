#include "worker/agent.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"

namespace weft::worker {
namespace {

void SleepUnlessStopped(const std::atomic<bool>& stop, absl::Duration d) {
  const absl::Time until = absl::Now() + d;
  while (!stop.load() && absl::Now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

WorkerAgent::WorkerAgent(AgentOptions options, std::shared_ptr<prometheus::Registry> registry)
    : options_(std::move(options)),
      registry_(std::move(registry)),
      client_(options_.coordinator, {.channel = {.keepalive = options_.keepalive}}),
      session_(client_.channel()),
      metrics_(*registry_, options_.info.worker_id()),
      log_relay_(LogRelay::Attach(*spdlog::default_logger())) {}

absl::StatusOr<bool> WorkerAgent::RegisterWithRetry(const std::atomic<bool>& stop,
                                                    const weft::v1::RunningGeneration* running) {
  // Registered only once the session is open, so that the coordinator sees this process exit
  // at any moment after; a coordinator that does not answer sessions gets the registration
  // anyway, after the wait (detection then falls back to the heartbeat timeout).
  session_.Start();
  if (!session_.WaitOpen(absl::Seconds(2))) {
    spdlog::warn("no session with the coordinator yet; registering without waiting for it");
  }
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stop.load()) {
    auto registered = client_.RegisterWorker(options_.info, session_.token(), running);
    if (registered.ok()) {
      options_.info.set_worker_id(registered->worker_id());
      options_.run.worker_id = registered->worker_id();
      options_.run.incarnation = registered->incarnation();
      interval_ms_ = registered->heartbeat_interval_ms();
      spdlog::info("registered as {} (incarnation {}) with {}", registered->worker_id(),
                   registered->incarnation(), options_.coordinator);
      if (running != nullptr && !registered->reattached()) {
        spdlog::warn("dropping {}", registered->reattach_refusal());
      }
      return registered->reattached();
    }
    if (registered.status().code() == absl::StatusCode::kInvalidArgument) {
      return registered.status();  // our own flags are wrong: retrying cannot help
    }
    spdlog::warn("register: {}; retrying in {}", std::string(registered.status().message()),
                 absl::FormatDuration(backoff));
    SleepUnlessStopped(stop, backoff);
    backoff = std::min(backoff * 2, absl::Seconds(2));
  }
  return false;
}

absl::Status WorkerAgent::RegisterAgain(const std::atomic<bool>& stop) {
  if (!run_ || run_->Finished()) {
    DropRun(absl::AbortedError("the coordinator no longer knows this worker"));
    return RegisterWithRetry(stop).status();
  }
  // The run goes on meanwhile: its collectives need no coordinator, and its store calls and
  // reports wait for it (or are lost, for step metrics).
  weft::v1::RunningGeneration running;
  running.set_job_id(run_->job_id());
  running.set_generation(run_->generation());
  running.set_rank(run_->rank());
  running.set_step(run_->step());
  WEFT_ASSIGN_OR_RETURN(const bool reattached, RegisterWithRetry(stop, &running));
  if (reattached) {
    spdlog::info("attached again to job {} generation {} as rank {} at step {}",
                 running.job_id(), running.generation(), running.rank(), run_->step());
    return absl::OkStatus();
  }
  DropRun(absl::AbortedError("the restarted coordinator did not keep this generation"));
  return absl::OkStatus();
}

void WorkerAgent::DropRun(const absl::Status& reason) {
  log_relay_->ClearRun();
  if (!run_) return;
  run_->Abort(reason);
  runs_.Retire(std::move(run_));
}

absl::Status WorkerAgent::Apply(const weft::v1::Command& command) {
  if (command.has_stop()) {
    DropRun(absl::AbortedError(command.stop().reason()));
    return absl::FailedPreconditionError(command.stop().reason());
  }
  if (command.has_abort_generation()) {
    const auto& abort = command.abort_generation();
    if (run_ && run_->job_id() == abort.job_id() && run_->generation() == abort.generation()) {
      spdlog::info("aborting job {} generation {}: {}", abort.job_id(), abort.generation(),
                   abort.reason());
      DropRun(absl::AbortedError(abort.reason()));
    }
    return absl::OkStatus();
  }
  if (command.has_join_job()) {
    const auto& join = command.join_job();
    DropRun(absl::AbortedError("superseded by a new generation"));
    log_relay_->SetRun(join.job_id(), join.generation(), join.rank());
    spdlog::info("joining job {} generation {} as rank {} of {}", join.job_id(),
                 join.generation(), join.rank(), join.world_size());
    run_ = std::make_unique<GenerationRun>(join, options_.run, &client_, &metrics_);
    runs_.Start(run_.get());
  }
  return absl::OkStatus();
}

absl::Status WorkerAgent::Run(const std::atomic<bool>& stop) {
  if (absl::Status s = RegisterWithRetry(stop).status(); !s.ok()) return s;
  absl::Duration backoff = absl::Milliseconds(100);
  while (!stop.load()) {
    if (run_ && run_->Finished()) {
      log_relay_->ClearRun();
      runs_.Retire(std::move(run_));
    }
    weft::v1::HeartbeatRequest request;
    request.set_worker_id(options_.run.worker_id);
    request.set_incarnation(options_.run.incarnation);
    if (run_) {
      request.set_job_id(run_->job_id());
      request.set_generation(run_->generation());
      request.set_step(run_->step());
    }
    // Held by the coordinator until a command arrives or the interval passes.
    request.set_wait_for_command_ms(interval_ms_);
    log_relay_->FillHeartbeat(&request);
    auto response = client_.Heartbeat(request);
    log_relay_->HeartbeatDone(response.ok());
    if (!response.ok()) {
      if (response.status().code() == absl::StatusCode::kFailedPrecondition) {
        spdlog::warn("{}", std::string(response.status().message()));
        if (absl::Status s = RegisterAgain(stop); !s.ok()) return s;
        continue;
      }
      spdlog::warn("heartbeat: {}; retrying in {}", std::string(response.status().message()),
                   absl::FormatDuration(backoff));
      SleepUnlessStopped(stop, backoff);
      backoff = std::min(backoff * 2, absl::Seconds(2));
      continue;
    }
    backoff = absl::Milliseconds(100);
    if (response->heartbeat_interval_ms() > 0) interval_ms_ = response->heartbeat_interval_ms();
    for (const auto& command : response->commands()) {
      if (absl::Status s = Apply(command); !s.ok()) return s;
    }
  }
  DropRun(absl::AbortedError("worker shutting down"));
  runs_.Drain();
  session_.Stop();
  return absl::OkStatus();
}

}  // namespace weft::worker
