// The worker's view of one job generation's key-value store, served by the coordinator's
// weft.v1.Store service. Ranks use it (directly or through PrefixStore) to exchange bootstrap
// data; because the coordinator outlives every rank, a rank's death never takes the store
// with it, and a generation's end releases every waiter with ABORTED.
#ifndef WEFT_CLIENT_REMOTE_STORE_H_
#define WEFT_CLIENT_REMOTE_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/rpc_call.h"
#include "common/store.h"
#include "grpcpp/channel.h"
#include "weft/v1/coordinator.grpc.pb.h"

namespace weft {

// Every call names (job_id, generation) as its scope; errors are the server's (ABORTED: the
// generation ended), with "<server.who> unreachable: " in front when nothing answered.
//
// A lost connection costs a call a delay rather than the rendezvous or checkpoint it serves
// (every rank would otherwise start a new generation): each call first waits up to
// `reconnect_wait` for the channel to connect, and Set, Get and Wait, which are safe to send
// twice, go again after UNAVAILABLE (kCallAttempts in all; Wait within what is left of its
// timeout). Add, CompareSet and Delete are sent once, since a lost reply cannot tell whether
// the server applied them. Thread-safe.
class RemoteStore : public Store {
 public:
  // `rpc_timeout` is the deadline of each call; Wait gets its own timeout on top of it, so
  // the server's DEADLINE_EXCEEDED (which names the missing keys) arrives before the
  // client's own (which cannot). The reconnect wait is capped at `rpc_timeout`.
  // `server`: the coordinator's channel and its name for errors (CoordinatorClient::server()).
  RemoteStore(ServerName server, std::string job_id, int64_t generation,
              absl::Duration rpc_timeout = absl::Seconds(10),
              absl::Duration reconnect_wait = absl::Seconds(3));

  absl::Status Set(std::string_view key, std::string_view value) override;
  // NOT_FOUND (the server's) if the key is absent.
  absl::StatusOr<std::string> Get(std::string_view key) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::StatusOr<CompareSetResult> CompareSet(std::string_view key,
                                              const std::optional<std::string>& expected,
                                              std::string_view desired) override;
  // `timeout` <= 0 checks once; absl::InfiniteDuration() waits until the keys exist or the
  // generation ends.
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;

  const std::string& job_id() const { return job_id_; }
  int64_t generation() const { return generation_; }

 private:
  void FillScope(weft::v1::StoreScope* scope) const;
  // A request of type Request scoped to this generation, for `key`.
  template <typename Request>
  Request KeyRequest(std::string_view key) const;

  const ServerName server_;
  std::unique_ptr<weft::v1::Store::Stub> stub_;
  std::string job_id_;
  int64_t generation_;
  absl::Duration rpc_timeout_;
  const ReconnectPolicies reconnect_;
};

}  // namespace weft

#endif  // WEFT_CLIENT_REMOTE_STORE_H_
