#include "tests/testing/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace weft::testing {
namespace {

// In a forked child: adds `env` to the environment and execs argv[0]; exit code 127, with the
// reason on stderr, when the exec fails.
[[noreturn]] void ExecChild(const std::vector<std::string>& argv,
                            const std::map<std::string, std::string>& env) {
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execv(args[0], args.data());
  std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
  ::_exit(127);
}

// The port a server wrote to `port_file` (its text `text`).
absl::StatusOr<int> PortFrom(const std::string& port_file, const std::string& text) {
  int port = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) {
    return absl::InternalError(absl::StrCat(port_file, ": not a port: ", text));
  }
  return port;
}

}  // namespace

std::string BinDir() {
  if (const char* dir = std::getenv("WEFT_BIN_DIR")) return dir;
  return WEFT_BIN_DIR;
}

TempDir::TempDir() {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(base ? base : "/tmp", "/weft-test-XXXXXX");
  if (::mkdtemp(tmpl.data()) == nullptr) std::abort();
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv, const std::string& log_path,
    const std::map<std::string, std::string>& env) {
  if (argv.empty()) return absl::InvalidArgumentError("empty argv");
  const pid_t pid = ::fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    if (!log_path.empty()) {
      const int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    ExecChild(argv, env);
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

void Subprocess::Signal(int signo) {
  if (!reaped_) ::kill(pid_, signo);
}

bool Subprocess::Running() {
  if (reaped_) return false;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return false;
  }
  return true;
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat("pid ", pid_, " still running"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_code_;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
}

CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env, absl::Duration timeout,
                         const std::string& stdin_data) {
  TempDir dir;
  const std::string out_path = dir.File("out"), err_path = dir.File("err"),
                    in_path = dir.File("in");
  WriteFile(in_path, stdin_data);
  CommandResult result;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int in = ::open(in_path.c_str(), O_RDONLY);
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(in, 0);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ExecChild(argv, env);
  }
  const absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  while (true) {
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFile(out_path);
  result.err = ReadFile(err_path);
  return result;
}

absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::string contents = ReadFile(path);
    if (!contents.empty()) return contents;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(path, " did not appear"));
}

absl::StatusOr<std::string> WaitForFileFrom(Subprocess& process, const std::string& path,
                                            absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    // Checked before the file: a process may write it and exit between the two reads.
    const bool running = process.Running();
    std::string contents = ReadFile(path);
    if (!contents.empty()) return contents;
    if (!running) {
      const absl::StatusOr<int> code = process.Wait(absl::ZeroDuration());
      return absl::FailedPreconditionError(
          absl::StrCat("pid ", process.pid(), " exited (code ", code.ok() ? *code : -1,
                       ") before writing ", path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(path, " did not appear"));
}

absl::StatusOr<std::unique_ptr<CoordinatorProcess>> CoordinatorProcess::Start(
    const std::string& data_dir, const std::vector<std::string>& extra_args,
    const std::string& bin_dir, int listen_port) {
  auto cp = std::unique_ptr<CoordinatorProcess>(new CoordinatorProcess());
  static std::atomic<int> counter{0};
  const std::string tag = absl::StrCat(::getpid(), "-", counter++);
  const std::string port_file = absl::StrCat(data_dir, "/.port-", tag);
  const std::string metrics_port_file = absl::StrCat(data_dir, "/.metrics-port-", tag);
  cp->log_path_ = absl::StrCat(data_dir, "/coordinator-", tag, ".log");
  std::filesystem::create_directories(data_dir);
  std::vector<std::string> argv = {bin_dir + "/weft-coordinator",
                                   absl::StrCat("--listen=127.0.0.1:", listen_port),
                                   "--port-file=" + port_file,
                                   "--data-dir=" + data_dir + "/db",
                                   "--metrics-address=127.0.0.1:0",
                                   "--metrics-port-file=" + metrics_port_file};
  argv.insert(argv.end(), extra_args.begin(), extra_args.end());
  auto proc = Subprocess::Start(argv, cp->log_path_);
  if (!proc.ok()) return proc.status();
  cp->process_ = std::move(*proc);
  auto port = WaitForFileFrom(*cp->process_, port_file, absl::Seconds(30));
  if (!port.ok()) {
    return absl::UnavailableError(absl::StrCat("coordinator did not start: ",
                                               port.status().message(), ": ",
                                               ReadFile(cp->log_path_)));
  }
  auto metrics_port = WaitForFile(metrics_port_file, absl::Seconds(10));
  if (!metrics_port.ok()) return metrics_port.status();
  WEFT_ASSIGN_OR_RETURN(cp->port_, PortFrom(port_file, *port));
  cp->address_ = absl::StrCat("127.0.0.1:", cp->port_);
  cp->metrics_address_ = absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*metrics_port));
  std::remove(port_file.c_str());
  std::remove(metrics_port_file.c_str());
  return cp;
}

absl::StatusOr<std::unique_ptr<CheckpointdProcess>> CheckpointdProcess::Start(
    const std::string& dir, const std::string& bin_dir, int port) {
  auto cp = std::unique_ptr<CheckpointdProcess>(new CheckpointdProcess());
  const std::string port_file = dir + "/checkpointd.port";
  // A restart keeps its predecessor's log for the failure message of the test.
  static std::atomic<int> restarts{0};
  cp->log_path_ = port == 0 ? dir + "/checkpointd.log"
                            : absl::StrCat(dir, "/checkpointd-", ++restarts, ".log");
  std::filesystem::create_directories(dir);
  std::remove(port_file.c_str());
  auto proc = Subprocess::Start({bin_dir + "/weft-checkpointd",
                                 absl::StrCat("--listen=127.0.0.1:", port),
                                 "--port-file=" + port_file, "--data-dir=" + dir + "/db",
                                 "--metrics-address=none"},
                                cp->log_path_);
  if (!proc.ok()) return proc.status();
  cp->process_ = std::move(*proc);
  auto bound = WaitForFileFrom(*cp->process_, port_file, absl::Seconds(30));
  if (!bound.ok()) {
    return absl::UnavailableError(absl::StrCat("weft-checkpointd did not start: ",
                                               bound.status().message(), ": ",
                                               ReadFile(cp->log_path_)));
  }
  WEFT_ASSIGN_OR_RETURN(cp->port_, PortFrom(port_file, *bound));
  cp->address_ = absl::StrCat("127.0.0.1:", cp->port_);
  return cp;
}

absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path) {
  std::vector<std::string> parts = absl::StrSplit(host_port, ':');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &port)) {
    return absl::InvalidArgumentError(host_port);
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, parts[0].c_str(), &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("connect ", host_port, ": ", std::strerror(errno)));
  }
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: ", host_port, "\r\n\r\n");
  ::send(fd, req.data(), req.size(), 0);
  std::string resp;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, n);
  ::close(fd);
  const size_t body = resp.find("\r\n\r\n");
  if (body == std::string::npos) return absl::DataLossError("no HTTP body");
  return resp.substr(body + 4);
}

}  // namespace weft::testing
