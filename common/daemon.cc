#include "common/daemon.h"

#include <pthread.h>
#include <signal.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/rpc.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "spdlog/spdlog.h"

namespace weft {
namespace {

sigset_t ShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  return signals;
}

}  // namespace

void BlockShutdownSignals() {
  const sigset_t signals = ShutdownSignals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

int WaitForShutdownSignal() {
  const sigset_t signals = ShutdownSignals();
  int signo = 0;
  sigwait(&signals, &signo);
  return signo;
}

bool IsLoopbackAddress(const std::string& address) {
  return absl::StartsWith(address, "127.") || absl::StartsWith(address, "localhost:") ||
         absl::StartsWith(address, "[::1]:");
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> StartMetrics(
    const std::string& address, const std::string& port_file,
    std::shared_ptr<prometheus::Registry> registry) {
  if (address.empty() || address == "none") return std::unique_ptr<MetricsEndpoint>();
  auto endpoint = MetricsEndpoint::Start(address, std::move(registry));
  if (!endpoint.ok()) return endpoint.status();
  if (!port_file.empty()) {
    absl::Status s = WriteFileAtomically(port_file, absl::StrCat((*endpoint)->port(), "\n"));
    if (!s.ok()) return s;
  }
  return endpoint;
}

absl::StatusOr<std::unique_ptr<ServingDaemon>> ServingDaemon::Start(
    const ServingOptions& options, std::shared_ptr<prometheus::Registry> registry,
    const std::vector<grpc::Service*>& services) {
  if (absl::Status s = CheckHostPort(options.listen, "--listen"); !s.ok()) return s;
  const Security& security = ProcessSecurity();
  if (absl::Status s = CheckPlaintextAllowed(security, options.listen); !s.ok()) return s;
  std::unique_ptr<ServingDaemon> daemon(new ServingDaemon());
  auto metrics = StartMetrics(options.metrics_address, options.metrics_port_file, registry);
  if (!metrics.ok()) return metrics.status();
  daemon->metrics_ = std::move(*metrics);

  grpc::ServerBuilder builder;
  ConfigureServerBuilder(&builder, options.keepalive);
  builder.AddListeningPort(options.listen, security.server_credentials, &daemon->port_);
  for (grpc::Service* service : services) builder.RegisterService(service);
  daemon->server_ = builder.BuildAndStart();
  if (!daemon->server_ || daemon->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen ", options.listen, ": cannot listen (address in use?)"));
  }
  if (!options.port_file.empty()) {
    absl::Status s = WriteFileAtomically(options.port_file, absl::StrCat(daemon->port_, "\n"));
    if (!s.ok()) return s;
  }
  return daemon;
}

std::string ServingDaemon::metrics_port_text() const {
  return metrics_ ? absl::StrCat(metrics_->port()) : std::string("none");
}

void ServingDaemon::Shutdown(absl::Duration grace) {
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
}

}  // namespace weft
