#include "common/security.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/daemon.h"

namespace weft {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag,
                                    const char* expected) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string pem = buffer.str();
  if (!absl::StrContains(pem, "-----BEGIN ") || !absl::StrContains(pem, expected)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM file with a ", expected, " block"));
  }
  return pem;
}

absl::Mutex process_mu(absl::kConstInit);
Security* process_security ABSL_GUARDED_BY(process_mu) = nullptr;

Security Plaintext() {
  Security s;
  s.channel_credentials = grpc::InsecureChannelCredentials();
  s.server_credentials = grpc::InsecureServerCredentials();
  return s;
}

}  // namespace

absl::StatusOr<Security> LoadSecurity(const TlsFlags& flags, const std::string& bearer_token) {
  if (flags.cert_file.empty() != flags.key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key: give both (the certificate and its private key) or neither");
  }
  if (bearer_token.find_first_of(" \t\r\n") != std::string::npos) {
    return absl::InvalidArgumentError("--token / WEFT_TOKEN: must not contain whitespace");
  }
  Security security = Plaintext();
  security.bearer_token = bearer_token;
  if (flags.cert_file.empty() && flags.ca_file.empty()) return security;

  std::string cert, key, ca;
  if (!flags.cert_file.empty()) {
    auto c = ReadPem(flags.cert_file, "--tls-cert", "CERTIFICATE");
    if (!c.ok()) return c.status();
    auto k = ReadPem(flags.key_file, "--tls-key", "PRIVATE KEY");
    if (!k.ok()) return k.status();
    cert = std::move(*c);
    key = std::move(*k);
  }
  if (!flags.ca_file.empty()) {
    auto a = ReadPem(flags.ca_file, "--tls-ca", "CERTIFICATE");
    if (!a.ok()) return a.status();
    ca = std::move(*a);
  }
  security.tls = true;

  grpc::SslCredentialsOptions channel;
  channel.pem_root_certs = ca;  // empty: the system's roots
  channel.pem_private_key = key;
  channel.pem_cert_chain = cert;
  security.channel_credentials = grpc::SslCredentials(channel);

  if (!cert.empty()) {
    grpc::SslServerCredentialsOptions server(
        ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    server.pem_root_certs = ca;
    server.pem_key_cert_pairs.push_back({key, cert});
    security.server_credentials = grpc::SslServerCredentials(server);
  } else {
    // A client-only configuration (--tls-ca alone): a server of this process has no
    // certificate to serve TLS with.
    security.server_credentials = nullptr;
  }
  return security;
}

void SetProcessSecurity(Security security) {
  absl::MutexLock lock(&process_mu);
  // The previous one is left alive on purpose: ProcessSecurity() hands out references.
  process_security = new Security(std::move(security));
}

const Security& ProcessSecurity() {
  absl::MutexLock lock(&process_mu);
  if (process_security == nullptr) process_security = new Security(Plaintext());
  return *process_security;
}

absl::Status CheckPlaintextAllowed(const Security& security, const std::string& listen) {
  if (security.tls && security.server_credentials == nullptr) {
    return absl::InvalidArgumentError(
        "--tls-ca without --tls-cert/--tls-key: a server needs its own certificate to serve "
        "TLS");
  }
  if (security.tls || IsLoopbackAddress(listen)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "--listen ", listen, ": plaintext is only allowed on a loopback address; give "
      "--tls-cert and --tls-key (and --tls-ca to require client certificates)"));
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? a[i] : 0;
    const unsigned char y = i < b.size() ? b[i] : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<std::shared_ptr<const TokenAuthorizer>> TokenAuthorizer::FromFile(
    const std::string& path, const std::string& flag) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": cannot read"));
  std::vector<std::string> tokens;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string token(absl::StripAsciiWhitespace(line));
    if (token.empty() || token[0] == '#') continue;
    bool printable = true;
    for (char c : token) printable = printable && c > ' ' && c < 127;
    if (!printable || token.size() < 16 || token.size() > 4096) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", path, ":", number,
                       ": a token must be 16-4096 printable characters without spaces"));
    }
    tokens.push_back(token);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, " ", path, ": no tokens"));
  }
  return std::make_shared<const TokenAuthorizer>(std::move(tokens));
}

absl::Status TokenAuthorizer::Check(const grpc::ServerContextBase& context) const {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "missing bearer token: pass --token or set WEFT_TOKEN (metadata \"authorization: "
        "Bearer <token>\")");
  }
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kPrefix = "Bearer ";
  const std::string_view presented =
      value.substr(0, kPrefix.size()) == kPrefix ? value.substr(kPrefix.size()) : std::string_view();
  bool accepted = false;
  // Every token is compared, so the time does not tell which one (or none) matched.
  for (const std::string& token : tokens_) accepted |= ConstantTimeEquals(presented, token);
  if (!accepted) return absl::UnauthenticatedError("bearer token not accepted");
  return absl::OkStatus();
}

}  // namespace weft
