// The coordinator and checkpointd as a production cluster runs them, for tests whose workers
// are not on the daemons' loopback (network namespaces): listening beyond 127.0.0.1, where they
// serve only TLS, with mutual TLS everywhere (each process presents a certificate from the
// cluster CA) and a bearer token on every call to either.
#ifndef WEFT_TESTS_WORKER_TLS_CLUSTER_H_
#define WEFT_TESTS_WORKER_TLS_CLUSTER_H_

#include <signal.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/security.h"
#include "gtest/gtest.h"
#include "tests/testing/pki.h"
#include "tests/testing/subprocess.h"

namespace weft::testing {

class TlsDaemons {
 public:
  // The bearer token both daemons accept (--auth-tokens-file) and the workers send.
  static constexpr char kToken[] = "tls-cluster-token-8d41c07e";

  // Logs and state go under `dir`.
  explicit TlsDaemons(std::string dir) : dir_(std::move(dir)) {}
  ~TlsDaemons() { Kill(); }

  // Starts both daemons listening on `listen_ip` (one address, or 0.0.0.0 for every
  // interface); clients dial them at any of `dial_ips`, which their certificate names.
  // `coordinator_flags` follow the common ones. Use with ASSERT_NO_FATAL_FAILURE.
  void Start(const std::string& listen_ip, const std::vector<std::string>& dial_ips,
             const std::vector<std::string>& coordinator_flags = {}) {
    pki_ = std::make_unique<Pki>(dial_ips);
    ASSERT_TRUE(pki_->status().ok()) << pki_->status();
    WriteFile(File("tokens"), absl::StrCat(kToken, "\n"));
    std::vector<std::string> coordinator = {
        BinDir() + "/weft-coordinator", absl::StrCat("--listen=", listen_ip, ":0"),
        "--data-dir=" + File("coordinator-db"), "--metrics-address=none",
        "--tick-interval-ms=50", "--auth-tokens-file=" + File("tokens")};
    for (const auto& flag : pki_->Flags("server")) coordinator.push_back(flag);
    coordinator.insert(coordinator.end(), coordinator_flags.begin(), coordinator_flags.end());
    coordinator_port_ = StartDaemon("coordinator", coordinator, &coordinator_);
    ASSERT_FALSE(coordinator_port_.empty());
    std::vector<std::string> checkpointd = {
        BinDir() + "/weft-checkpointd", absl::StrCat("--listen=", listen_ip, ":0"),
        "--data-dir=" + File("ckpt"), "--metrics-address=none",
        "--auth-tokens-file=" + File("tokens")};
    for (const auto& flag : pki_->Flags("server")) checkpointd.push_back(flag);
    checkpointd_port_ = StartDaemon("checkpointd", checkpointd, &checkpointd_);
    ASSERT_FALSE(checkpointd_port_.empty());
    auto security = LoadSecurity(
        {.cert_file = pki_->Pem("client-a"), .key_file = pki_->Key("client-a"),
         .ca_file = pki_->Pem("ca-a")},
        kToken);
    ASSERT_TRUE(security.ok()) << security.status();
    client_security_ = *security;
    ClientOptions options;
    options.channel.security = &client_security_;
    client_ = std::make_unique<CoordinatorClient>(Coordinator(dial_ips.front()), options);
  }

  std::string Coordinator(const std::string& ip) const {
    return absl::StrCat(ip, ":", coordinator_port_);
  }
  std::string Checkpointd(const std::string& ip) const {
    return absl::StrCat(ip, ":", checkpointd_port_);
  }

  // The flags of a worker that dials the daemons at `ip`: their addresses and its client
  // certificate. Its environment needs Env() (the token).
  std::vector<std::string> WorkerFlags(const std::string& ip) const {
    std::vector<std::string> flags = {"--coordinator=" + Coordinator(ip),
                                      "--checkpointd=" + Checkpointd(ip)};
    for (const auto& flag : pki_->Flags("client-a")) flags.push_back(flag);
    return flags;
  }
  static std::map<std::string, std::string> Env() { return {{"WEFT_TOKEN", kToken}}; }

  CoordinatorClient& client() { return *client_; }

  v1::JobStatus Status(const std::string& id) {
    auto job = client_->GetJob(id);
    return job.ok() ? job->status() : v1::JobStatus();
  }

  // Both daemons' logs.
  std::string Logs() const {
    std::string all;
    for (const char* name : {"coordinator", "checkpointd"}) {
      absl::StrAppend(&all, "\n--- ", name, "\n", ReadFile(File(absl::StrCat(name, ".log"))));
    }
    return all;
  }

  // SIGKILLs both daemons and waits for them.
  void Kill() {
    for (auto* p : {&checkpointd_, &coordinator_}) {
      if (*p == nullptr) continue;
      (*p)->Signal(SIGKILL);
      (void)(*p)->Wait(absl::Seconds(10));
      p->reset();
    }
  }

 private:
  std::string File(const std::string& name) const { return dir_ + "/" + name; }

  // Starts a process logging to <name>.log and waits for it to write its bound port.
  std::string StartDaemon(const std::string& name, std::vector<std::string> argv,
                          std::unique_ptr<Subprocess>* process) {
    const std::string port_file = File(name + ".port");
    argv.push_back("--port-file=" + port_file);
    auto p = Subprocess::Start(argv, File(name + ".log"));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return "";
    *process = std::move(*p);
    auto port = WaitForFile(port_file, absl::Seconds(30));
    EXPECT_TRUE(port.ok()) << ReadFile(File(name + ".log"));
    if (!port.ok()) return "";
    return std::string(absl::StripAsciiWhitespace(*port));
  }

  std::string dir_;
  std::unique_ptr<Pki> pki_;
  std::unique_ptr<Subprocess> coordinator_, checkpointd_;
  std::string coordinator_port_, checkpointd_port_;
  Security client_security_;
  std::unique_ptr<CoordinatorClient> client_;
};

}  // namespace weft::testing

#endif  // WEFT_TESTS_WORKER_TLS_CLUSTER_H_
