#include "worker/host_identity.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace weft::worker {
namespace {

constexpr char kNcclPrefix[] = "NCCL_";

bool IsMachineId(std::string_view id) {
  if (id.size() != 32) return false;
  for (char c : id) {
    if (!absl::ascii_isxdigit(c) || absl::ascii_isupper(c)) return false;
  }
  return true;
}

// What is wrong with `path` as a machine-id file, or its id.
absl::StatusOr<std::string> ReadOneMachineId(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  const std::string id(absl::StripAsciiWhitespace(text.str()));
  if (id.empty()) return absl::NotFoundError(absl::StrCat(path, ": empty"));
  if (!IsMachineId(id)) {
    return absl::NotFoundError(
        absl::StrCat(path, ": \"", id.substr(0, 40), "\" is not 32 lowercase hex digits"));
  }
  return id;
}

bool IsNcclName(absl::string_view name) {
  if (!absl::StartsWith(name, kNcclPrefix) || name.size() == std::strlen(kNcclPrefix)) {
    return false;
  }
  for (char c : name) {
    if (!absl::ascii_isupper(c) && !absl::ascii_isdigit(c) && c != '_') return false;
  }
  return true;
}

// One interface name: what Gloo can bind to. NCCL's prefix lists ("eth,ib", "^docker",
// "=eth0") go through --nccl-env NCCL_SOCKET_IFNAME instead.
bool IsInterfaceName(std::string_view name) {
  if (name.empty() || name.size() >= IFNAMSIZ) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '_' && c != '-' && c != '@') return false;
  }
  return true;
}

// The variables dedicated flags set, and the flag that sets each.
struct Dedicated {
  const char* variable;
  const char* flag;
};
constexpr Dedicated kDedicated[] = {{"NCCL_SOCKET_IFNAME", "--net-interface"},
                                    {"NCCL_IB_HCA", "--nccl-ib-hca"},
                                    {"NCCL_SOCKET_NTHREADS", "--nccl-socket-threads"}};

// The variables the dedicated flags ask for, name -> value.
absl::StatusOr<std::map<std::string, std::string>> DedicatedVariables(const CommFlags& flags) {
  std::map<std::string, std::string> set;
  if (!flags.network_interface.empty()) {
    if (!IsInterfaceName(flags.network_interface)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--net-interface: \"", flags.network_interface,
          "\" is not one interface name (for NCCL's interface lists, such as \"^docker,lo\", "
          "use --nccl-env NCCL_SOCKET_IFNAME=...)"));
    }
    set["NCCL_SOCKET_IFNAME"] = flags.network_interface;
  }
  if (!flags.ib_hcas.empty()) {
    for (char c : flags.ib_hcas) {
      if (!absl::ascii_isalnum(c) && std::strchr("_,:^=.-", c) == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--nccl-ib-hca: \"", flags.ib_hcas,
                         "\" is not a list of HCA names such as mlx5_0,mlx5_1:1"));
      }
    }
    set["NCCL_IB_HCA"] = flags.ib_hcas;
  }
  if (flags.socket_threads != 0) {
    // NCCL refuses more than 16 threads per connection.
    if (flags.socket_threads < 1 || flags.socket_threads > 16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nccl-socket-threads: must be 1-16 (0: NCCL's default), got ", flags.socket_threads));
    }
    set["NCCL_SOCKET_NTHREADS"] = absl::StrCat(flags.socket_threads);
  }
  return set;
}

}  // namespace

const std::vector<std::string>& DefaultMachineIdPaths() {
  static const auto* paths =
      new std::vector<std::string>{"/etc/machine-id", "/var/lib/dbus/machine-id"};
  return *paths;
}

absl::StatusOr<std::string> ReadMachineId(const std::vector<std::string>& paths) {
  std::vector<std::string> problems;
  for (const std::string& path : paths) {
    absl::StatusOr<std::string> id = ReadOneMachineId(path);
    if (id.ok()) return id;
    problems.emplace_back(id.status().message());
  }
  return absl::NotFoundError(
      absl::StrCat("no machine id (", absl::StrJoin(problems, "; "), ")"));
}

absl::StatusOr<std::string> InterfaceIpv4Address(const std::string& name) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot list network interfaces: ", std::strerror(errno)));
  }
  std::set<std::string> names;
  std::string address;
  bool found = false;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_name == nullptr) continue;
    names.insert(a->ifa_name);
    if (name != a->ifa_name) continue;
    found = true;
    if (a->ifa_addr != nullptr && a->ifa_addr->sa_family == AF_INET && address.empty()) {
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) address = text;
    }
  }
  ::freeifaddrs(list);
  if (!found) {
    return absl::NotFoundError(absl::StrCat("no network interface \"", name,
                                            "\" on this machine (it has: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  if (address.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("network interface \"", name, "\" has no IPv4 address"));
  }
  return address;
}

absl::Status CheckCanListenOn(const std::string& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(address.c_str(), "0", &hints, &found); rc != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("\"", address, "\" does not resolve: ", ::gai_strerror(rc)));
  }
  std::string error = "no address";
  bool bound = false;
  for (addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;
    if (!bound) error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (bound) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot listen on \"", address, "\" (", error,
      "): it is not an address of this machine"));
}

bool ResolvesOnlyToLoopback(const std::string& address) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(address.c_str(), nullptr, &hints, &found) != 0) return false;
  bool all_loopback = found != nullptr;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      all_loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      all_loopback &= IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) != 0;
    } else {
      all_loopback = false;
    }
  }
  ::freeaddrinfo(found);
  return all_loopback;
}

absl::StatusOr<weft::v1::CommSettings> ResolveCommSettings(
    const CommFlags& flags, const std::vector<std::string>& environment) {
  auto dedicated = DedicatedVariables(flags);
  if (!dedicated.ok()) return dedicated.status();
  std::map<std::string, std::string> variables;
  for (const std::string& item : environment) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || !IsNcclName(item.substr(0, eq))) continue;
    variables[item.substr(0, eq)] = item.substr(eq + 1);
  }
  for (const std::string& item : flags.nccl_env) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    if (eq == std::string::npos || !IsNcclName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--nccl-env: \"", item, "\" is not NCCL_NAME=value (for example NCCL_DEBUG=INFO)"));
    }
    for (const Dedicated& d : kDedicated) {
      if (name == d.variable && dedicated->contains(name)) {
        return absl::InvalidArgumentError(absl::StrCat("--nccl-env ", name, " and ", d.flag,
                                                       " both set ", name, "; keep one"));
      }
    }
    variables[name] = item.substr(eq + 1);
  }
  for (const auto& [name, value] : *dedicated) variables[name] = value;

  weft::v1::CommSettings settings;
  settings.set_network_interface(flags.network_interface);
  settings.set_ib_hcas(flags.ib_hcas);
  settings.set_socket_threads(flags.socket_threads);
  settings.mutable_nccl_env()->insert(variables.begin(), variables.end());
  return settings;
}

std::vector<std::string> ProcessEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

absl::Status ApplyCommSettings(const weft::v1::CommSettings& settings) {
  for (const auto& [name, value] : settings.nccl_env()) {
    if (::setenv(name.c_str(), value.c_str(), /*overwrite=*/1) != 0) {
      return absl::InternalError(absl::StrCat("setenv ", name, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace weft::worker
