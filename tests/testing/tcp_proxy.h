// A TCP forwarder on 127.0.0.1 in front of one local server, for tests that need a connection
// to break while both of its ends stay alive: the case a restarted server cannot show (its
// state is gone) and a cut link (netns.h) shows only as root.
#ifndef WEFT_TESTS_TESTING_TCP_PROXY_H_
#define WEFT_TESTS_TESTING_TCP_PROXY_H_

#include <netinet/in.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace weft::testing {

// 127.0.0.1:`port` (0: any free port, for bind).
sockaddr_in Loopback(int port);

// Every connection accepted on port() is forwarded, byte for byte in both directions, to
// 127.0.0.1:target_port over a connection of its own. One thread polls every socket.
// Thread-safe.
class TcpProxy {
 public:
  // Listens on 127.0.0.1:0. Fails only if a socket cannot be made.
  static absl::StatusOr<std::unique_ptr<TcpProxy>> Start(int target_port);
  // Stops accepting and closes every connection.
  ~TcpProxy();
  TcpProxy(const TcpProxy&) = delete;
  TcpProxy& operator=(const TcpProxy&) = delete;

  int port() const { return port_; }
  std::string address() const;  // "127.0.0.1:<port>"

  // Resets every open connection (both its client and its server side) at once. New
  // connections are forwarded as before.
  void CutAll();
  // Arms a one-shot cut: the next bytes a server sends on any connection are dropped and
  // that connection is reset instead. A request in flight is then lost after the server saw
  // it, or while the server is still working on it — the lost reply a client cannot tell
  // from a lost request.
  void CutOnNextReply();
  // The same for a gRPC (HTTP/2) server, cut at the next response it starts: the next HEADERS
  // frame it sends on a stream, on any connection. The frames before it on that connection
  // (settings, pings, window updates) still pass, so that a keepalive ping or a flow-control
  // update sent while the call is on its way cannot take the cut meant for its reply.
  void CutOnNextGrpcResponse();

  // While on, new connections are not accepted: they wait in the listen queue (the client's
  // connect has completed, and what it sends reaches nobody) until the hold ends, then go
  // through as usual. Live connections are untouched. A client that lost its connection
  // stays away, as behind a link that drops its packets, until the test lets it back.
  void HoldNewConnections(bool hold);

  // Connections reset by CutAll, CutOnNextReply or CutOnNextGrpcResponse so far.
  int cuts() const { return cuts_.load(); }
  // Connections accepted so far.
  int accepted() const { return accepted_.load(); }
  // Bytes read from clients for the server so far, counted as they are forwarded: a caller
  // sees its request on its way to the server (more than before it was sent) without a sleep.
  int64_t bytes_to_server() const { return bytes_to_server_.load(); }

 private:
  TcpProxy(int listen_fd, int port, int target_port, int wake_read, int wake_write);
  void Loop();
  void Wake();

  const int listen_fd_;
  const int port_;
  const int target_port_;
  // A pipe whose write end the public methods poke, so that the loop sees a request at once.
  const int wake_read_;
  const int wake_write_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> cut_all_{false};
  std::atomic<bool> cut_on_reply_{false};
  std::atomic<bool> cut_on_grpc_response_{false};
  std::atomic<bool> hold_new_{false};
  std::atomic<int> cuts_{0};
  std::atomic<int> accepted_{0};
  std::atomic<int64_t> bytes_to_server_{0};
  std::thread thread_;
};

}  // namespace weft::testing

#endif  // WEFT_TESTS_TESTING_TCP_PROXY_H_
