// Real child processes for integration and e2e tests: start, signal, wait, read output.
#ifndef WEFT_TESTS_TESTING_SUBPROCESS_H_
#define WEFT_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace weft::testing {

// Directory of the built binaries (weft-coordinator, trainctl, ...).
std::string BinDir();

// A fresh empty directory under $TEST_TMPDIR or /tmp, removed by the destructor.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with argv; stdout and stderr go to `log_path` (appended) unless it
  // is empty, in which case they are inherited. `env` entries are added to the environment.
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv, const std::string& log_path,
      const std::map<std::string, std::string>& env = {});
  ~Subprocess();  // SIGKILLs and reaps a child still running.

  pid_t pid() const { return pid_; }
  void Signal(int signo);
  // Waits for exit; returns the exit code, or 128+signal, or DEADLINE_EXCEEDED.
  absl::StatusOr<int> Wait(absl::Duration timeout);
  bool Running();

 private:
  explicit Subprocess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
  bool reaped_ = false;
  int exit_code_ = -1;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs a command to completion (killed after `timeout`), capturing stdout and stderr.
CommandResult RunCommand(const std::vector<std::string>& argv,
                         const std::map<std::string, std::string>& env = {},
                         absl::Duration timeout = absl::Seconds(60),
                         const std::string& stdin_data = "");

// Reads a whole file; empty string if it cannot be read.
std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& contents);

// Polls until `path` exists and is non-empty, then returns its contents.
absl::StatusOr<std::string> WaitForFile(const std::string& path, absl::Duration timeout);

// WaitForFile for a file that `process` writes: gives up as soon as the process exits, so a
// binary that is missing or fails at start-up is reported at once, with its exit code, rather
// than at the timeout.
absl::StatusOr<std::string> WaitForFileFrom(Subprocess& process, const std::string& path,
                                            absl::Duration timeout);

// A weft-coordinator process on 127.0.0.1 with a free port, its state in `data_dir`.
class CoordinatorProcess {
 public:
  // `port` 0 picks a free one; a restarted coordinator passes its predecessor's port so that
  // running workers find it again.
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const std::string& data_dir, const std::vector<std::string>& extra_args = {},
      const std::string& bin_dir = BinDir(), int port = 0);

  const std::string& address() const { return address_; }  // "127.0.0.1:PORT"
  int port() const { return port_; }  // what a restart on the same port passes
  const std::string& metrics_address() const { return metrics_address_; }
  Subprocess& process() { return *process_; }
  const std::string& log_path() const { return log_path_; }

 private:
  std::unique_ptr<Subprocess> process_;
  std::string address_;
  int port_ = 0;
  std::string metrics_address_;
  std::string log_path_;
};

// A weft-checkpointd process on 127.0.0.1, its database under `dir`/db and its log at
// `dir`/checkpointd.log (a restart's at checkpointd-N.log). SIGKILLed by the destructor
// (Subprocess's).
class CheckpointdProcess {
 public:
  // `port` 0 picks a free one; a restarted daemon passes its predecessor's port so that
  // clients holding the old address find it again.
  static absl::StatusOr<std::unique_ptr<CheckpointdProcess>> Start(
      const std::string& dir, const std::string& bin_dir = BinDir(), int port = 0);

  const std::string& address() const { return address_; }  // "127.0.0.1:PORT"
  int port() const { return port_; }  // what a restart on the same port passes
  Subprocess& process() { return *process_; }
  std::string log() const { return ReadFile(log_path_); }

 private:
  std::unique_ptr<Subprocess> process_;
  std::string address_;
  int port_ = 0;
  std::string log_path_;
};

// Polls `pred` every 20 ms until it holds or `timeout` passes; returns its last value.
template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

// GET http://host:port/path over a plain socket; the response body, or an error.
absl::StatusOr<std::string> HttpGet(const std::string& host_port, const std::string& path);

}  // namespace weft::testing

#endif  // WEFT_TESTS_TESTING_SUBPROCESS_H_
