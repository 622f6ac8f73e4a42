// The security flags every Weft binary takes (see common/security.h), in one place so that
// they read the same everywhere.
#ifndef WEFT_COMMON_SECURITY_FLAGS_H_
#define WEFT_COMMON_SECURITY_FLAGS_H_

#include <cstdlib>
#include <memory>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "common/security.h"

namespace weft {

struct SecurityFlags {
  TlsFlags tls;
  std::string token;  // --token, else WEFT_TOKEN
};

inline void AddSecurityFlags(CLI::App& app, SecurityFlags* flags) {
  app.add_option("--tls-cert", flags->tls.cert_file,
                 "PEM certificate: serve TLS, and present it to servers (with --tls-key)");
  app.add_option("--tls-key", flags->tls.key_file, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", flags->tls.ca_file,
                 "PEM CA: verify servers against it; servers also require client "
                 "certificates from it (mutual TLS)");
  app.add_option("--token", flags->token,
                 "bearer token sent on every call (default: env WEFT_TOKEN); never logged");
}

// Loads the files and makes them the process's security (SetProcessSecurity). Call in main()
// after parsing, before the first channel or server.
inline absl::Status InstallSecurity(const SecurityFlags& flags) {
  std::string token = flags.token;
  if (token.empty()) {
    if (const char* env = std::getenv("WEFT_TOKEN")) token = env;
  }
  // Tokens kept in files (`openssl rand -hex 32 > f`, Kubernetes secrets) end in a newline.
  token = std::string(absl::StripAsciiWhitespace(token));
  auto security = LoadSecurity(flags.tls, token);
  if (!security.ok()) return security.status();
  SetProcessSecurity(std::move(*security));
  return absl::OkStatus();
}

// --auth-tokens-file, the same on every server that checks bearer tokens.
inline void AddAuthTokensFlag(CLI::App& app, std::string* path) {
  app.add_option("--auth-tokens-file", *path,
                 "require every call to carry one of these bearer tokens (one per line)");
}

// The tokens of --auth-tokens-file `path`; nullptr (every call accepted) when it is empty.
inline absl::StatusOr<std::shared_ptr<const TokenAuthorizer>> LoadAuthTokens(
    const std::string& path) {
  if (path.empty()) return nullptr;
  return TokenAuthorizer::FromFile(path, "--auth-tokens-file");
}

}  // namespace weft

#endif  // WEFT_COMMON_SECURITY_FLAGS_H_
