// TLS, mutual TLS and bearer tokens against a real weft-coordinator process, with certificates
// made by openssl for each run: who is refused, who gets through, and what the refusals say.
#include "common/security.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/pki.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::CoordinatorProcess;
using testing::Pki;
using testing::RunCommand;
using testing::TempDir;

constexpr char kToken[] = "weft-test-token-5f0c2a9d1e";
constexpr char kOtherToken[] = "weft-test-token-not-listed";

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki(); }
  void SetUp() override { ASSERT_TRUE(pki_->status().ok()) << pki_->status(); }
  static void TearDownTestSuite() { delete pki_; }

  void StartCoordinator(const std::vector<std::string>& args) {
    auto cp = CoordinatorProcess::Start(dir_.path(), args);
    ASSERT_TRUE(cp.ok()) << cp.status();
    coordinator_ = std::move(*cp);
  }

  static Security Client(const TlsFlags& tls, const std::string& token = "") {
    auto s = LoadSecurity(tls, token);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : Security();
  }

  // A plain call (ListWorkers) and a stream (WatchJob of a missing job) with `security`.
  absl::Status Call(const Security& security) {
    ClientOptions options;
    options.rpc_timeout = absl::Seconds(5);
    options.channel.security = &security;
    options.channel.private_connection = true;  // each client its own handshake
    CoordinatorClient client(coordinator_->address(), options);
    return client.ListWorkers().status();
  }
  absl::Status Watch(const Security& security) {
    ClientOptions options;
    options.channel.security = &security;
    options.channel.private_connection = true;
    CoordinatorClient client(coordinator_->address(), options);
    return client.WatchJob("no-such-job", [](const auto&) { return true; });
  }

  static Pki* pki_;
  TempDir dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
};
Pki* SecurityTest::pki_ = nullptr;

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("secret-token", "secret-token"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", "secret-token-longer"));
  EXPECT_FALSE(ConstantTimeEquals("secret-token", ""));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST_F(SecurityTest, ServerTlsAcceptsClientsTrustingItsCaOnly) {
  StartCoordinator({"--tls-cert=" + pki_->Pem("server"), "--tls-key=" + pki_->Key("server")});
  EXPECT_TRUE(Call(Client({.ca_file = pki_->Pem("ca-a")})).ok());
  EXPECT_EQ(Call(Client({})).code(), absl::StatusCode::kUnavailable);  // plaintext
  EXPECT_EQ(Call(Client({.ca_file = pki_->Pem("ca-b")})).code(),
            absl::StatusCode::kUnavailable);  // does not trust the server
}

TEST_F(SecurityTest, MutualTlsRefusesClientsWithoutACertificateFromItsCa) {
  StartCoordinator({"--tls-cert=" + pki_->Pem("server"), "--tls-key=" + pki_->Key("server"),
                    "--tls-ca=" + pki_->Pem("ca-a")});
  EXPECT_EQ(Call(Client({.ca_file = pki_->Pem("ca-a")})).code(),
            absl::StatusCode::kUnavailable);  // no client certificate
  EXPECT_EQ(Call(Client({.cert_file = pki_->Pem("client-b"),
                         .key_file = pki_->Key("client-b"),
                         .ca_file = pki_->Pem("ca-a")}))
                .code(),
            absl::StatusCode::kUnavailable);  // a certificate from another CA
  EXPECT_TRUE(Call(Client({.cert_file = pki_->Pem("client-a"),
                           .key_file = pki_->Key("client-a"),
                           .ca_file = pki_->Pem("ca-a")}))
                  .ok());
}

TEST_F(SecurityTest, TokensAreRequiredOnEveryCallAndNeverLogged) {
  testing::WriteFile(dir_.File("tokens"),
                     absl::StrCat("# team tokens\n\n", kToken, "\nweft-second-token-00000000\n"));
  StartCoordinator({"--auth-tokens-file=" + dir_.File("tokens"), "--log-level=debug"});
  const absl::Status none = Call(Client({}));
  EXPECT_EQ(none.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.message(), HasSubstr("missing bearer token"));
  const absl::Status wrong = Call(Client({}, kOtherToken));
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.message(), HasSubstr("not accepted"));
  EXPECT_THAT(wrong.message(), Not(HasSubstr(kOtherToken)));
  EXPECT_EQ(Watch(Client({})).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Call(Client({}, kToken)).ok());
  EXPECT_TRUE(Call(Client({}, "weft-second-token-00000000")).ok());
  // A stream with the token gets past the check to the coordinator's own answer.
  EXPECT_EQ(Watch(Client({}, kToken)).code(), absl::StatusCode::kNotFound);
  const std::string log = testing::ReadFile(coordinator_->log_path());
  EXPECT_THAT(log, Not(HasSubstr(kToken)));
  EXPECT_THAT(log, Not(HasSubstr(kOtherToken)));
}

// trainctl with mutual TLS and a token, as an operator would run it.
TEST_F(SecurityTest, TrainctlWorksWithMutualTlsAndAToken) {
  testing::WriteFile(dir_.File("tokens"), absl::StrCat(kToken, "\n"));
  StartCoordinator({"--tls-cert=" + pki_->Pem("server"), "--tls-key=" + pki_->Key("server"),
                    "--tls-ca=" + pki_->Pem("ca-a"),
                    "--auth-tokens-file=" + dir_.File("tokens")});
  const std::vector<std::string> base = {
      testing::BinDir() + "/trainctl", "--coordinator=" + coordinator_->address(),
      "--tls-ca=" + pki_->Pem("ca-a"), "--tls-cert=" + pki_->Pem("client-a"),
      "--tls-key=" + pki_->Key("client-a"), "list"};
  auto ok = RunCommand(base, {{"WEFT_TOKEN", kToken}});
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  auto refused = RunCommand(base);
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("missing bearer token"));
}

// Each bad setting stops the daemon before it serves, naming the flag (and file).
TEST_F(SecurityTest, BadSecuritySettingsAreRefusedNamingTheFlag) {
  testing::WriteFile(dir_.File("short-tokens"), "ok-token-long-enough\nshort\n");
  testing::WriteFile(dir_.File("not-pem"), "hello\n");
  struct Case {
    std::vector<std::string> args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {{"--tls-cert=" + pki_->Pem("server")}, "--tls-cert and --tls-key: give both"},
      {{"--tls-cert=" + dir_.File("missing.pem"), "--tls-key=" + pki_->Key("server")},
       "--tls-cert " + dir_.File("missing.pem") + ": cannot read"},
      {{"--tls-cert=" + pki_->Pem("server"), "--tls-key=" + dir_.File("not-pem")},
       "--tls-key " + dir_.File("not-pem") + ": not a PEM file"},
      {{"--tls-ca=" + pki_->Pem("ca-a")}, "--tls-ca without --tls-cert/--tls-key"},
      {{"--listen=0.0.0.0:0"}, "plaintext is only allowed on a loopback address"},
      {{"--auth-tokens-file=" + dir_.File("short-tokens")},
       "--auth-tokens-file " + dir_.File("short-tokens") + ":2: a token must be"},
      {{"--auth-tokens-file=" + dir_.File("missing")}, "--auth-tokens-file"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {testing::BinDir() + "/weft-coordinator",
                                     "--metrics-address=none", "--data-dir=" + dir_.File("db")};
    if (!absl::StartsWith(c.args[0], "--listen")) argv.push_back("--listen=127.0.0.1:0");
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = RunCommand(argv, {}, absl::Seconds(20));
    EXPECT_NE(r.exit_code, 0) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.err, HasSubstr(c.expected)) << absl::StrJoin(c.args, " ");
    EXPECT_THAT(r.err, Not(HasSubstr("ok-token-long-enough")));
  }
  // The same flags reach every binary: a worker and trainctl refuse a broken pair too.
  for (const std::string binary : {"weft-worker", "trainctl", "weft-checkpointd"}) {
    std::vector<std::string> argv = {testing::BinDir() + "/" + binary,
                                     "--tls-cert=" + pki_->Pem("client-a")};
    if (binary == "trainctl") argv.push_back("list");
    auto r = RunCommand(argv, {}, absl::Seconds(20));
    EXPECT_NE(r.exit_code, 0) << binary;
    EXPECT_THAT(r.err, HasSubstr("--tls-cert and --tls-key: give both")) << binary;
  }
}

}  // namespace
}  // namespace weft
