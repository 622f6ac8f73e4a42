#include "common/daemon.h"

#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/ascii.h"
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

std::string DefaultDataDirFor(const std::string& name, bool root, const char* xdg_state_home,
                              const char* home) {
  if (root) return absl::StrCat("/var/lib/weft/", name);
  // The XDG spec has a relative $XDG_STATE_HOME ignored; so is a relative $HOME.
  if (xdg_state_home != nullptr && xdg_state_home[0] == '/') {
    return absl::StrCat(xdg_state_home, "/weft/", name);
  }
  const std::string home_dir = home != nullptr && home[0] == '/' ? home : "/tmp";
  return absl::StrCat(home_dir, "/.local/state/weft/", name);
}

std::string DefaultDataDir(const std::string& name) {
  const char* home = std::getenv("HOME");
  if (home == nullptr || home[0] != '/') {
    const passwd* pw = ::getpwuid(::geteuid());
    home = pw != nullptr ? pw->pw_dir : nullptr;
  }
  return DefaultDataDirFor(name, ::geteuid() == 0, std::getenv("XDG_STATE_HOME"), home);
}

absl::StatusOr<std::unique_ptr<DataDirLock>> DataDirLock::Acquire(const std::string& dir,
                                                                  const std::string& program) {
  if (dir.empty()) return absl::InvalidArgumentError("--data-dir: required");
  std::error_code ec;
  const std::string abs = std::filesystem::absolute(dir, ec).lexically_normal().string();
  if (ec) {
    return absl::InvalidArgumentError(absl::StrCat("--data-dir ", dir, ": ", ec.message()));
  }
  // lexically_normal keeps a trailing separator ("/a/b/"): drop it, the path is logged.
  const std::string path = abs.size() > 1 && abs.back() == '/' ? abs.substr(0, abs.size() - 1)
                                                              : abs;
  std::filesystem::create_directories(path, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", path, ": cannot create: ", ec.message()));
  }
  const std::string lock_path = absl::StrCat(path, "/", kFileName);
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", path, ": cannot open ", lock_path, ": ", std::strerror(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder(256, '\0');
    const ssize_t n = ::pread(fd, holder.data(), holder.size(), 0);
    holder.resize(n > 0 ? static_cast<size_t>(n) : 0);
    ::close(fd);
    if (err != EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat("--data-dir ", path, ": cannot lock ", lock_path, ": ", std::strerror(err)));
    }
    // "<pid> <program>", written by the holder once it had the lock (empty just before).
    absl::StripAsciiWhitespace(&holder);
    const size_t space = holder.find(' ');
    const std::string who =
        space == std::string::npos
            ? "another process"
            : absl::StrCat(holder.substr(space + 1), " (pid ", holder.substr(0, space), ")");
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", path, ": in use by ", who,
                     "; two daemons must not share a data directory"));
  }
  const std::string holder = absl::StrCat(::getpid(), " ", program, "\n");
  // For the message of the next one only: the lock is the flock, not the contents.
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
    spdlog::warn("{}: cannot record this process in it: {}", lock_path, std::strerror(errno));
  }
  return std::unique_ptr<DataDirLock>(new DataDirLock(path, fd));
}

DataDirLock::~DataDirLock() { ::close(fd_); }

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
    // gRPC does not say why; a bind of our own does (most often: another process serves it).
    const std::string why = WhyCannotBind(options.listen);
    return absl::UnavailableError(
        absl::StrCat("--listen ", options.listen, ": cannot listen on port ",
                     options.listen.substr(options.listen.rfind(':') + 1), ": ",
                     why.empty() ? "the gRPC server did not start" : why));
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
