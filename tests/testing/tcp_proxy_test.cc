// testing::TcpProxy itself, over plain sockets: bytes go through both ways, CutAll resets a
// live connection and later ones still pass, CutOnNextReply loses exactly one reply, and
// CutOnNextGrpcResponse exactly one HTTP/2 response.
#include "tests/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace weft::testing {
namespace {

// A socket that closes itself.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(Fd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The server behind the proxy: a listener on 127.0.0.1:0.
class Server {
 public:
  Server() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in addr = Loopback(0);
    socklen_t len = sizeof(addr);
    if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
        listen(fd_.get(), 16) == 0 &&
        getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      port_ = ntohs(addr.sin_port);
    }
  }
  int port() const { return port_; }
  Fd Accept() const { return Fd(accept(fd_.get(), nullptr, nullptr)); }

 private:
  Fd fd_;
  int port_ = 0;
};

Fd Connect(int port) {
  Fd fd(socket(AF_INET, SOCK_STREAM, 0));
  const sockaddr_in addr = Loopback(port);
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) return Fd();
  return fd;
}

bool Send(const Fd& fd, const std::string& text) {
  return send(fd.get(), text.data(), text.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(text.size());
}

// Reads exactly n bytes; what arrived before EOF or a reset otherwise ("" for nothing).
std::string Receive(const Fd& fd, size_t n) {
  std::string out;
  char buffer[256];
  while (out.size() < n) {
    const ssize_t got = recv(fd.get(), buffer, std::min(sizeof(buffer), n - out.size()), 0);
    if (got <= 0) break;
    out.append(buffer, static_cast<size_t>(got));
  }
  return out;
}

// A new connection through `proxy` carries a request to `server` and its reply back.
void ExpectANewConnectionPasses(const TcpProxy& proxy, const Server& server) {
  Fd client = Connect(proxy.port());
  Fd backend = server.Accept();
  ASSERT_TRUE(Send(client, "again"));
  EXPECT_EQ(Receive(backend, 5), "again");
  ASSERT_TRUE(Send(backend, "ok"));
  EXPECT_EQ(Receive(client, 2), "ok");
}

TEST(TcpProxyTest, ForwardsBothWaysAndCutAllResetsLiveConnections) {
  Server server;
  ASSERT_GT(server.port(), 0);
  auto proxy = TcpProxy::Start(server.port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  EXPECT_EQ((*proxy)->address(), "127.0.0.1:" + std::to_string((*proxy)->port()));

  Fd client = Connect((*proxy)->port());
  ASSERT_GE(client.get(), 0);
  Fd backend = server.Accept();
  ASSERT_TRUE(Send(client, "request"));
  EXPECT_EQ(Receive(backend, 7), "request");
  EXPECT_EQ((*proxy)->bytes_to_server(), 7);
  ASSERT_TRUE(Send(backend, "reply"));
  EXPECT_EQ(Receive(client, 5), "reply");
  EXPECT_EQ((*proxy)->accepted(), 1);

  (*proxy)->CutAll();
  EXPECT_EQ((*proxy)->cuts(), 1);
  EXPECT_EQ(Receive(client, 1), "") << "the client's side must be gone";
  EXPECT_EQ(Receive(backend, 1), "") << "the server's side must be gone";

  // The proxy itself stays: a new connection is forwarded.
  ExpectANewConnectionPasses(**proxy, server);
}

TEST(TcpProxyTest, CutOnNextReplyLosesOneReplyAfterTheServerGotTheRequest) {
  Server server;
  auto proxy = TcpProxy::Start(server.port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  Fd client = Connect((*proxy)->port());
  Fd backend = server.Accept();

  (*proxy)->CutOnNextReply();
  ASSERT_TRUE(Send(client, "add 1"));
  EXPECT_EQ(Receive(backend, 5), "add 1") << "the request must arrive";
  Send(backend, "sum 1");  // may fail once the reset is back: nothing to check
  EXPECT_EQ(Receive(client, 5), "") << "the reply must be lost";
  EXPECT_EQ((*proxy)->cuts(), 1);

  // One-shot: the next connection's reply passes.
  ExpectANewConnectionPasses(**proxy, server);
  EXPECT_EQ((*proxy)->cuts(), 1);
}

// An HTTP/2 frame: 9-byte header (length, type, flags, stream id) and its payload.
std::string Frame(uint8_t type, uint32_t stream, const std::string& payload) {
  const size_t n = payload.size();
  std::string frame = {static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                       static_cast<char>(n),       static_cast<char>(type),
                       0,                          static_cast<char>(stream >> 24),
                       static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                       static_cast<char>(stream)};
  return frame + payload;
}

// The gRPC-aware cut lets everything before the next response through, however the frames
// are split across writes, and loses that response.
TEST(TcpProxyTest, CutOnNextGrpcResponseCutsAtTheNextHeadersFrameOnAStream) {
  constexpr uint8_t kData = 0x0, kHeaders = 0x1, kSettings = 0x4, kPing = 0x6;
  Server server;
  auto proxy = TcpProxy::Start(server.port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  Fd client = Connect((*proxy)->port());
  Fd backend = server.Accept();

  // Unarmed: a whole response passes (its payload holds bytes that read like a frame header).
  const std::string lookalike = Frame(kHeaders, 7, "").substr(0, 9);
  const std::string before = Frame(kSettings, 0, "") + Frame(kHeaders, 1, lookalike + "hpack");
  ASSERT_TRUE(Send(backend, before));
  EXPECT_EQ(Receive(client, before.size()), before);

  (*proxy)->CutOnNextGrpcResponse();
  // A ping and a DATA frame whose payload looks like a HEADERS frame's header still pass, the
  // ping split in the middle of its header.
  const std::string ping = Frame(kPing, 0, "12345678");
  ASSERT_TRUE(Send(backend, ping.substr(0, 4)));
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  ASSERT_TRUE(Send(backend, ping.substr(4)));
  EXPECT_EQ(Receive(client, ping.size()), ping);
  const std::string data = Frame(kData, 1, lookalike);
  ASSERT_TRUE(Send(backend, data));
  EXPECT_EQ(Receive(client, data.size()), data);
  EXPECT_EQ((*proxy)->cuts(), 0);

  // The next response (a ping ahead of it in the same write) is where the connection breaks.
  const std::string settings = Frame(kSettings, 0, "");
  Send(backend, settings + Frame(kHeaders, 3, "hpack") + Frame(kData, 3, "reply"));
  EXPECT_EQ(Receive(client, settings.size() + 1), settings) << "the response must be lost";
  EXPECT_EQ((*proxy)->cuts(), 1);

  // One-shot: the next connection's reply passes.
  ExpectANewConnectionPasses(**proxy, server);
  EXPECT_EQ((*proxy)->cuts(), 1);
}

TEST(TcpProxyTest, HeldNewConnectionsWaitAndLiveOnesPass) {
  Server server;
  auto proxy = TcpProxy::Start(server.port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  Fd live = Connect((*proxy)->port());
  Fd live_backend = server.Accept();
  (*proxy)->HoldNewConnections(true);
  Fd held = Connect((*proxy)->port());  // completes in the kernel's listen queue
  ASSERT_GE(held.get(), 0);
  ASSERT_TRUE(Send(held, "early"));
  ASSERT_TRUE(Send(live, "still"));
  EXPECT_EQ(Receive(live_backend, 5), "still");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ((*proxy)->accepted(), 1) << "a held connection must not be accepted";
  (*proxy)->HoldNewConnections(false);
  Fd held_backend = server.Accept();
  EXPECT_EQ(Receive(held_backend, 5), "early") << "what it sent while held arrives after";
  ASSERT_TRUE(Send(held_backend, "ok"));
  EXPECT_EQ(Receive(held, 2), "ok");
  EXPECT_EQ((*proxy)->accepted(), 2);
}

TEST(TcpProxyTest, AServerThatIsDownRefusesThroughTheProxy) {
  int port = 0;
  {
    Server gone;
    port = gone.port();
  }
  auto proxy = TcpProxy::Start(port);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  Fd client = Connect((*proxy)->port());
  ASSERT_GE(client.get(), 0);
  EXPECT_EQ(Receive(client, 1), "");
}

}  // namespace
}  // namespace weft::testing
