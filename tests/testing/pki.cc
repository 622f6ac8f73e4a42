#include "tests/testing/pki.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace weft::testing {

Pki::Pki(const std::vector<std::string>& server_ips) {
  Ca("ca-a");
  Ca("ca-b");
  std::vector<std::string> names = {"DNS:localhost"};
  for (const auto& ip : server_ips) names.push_back("IP:" + ip);
  Leaf("server", "ca-a", "subjectAltName=" + absl::StrJoin(names, ","));
  Leaf("client-a", "ca-a", "extendedKeyUsage=clientAuth");
  Leaf("client-b", "ca-b", "extendedKeyUsage=clientAuth");
}

std::vector<std::string> Pki::Flags(const std::string& name) const {
  return {"--tls-cert=" + Pem(name), "--tls-key=" + Key(name), "--tls-ca=" + Pem("ca-a")};
}

void Pki::Run(const std::vector<std::string>& argv) {
  if (!status_.ok()) return;
  auto r = RunCommand(argv);
  if (r.exit_code != 0) {
    status_ = absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), ": ", r.err));
  }
}

void Pki::Ca(const std::string& name) {
  Run({"/usr/bin/openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
       "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", Key(name), "-out", Pem(name), "-days",
       "2", "-subj", "/CN=weft-test-" + name});
}

void Pki::Leaf(const std::string& name, const std::string& ca, const std::string& extension) {
  WriteFile(dir_.File(name + ".ext"), extension + "\n");
  Run({"/usr/bin/openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
       "-nodes", "-keyout", Key(name), "-out", dir_.File(name + ".csr"), "-subj",
       "/CN=weft-test-" + name});
  Run({"/usr/bin/openssl", "x509", "-req", "-in", dir_.File(name + ".csr"), "-CA", Pem(ca),
       "-CAkey", Key(ca), "-CAcreateserial", "-out", Pem(name), "-days", "2", "-extfile",
       dir_.File(name + ".ext")});
}

}  // namespace weft::testing
