// A network namespace joined to the host by a veth pair, for tests of what a real network
// does to Weft (a cut link that neither closes nor resets anything). Needs root
// (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's `ip`; Create fails otherwise, and tests
// skip on that.
#ifndef WEFT_TESTS_TESTING_NETNS_H_
#define WEFT_TESTS_TESTING_NETNS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tests/testing/subprocess.h"

namespace weft::testing {

// The host end of the pair has host_ip() and the namespace end ns_ip(), both in a /30 of
// 198.18.0.0/15 (RFC 2544's range for network tests, so it cannot shadow a real network of
// the machine). Inside the namespace, lo is up and the default route goes through host_ip();
// traffic between two namespaces therefore passes the host and needs its
// net.ipv4.ip_forward, which this class leaves as it is.
//
// Several instances, in one process or in concurrent test processes, get distinct names and
// subnets: names derive from the pid and a per-process counter, and a subnet whose host
// address is already on an interface of the machine is skipped.
class Netns {
 public:
  // Builds the namespace and the pair. On failure (typically: not root) whatever was made is
  // removed and the error names the `ip` command that failed and its message.
  static absl::StatusOr<std::unique_ptr<Netns>> Create();
  // Deletes the namespace and the pair. Processes still inside keep the namespace alive but
  // unreachable: kill them first.
  ~Netns();
  Netns(const Netns&) = delete;
  Netns& operator=(const Netns&) = delete;

  const std::string& name() const { return name_; }
  const std::string& host_ip() const { return host_ip_; }
  const std::string& ns_ip() const { return ns_ip_; }

  // `argv` prefixed so that it runs inside the namespace (for Subprocess::Start). `ip netns
  // exec` execs the command in place, so the child's pid is the command's own.
  std::vector<std::string> Wrap(const std::vector<std::string>& argv) const;
  // Runs `argv` inside the namespace to completion.
  CommandResult Run(const std::vector<std::string>& argv,
                    absl::Duration timeout = absl::Seconds(30)) const;

  // Takes the namespace end of the link down: from then on packets are dropped silently both
  // ways, as with a pulled cable (no FIN, no RST). The host end only loses carrier and keeps
  // its address, so host-local traffic to host_ip() goes on.
  absl::Status Cut();
  // Brings the namespace end up again (its address and routes are restored).
  absl::Status Restore();

  // Shapes the link to `mbit_per_s` each way, as a host with that network card would be: a
  // token bucket (tc tbf) on both ends. NOT_FOUND without iproute2's `tc`.
  absl::Status Shape(int64_t mbit_per_s);
  // Bytes the shaping let through, both ways together (tc's counters of both ends); 0 before
  // Shape.
  absl::StatusOr<int64_t> ShapedBytes() const;

 private:
  Netns() = default;
  absl::Status Ip(std::vector<std::string> args) const;
  // Runs tc with `args`, returning its output.
  absl::StatusOr<std::string> Tc(std::vector<std::string> args) const;
  absl::Status SetUp();

  std::string ip_;  // path of the `ip` binary
  bool shaped_ = false;
  std::string name_, host_veth_, ns_veth_, host_ip_, ns_ip_;
};

}  // namespace weft::testing

#endif  // WEFT_TESTS_TESTING_NETNS_H_
