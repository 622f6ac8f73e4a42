#include "tests/testing/netns.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace weft::testing {
namespace {

// /30 subnets in 198.18.0.0/15.
constexpr int kSubnets = 32768;

// RunCommand execs a path, not a name looked up in PATH: iproute2's `name` (ip, tc).
std::string FindIproute2(const std::string& name) {
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    const std::string path = absl::StrCat(dir, name);
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return "";
}

// "198.x.y.z" of address `host` (1 or 2) of the /30 numbered `subnet`.
std::string SubnetAddress(int subnet, int host) {
  const int offset = subnet * 4;
  return absl::StrCat("198.", 18 + offset / 65536, ".", offset / 256 % 256, ".",
                      offset % 256 + host);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Netns>> Netns::Create() {
  std::unique_ptr<Netns> netns(new Netns());
  netns->ip_ = FindIproute2("ip");
  if (netns->ip_.empty()) {
    return absl::FailedPreconditionError("no `ip` binary (iproute2) to build a test network");
  }
  static std::atomic<int> counter{0};
  const int pid = ::getpid();
  const int n = counter++;
  // Interface names are at most 15 characters: a pid has at most 7 digits.
  netns->name_ = absl::StrCat("weft", pid, "-", n);
  netns->host_veth_ = absl::StrCat("wv", pid, "-", n, "h");
  netns->ns_veth_ = absl::StrCat("wv", pid, "-", n, "n");
  if (netns->host_veth_.size() > 15) {
    return absl::ResourceExhaustedError(
        absl::StrCat("too many test namespaces in one process: ", netns->host_veth_,
                     " is longer than an interface name may be"));
  }
  const CommandResult addresses = RunCommand({netns->ip_, "-o", "-4", "addr", "show"});
  for (int i = 0; i < kSubnets; ++i) {
    const int subnet = (pid % 4096 * 8 + n + i) % kSubnets;
    const std::string host_ip = SubnetAddress(subnet, 1);
    if (absl::StrContains(addresses.out, absl::StrCat(" ", host_ip, "/"))) continue;
    netns->host_ip_ = host_ip;
    netns->ns_ip_ = SubnetAddress(subnet, 2);
    break;
  }
  if (netns->host_ip_.empty()) {
    return absl::ResourceExhaustedError("every /30 of 198.18.0.0/15 is in use on this machine");
  }
  absl::Status status = netns->SetUp();
  if (!status.ok()) return status;  // the destructor removes what was made
  return netns;
}

absl::Status Netns::SetUp() {
  // Leftovers of a crashed run with the same pid would make `add` fail.
  (void)Ip({"netns", "del", name_});
  (void)Ip({"link", "del", host_veth_});
  const std::vector<std::vector<std::string>> steps = {
      {"netns", "add", name_},
      {"link", "add", host_veth_, "type", "veth", "peer", "name", ns_veth_},
      {"link", "set", ns_veth_, "netns", name_},
      {"addr", "add", host_ip_ + "/30", "dev", host_veth_},
      {"link", "set", host_veth_, "up"},
      {"-n", name_, "addr", "add", ns_ip_ + "/30", "dev", ns_veth_},
      {"-n", name_, "link", "set", "lo", "up"},
  };
  for (const auto& step : steps) {
    absl::Status status = Ip(step);
    if (!status.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot build the test network (needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN): ",
          status.message()));
    }
  }
  return Restore();
}

Netns::~Netns() {
  if (name_.empty()) return;
  (void)Ip({"netns", "del", name_});
  (void)Ip({"link", "del", host_veth_});  // gone with the namespace unless that failed
}

std::vector<std::string> Netns::Wrap(const std::vector<std::string>& argv) const {
  std::vector<std::string> wrapped = {ip_, "netns", "exec", name_};
  wrapped.insert(wrapped.end(), argv.begin(), argv.end());
  return wrapped;
}

CommandResult Netns::Run(const std::vector<std::string>& argv, absl::Duration timeout) const {
  return RunCommand(Wrap(argv), {}, timeout);
}

absl::Status Netns::Cut() { return Ip({"-n", name_, "link", "set", ns_veth_, "down"}); }

absl::Status Netns::Restore() {
  WEFT_RETURN_IF_ERROR(Ip({"-n", name_, "link", "set", ns_veth_, "up"}));
  // Taking the link down dropped the route through it.
  return Ip({"-n", name_, "route", "replace", "default", "via", host_ip_});
}

absl::Status Netns::Shape(int64_t mbit_per_s) {
  // A burst of a few milliseconds at the rate (at least 64 KiB), as a real card's queue.
  const std::string rate = absl::StrCat(mbit_per_s, "mbit");
  const std::string burst = absl::StrCat(std::max<int64_t>(64, mbit_per_s / 8 * 4), "kb");
  for (const bool ns_end : {false, true}) {
    std::vector<std::string> args;
    if (ns_end) args = {"-n", name_};
    args.insert(args.end(), {"qdisc", "replace", "dev", ns_end ? ns_veth_ : host_veth_, "root",
                             "tbf", "rate", rate, "burst", burst, "latency", "50ms"});
    WEFT_RETURN_IF_ERROR(Tc(args).status());
  }
  shaped_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Netns::ShapedBytes() const {
  if (!shaped_) return 0;
  int64_t bytes = 0;
  for (const bool ns_end : {false, true}) {
    std::vector<std::string> args;
    if (ns_end) args = {"-n", name_};
    args.insert(args.end(), {"-s", "qdisc", "show", "dev", ns_end ? ns_veth_ : host_veth_});
    WEFT_ASSIGN_OR_RETURN(const std::string out, Tc(args));
    // " Sent 123456 bytes 789 pkt (dropped 0, overlimits 0 requeues 0)"
    const size_t at = out.find("Sent ");
    int64_t sent = 0;
    if (at == std::string::npos ||
        !absl::SimpleAtoi(out.substr(at + 5, out.find(' ', at + 5) - at - 5), &sent)) {
      return absl::InternalError(absl::StrCat("tc printed no byte count: ", out));
    }
    bytes += sent;
  }
  return bytes;
}

absl::StatusOr<std::string> Netns::Tc(std::vector<std::string> args) const {
  const std::string tc = FindIproute2("tc");
  if (tc.empty()) return absl::NotFoundError("iproute2's tc is not installed");
  args.insert(args.begin(), tc);
  const CommandResult r = RunCommand(args, {}, absl::Seconds(10));
  if (r.exit_code == 0) return r.out;
  args.erase(args.begin());
  return absl::InternalError(absl::StrCat("`tc ", absl::StrJoin(args, " "), "` exited ",
                                          r.exit_code, ": ",
                                          absl::StripAsciiWhitespace(r.err)));
}

absl::Status Netns::Ip(std::vector<std::string> args) const {
  args.insert(args.begin(), ip_);
  const CommandResult r = RunCommand(args, {}, absl::Seconds(10));
  if (r.exit_code == 0) return absl::OkStatus();
  args.erase(args.begin());
  return absl::InternalError(absl::StrCat("`ip ", absl::StrJoin(args, " "), "` exited ",
                                          r.exit_code, ": ",
                                          absl::StripAsciiWhitespace(r.err)));
}

}  // namespace weft::testing
