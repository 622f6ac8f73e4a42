#include "tests/testing/tcp_proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace weft::testing {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat("tcp proxy: ", what, ": ", std::strerror(errno)));
}

// Closes with a reset rather than an orderly FIN, as a dropped link looks to a peer that
// next writes to it.
void Reset(int fd) {
  linger l{.l_onoff = 1, .l_linger = 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  close(fd);
}

bool SendAll(int fd, const char* data, ssize_t n) {
  while (n > 0) {
    const ssize_t sent = send(fd, data, static_cast<size_t>(n), MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    data += sent;
    n -= sent;
  }
  return true;
}

// Follows the HTTP/2 frames of one byte stream (a server's, which starts with a frame: only
// clients send the connection preface) across reads of any size.
class Http2Frames {
 public:
  // Scans the stream's next `n` bytes. Returns the offset among them where the first HEADERS
  // frame on a stream (a response's start) begins, 0 when its 9-byte frame header began in
  // an earlier read, and -1 when none begins here.
  ssize_t FirstResponse(const char* data, ssize_t n) {
    constexpr uint8_t kHeaders = 0x1;
    ssize_t first = -1;
    ssize_t i = 0;
    while (i < n) {
      if (payload_left_ > 0) {
        const ssize_t skip = static_cast<ssize_t>(
            std::min<uint64_t>(payload_left_, static_cast<uint64_t>(n - i)));
        i += skip;
        payload_left_ -= static_cast<uint64_t>(skip);
        continue;
      }
      const ssize_t header_start = i - filled_;
      while (filled_ < kHeaderBytes && i < n) header_[filled_++] = static_cast<uint8_t>(data[i++]);
      if (filled_ < kHeaderBytes) break;
      filled_ = 0;
      payload_left_ = (uint64_t{header_[0]} << 16) | (uint64_t{header_[1]} << 8) | header_[2];
      const uint32_t stream = ((uint32_t{header_[5]} & 0x7f) << 24) |
                              (uint32_t{header_[6]} << 16) | (uint32_t{header_[7]} << 8) |
                              header_[8];
      if (first < 0 && header_[3] == kHeaders && stream != 0) {
        first = std::max<ssize_t>(header_start, 0);
      }
    }
    return first;
  }

 private:
  static constexpr int kHeaderBytes = 9;  // length (3), type, flags, stream id (4)
  uint8_t header_[kHeaderBytes] = {};
  int filled_ = 0;
  uint64_t payload_left_ = 0;
};

struct Pair {
  int client;
  int server;
  Http2Frames from_server;
};

}  // namespace

sockaddr_in Loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

absl::StatusOr<std::unique_ptr<TcpProxy>> TcpProxy::Start(int target_port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  sockaddr_in addr = Loopback(0);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const absl::Status s = Errno("bind/listen on 127.0.0.1:0");
    close(fd);
    return s;
  }
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    const absl::Status s = Errno("pipe");
    close(fd);
    return s;
  }
  return std::unique_ptr<TcpProxy>(
      new TcpProxy(fd, ntohs(addr.sin_port), target_port, wake[0], wake[1]));
}

TcpProxy::TcpProxy(int listen_fd, int port, int target_port, int wake_read, int wake_write)
    : listen_fd_(listen_fd),
      port_(port),
      target_port_(target_port),
      wake_read_(wake_read),
      wake_write_(wake_write),
      thread_([this] { Loop(); }) {}

TcpProxy::~TcpProxy() {
  stop_ = true;
  Wake();
  thread_.join();
  close(listen_fd_);
  close(wake_read_);
  close(wake_write_);
}

std::string TcpProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

void TcpProxy::Wake() {
  const char byte = 0;
  (void)!write(wake_write_, &byte, 1);
}

void TcpProxy::CutAll() {
  cut_all_ = true;
  Wake();
  // Returns once the loop has reset them, so that a caller's next step meets the cut.
  while (cut_all_.load()) absl::SleepFor(absl::Milliseconds(1));
}

void TcpProxy::CutOnNextReply() { cut_on_reply_ = true; }

void TcpProxy::CutOnNextGrpcResponse() { cut_on_grpc_response_ = true; }

void TcpProxy::HoldNewConnections(bool hold) {
  hold_new_ = hold;
  Wake();  // the loop polls the listener again, or stops to
}

void TcpProxy::Loop() {
  std::vector<Pair> pairs;
  std::vector<pollfd> fds;
  char buffer[64 << 10];
  while (!stop_.load()) {
    if (cut_all_.load()) {
      cuts_ += static_cast<int>(pairs.size());
      for (const Pair& p : pairs) {
        Reset(p.client);
        Reset(p.server);
      }
      pairs.clear();
      cut_all_ = false;
    }
    // Held: new connections wait in the listen queue, unanswered, until the hold ends.
    fds.assign({{wake_read_, POLLIN, 0},
                {listen_fd_, static_cast<short>(hold_new_.load() ? 0 : POLLIN), 0}});
    for (const Pair& p : pairs) {
      fds.push_back({p.client, POLLIN, 0});
      fds.push_back({p.server, POLLIN, 0});
    }
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (fds[0].revents != 0) (void)!read(wake_read_, buffer, sizeof(buffer));
    // Only the pairs in fds are scanned below; one accepted now joins them after the scan.
    std::vector<Pair> open;
    // A hold set while this poll was already waiting on the listener must still keep the
    // connection that woke it in the queue.
    if ((fds[1].revents & POLLIN) && !hold_new_.load()) {
      const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client >= 0) {
        ++accepted_;
        const int server = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const sockaddr_in target = Loopback(target_port_);
        if (server >= 0 &&
            connect(server, reinterpret_cast<const sockaddr*>(&target), sizeof(target)) == 0) {
          open.push_back({client, server, {}});
        } else {
          // The server is down: the client sees its connection refused, as it would directly.
          if (server >= 0) close(server);
          Reset(client);
        }
      }
    }
    // Pairs are closed after the scan, so that the indices into fds stay valid.
    std::vector<bool> closed(pairs.size(), false);
    for (size_t i = 0; i < closed.size(); ++i) {
      const pollfd& from_client = fds[2 + 2 * i];
      const pollfd& from_server = fds[3 + 2 * i];
      Pair& p = pairs[i];
      const auto cut = [&] {
        ++cuts_;  // before the reset, which a caller may see at once
        Reset(p.client);
        Reset(p.server);
        closed[i] = true;
      };
      if (from_server.revents != 0 && cut_on_reply_.exchange(false)) {
        cut();
        continue;
      }
      for (const bool to_server : {true, false}) {
        const short ready = to_server ? from_client.revents : from_server.revents;
        if (closed[i] || ready == 0) continue;
        const int source = to_server ? p.client : p.server;
        const int sink = to_server ? p.server : p.client;
        const ssize_t n = read(source, buffer, sizeof(buffer));
        ssize_t pass = n;
        bool cut_here = false;
        if (!to_server && n > 0) {
          // Scanned whether or not a cut is armed, so that the frame boundaries stay known.
          const ssize_t response = p.from_server.FirstResponse(buffer, n);
          if (response >= 0 && cut_on_grpc_response_.exchange(false)) {
            pass = response;
            cut_here = true;
          }
        }
        // Counted before they are sent, so that whoever reads them at the server then sees
        // them counted.
        if (to_server && n > 0) bytes_to_server_ += n;
        if (n <= 0 || !SendAll(sink, buffer, pass)) {
          // One side closed or failed: close both, as an end-to-end connection would.
          close(p.client);
          close(p.server);
          closed[i] = true;
        } else if (cut_here) {
          cut();
        }
      }
    }
    for (size_t i = 0; i < pairs.size(); ++i) {
      if (!closed[i]) open.push_back(pairs[i]);
    }
    pairs.swap(open);
  }
  for (const Pair& p : pairs) {
    close(p.client);
    close(p.server);
  }
}

}  // namespace weft::testing
