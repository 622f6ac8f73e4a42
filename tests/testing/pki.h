// Throwaway certificates for tests, made with the openssl command line: two CAs ("ca-a",
// "ca-b"), a server certificate from ca-a for the given IP addresses (and localhost), and a
// client certificate from each CA ("client-a", "client-b").
#ifndef WEFT_TESTS_TESTING_PKI_H_
#define WEFT_TESTS_TESTING_PKI_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "tests/testing/subprocess.h"

namespace weft::testing {

class Pki {
 public:
  // `server_ips`: the addresses clients dial the servers at.
  explicit Pki(const std::vector<std::string>& server_ips = {"127.0.0.1"});

  // OK, or what failed (the openssl command and its stderr).
  const absl::Status& status() const { return status_; }
  std::string Pem(const std::string& name) const { return dir_.File(name + ".pem"); }
  std::string Key(const std::string& name) const { return dir_.File(name + ".key"); }
  // The --tls-* flags that make a process use `name`'s certificate and trust ca-a.
  std::vector<std::string> Flags(const std::string& name) const;

 private:
  void Run(const std::vector<std::string>& argv);
  void Ca(const std::string& name);
  void Leaf(const std::string& name, const std::string& ca, const std::string& extension);

  TempDir dir_;
  absl::Status status_;
};

}  // namespace weft::testing

#endif  // WEFT_TESTS_TESTING_PKI_H_
