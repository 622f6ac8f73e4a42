#include "common/rpc.h"

#include <netdb.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace weft {
namespace {

int ClampToInt(int64_t v) {
  return static_cast<int>(std::clamp<int64_t>(v, 0, std::numeric_limits<int>::max()));
}

// ServerBuilder's AddChannelArgument under the name ChannelArguments uses, for SetKeepalive.
class ServerArgs {
 public:
  explicit ServerArgs(grpc::ServerBuilder* builder) : builder_(builder) {}
  void SetInt(const std::string& name, int value) { builder_->AddChannelArgument(name, value); }

 private:
  grpc::ServerBuilder* builder_;
};

// Adds "authorization: Bearer <token>" to every call of a channel.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header) : header_(header) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", *header_});
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;  // owned by the factory, which the channel keeps
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(const std::string& token)
      : header_(absl::StrCat("Bearer ", token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  const std::string header_;
};

// Keepalive pings on a channel or server (`args` is either's argument setter).
template <typename Args>
void SetKeepalive(const KeepaliveOptions& keepalive, Args* args) {
  if (keepalive.interval_ms <= 0) return;
  args->SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, ClampToInt(keepalive.interval_ms));
  args->SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ClampToInt(keepalive.timeout_ms));
  args->SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A session stream carries no data for hours; by default gRPC stops pinging after two pings
  // without data, which would leave exactly that stream unwatched.
  args->SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, options.max_reconnect_backoff_ms);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              std::min(100, options.max_reconnect_backoff_ms));
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left alone on purpose: gRPC also uses it as the
  // minimum time a connection attempt may take, and a small value makes every connection in
  // a burst of thousands give up before the server's handshake reaches it.
  if (options.private_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  SetKeepalive(options.keepalive, &args);
  const Security& security = options.security ? *options.security : ProcessSecurity();
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.bearer_token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.bearer_token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      target, security.channel_credentials, args, std::move(interceptors));
}

void ConfigureServerBuilder(grpc::ServerBuilder* builder, const KeepaliveOptions& keepalive) {
  builder->SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder->SetMaxSendMessageSize(kMaxMessageBytes);
  // Clients ping as often as their own keepalive flags say (workers every second by
  // default), on connections that may carry nothing else for hours. A server that counted
  // those pings as abuse would answer with GOAWAY "too_many_pings" and so tear down the very
  // streams the pings watch: accept them at any rate, without strikes.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 0);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC sets SO_REUSEPORT on Linux by default: a second daemon on a port already served then
  // starts "fine" and the kernel spreads new connections over both, so clients alternate
  // between two coordinators. Bound exclusively, the second one fails to start instead.
  builder->AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  ServerArgs args(builder);
  SetKeepalive(keepalive, &args);
}

std::string WhyCannotBind(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "not host:port";
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int rc = ::getaddrinfo(host.empty() || host == "*" ? nullptr : host.c_str(), port.c_str(),
                             &hints, &found);
      rc != 0) {
    return absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc));
  }
  std::string why;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // As the servers do, so that connections in TIME_WAIT are not mistaken for a server.
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0) {
      why = std::strerror(errno);
    } else if (::listen(fd, 1) != 0) {
      why = std::strerror(errno);
    }
    ::close(fd);
    if (!why.empty()) break;
  }
  ::freeaddrinfo(found);
  return why;
}

absl::Status CheckHostPort(const std::string& address, const std::string& flag) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": \"", address, "\" is not host:port (port 0-65535)"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      return absl::PermissionDeniedError(
          absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
    }
    out << contents;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat(tmp, ": write failed"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat(path, ": rename failed: ", std::strerror(err)));
  }
  return absl::OkStatus();
}

void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace weft
