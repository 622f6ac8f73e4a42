// testing::Netns itself: instances that do not collide, a link that reaches the host, cuts and
// comes back, and cleanup. Needs root (see netns.h); skips without it.
#include "tests/testing/netns.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft::testing {
namespace {

// A TCP listener on every address of the host's namespace; connections complete in the
// kernel's backlog without an accept.
class Listener {
 public:
  Listener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(addr);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 && ::listen(fd_, 16) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  ~Listener() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// Whether a TCP connection from inside `netns` to `ip`:`port` opens within 2 s.
bool Connects(const Netns& netns, const std::string& ip, int port) {
  const CommandResult r = netns.Run(
      {"/usr/bin/bash", "-c", absl::StrCat("exec 3<>/dev/tcp/", ip, "/", port)},
      absl::Seconds(2));
  return r.exit_code == 0;
}

TEST(NetnsTest, InstancesAreDistinctReachTheHostAndCutAndRestoreAlone) {
  auto a = Netns::Create();
  if (!a.ok()) GTEST_SKIP() << a.status();
  auto b = Netns::Create();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NE((*a)->name(), (*b)->name());
  EXPECT_NE((*a)->host_ip(), (*b)->host_ip());
  EXPECT_NE((*a)->ns_ip(), (*b)->ns_ip());
  Listener listener;
  ASSERT_NE(listener.port(), 0);

  EXPECT_TRUE(Connects(**a, (*a)->host_ip(), listener.port()));
  EXPECT_TRUE(Connects(**b, (*b)->host_ip(), listener.port()));
  // Not vacuous: nothing listens on port 1.
  EXPECT_FALSE(Connects(**a, (*a)->host_ip(), 1));

  ASSERT_TRUE((*a)->Cut().ok());
  EXPECT_FALSE(Connects(**a, (*a)->host_ip(), listener.port()));
  EXPECT_TRUE(Connects(**b, (*b)->host_ip(), listener.port())) << "cutting a cut b too";
  ASSERT_TRUE((*a)->Restore().ok());
  EXPECT_TRUE(Connects(**a, (*a)->host_ip(), listener.port()));

  const std::string name = (*a)->name();
  a->reset();
  const CommandResult list = RunCommand({"/usr/sbin/ip", "netns", "list"});
  EXPECT_EQ(list.out.find(name + " "), std::string::npos) << list.out;
  EXPECT_EQ(list.out.find(name + "\n"), std::string::npos) << list.out;
}

}  // namespace
}  // namespace weft::testing
