#include "client/worker_session.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace weft {
namespace {

std::string RandomToken() {
  std::random_device random;
  std::string token;
  for (int i = 0; i < 4; ++i) absl::StrAppendFormat(&token, "%08x", random());
  return token;
}

}  // namespace

WorkerSession::WorkerSession(std::shared_ptr<grpc::Channel> channel, WorkerSessionOptions options)
    : stub_(weft::v1::Coordinator::NewStub(std::move(channel))),
      options_(options),
      token_(RandomToken()) {}

WorkerSession::~WorkerSession() { Stop(); }

void WorkerSession::Start() {
  absl::MutexLock lock(&mu_);
  if (stopping_ || thread_.joinable()) return;
  thread_ = std::thread([this] { Loop(); });
}

bool WorkerSession::WaitOpen(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return open_ || stopping_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  return open_;
}

void WorkerSession::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (open_call_ != nullptr) open_call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

int64_t WorkerSession::sessions_opened() const {
  absl::MutexLock lock(&mu_);
  return sessions_opened_;
}

void WorkerSession::Loop() {
  weft::v1::OpenSessionRequest request;
  request.set_session_token(token_);
  absl::Duration backoff = options_.initial_backoff;
  while (true) {
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      open_call_ = &context;
    }
    // No deadline: the session lasts as long as the process.
    auto reader = stub_->OpenSession(&context, request);
    weft::v1::SessionEvent event;
    const bool opened = reader->Read(&event);
    if (opened) {
      absl::MutexLock lock(&mu_);
      open_ = true;
      ++sessions_opened_;
      spdlog::debug("coordinator session {} open", event.session_id());
    }
    while (reader->Read(&event)) {
    }
    const grpc::Status status = reader->Finish();
    {
      absl::MutexLock lock(&mu_);
      open_call_ = nullptr;
      open_ = false;
      if (stopping_) return;
    }
    if (opened) {
      // It was up: reopen at once, so a live process is back well within the grace.
      backoff = options_.initial_backoff;
      spdlog::debug("coordinator session ended ({}); reopening", status.error_message());
      continue;
    }
    spdlog::debug("coordinator session not opened: {}; retrying in {}", status.error_message(),
                  absl::FormatDuration(backoff));
    absl::MutexLock lock(&mu_);
    auto stopping = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stopping), backoff);
    backoff = std::min(backoff * 2, options_.max_backoff);
  }
}

}  // namespace weft
