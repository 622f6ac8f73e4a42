// Transport security and caller authentication, configured once per process from its flags.
//
// TLS: every server and every channel of a process takes its certificates from the same three
// flags. A server with --tls-cert/--tls-key serves TLS; with --tls-ca as well it requires
// client certificates issued by that CA (mutual TLS: workers and checkpointd prove who they
// are). A channel verifies the server against --tls-ca and presents --tls-cert/--tls-key
// when given. Without any of them everything is plaintext, which a server accepts only on a
// loopback address.
//
// Tokens: a process with --token (or WEFT_TOKEN) sends "authorization: Bearer <token>" on every
// call of every channel; a coordinator with --auth-tokens-file answers calls without one of
// the listed tokens UNAUTHENTICATED. Tokens are compared in constant time and never logged.
#ifndef WEFT_COMMON_SECURITY_H_
#define WEFT_COMMON_SECURITY_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace weft {

struct TlsFlags {
  std::string cert_file;  // --tls-cert: PEM certificate chain of this process
  std::string key_file;   // --tls-key: PEM private key of --tls-cert
  std::string ca_file;    // --tls-ca: PEM CA that peers' certificates must chain to
};

// A process's transport security, loaded from its flags.
struct Security {
  bool tls = false;
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials;  // never null
  std::shared_ptr<grpc::ServerCredentials> server_credentials;    // never null
  std::string bearer_token;  // sent on every call; empty: none
};

// Reads the files named by `flags`. INVALID_ARGUMENT names the flag and file that are wrong
// (unreadable, empty, not PEM, a key without its certificate or the other way round).
absl::StatusOr<Security> LoadSecurity(const TlsFlags& flags, const std::string& bearer_token);

// What MakeChannel and ServingDaemon use. Set once in main() before the first channel; until
// then (and in tests that never set it) everything is plaintext without a token.
void SetProcessSecurity(Security security);
const Security& ProcessSecurity();

// INVALID_ARGUMENT when `listen` is not loopback and `security` has no TLS.
absl::Status CheckPlaintextAllowed(const Security& security, const std::string& listen);

// True when a and b are equal; the time taken depends only on their lengths' maximum.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

// Accepted bearer tokens, checked against each incoming call.
class TokenAuthorizer {
 public:
  // One token per line; blank lines and lines starting with # are skipped; at least one
  // token, each 16-4096 printable characters without spaces. Errors name `flag` and the file
  // and line, never a token.
  static absl::StatusOr<std::shared_ptr<const TokenAuthorizer>> FromFile(const std::string& path,
                                                                       const std::string& flag);
  explicit TokenAuthorizer(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}

  // OK, or UNAUTHENTICATED saying whether the token was missing or not accepted.
  absl::Status Check(const grpc::ServerContextBase& context) const;

 private:
  std::vector<std::string> tokens_;
};

}  // namespace weft

#endif  // WEFT_COMMON_SECURITY_H_
