// A key-value store for rendezvous, in the shape of c10d's Store: what ranks of one job
// generation use to exchange bootstrap data (NCCL unique id, Gloo addresses) and to count
// arrivals.
//
// Implementations: MemoryStore (coordinator/, served over gRPC), RemoteStore (client/, the
// worker's view of one generation's store), PrefixStore (below, a namespace decorator).
// Every call may fail (a remote store's generation may end): callers propagate the status.
// ABORTED means the generation the store belongs to has ended.
#ifndef WEFT_COMMON_STORE_H_
#define WEFT_COMMON_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace weft {

struct CompareSetResult {
  // Whether `desired` was stored.
  bool swapped = false;
  // The value after the call; nullopt if the key is absent.
  std::optional<std::string> value;
};

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, overwriting; wakes waiters on `key`.
  virtual absl::Status Set(std::string_view key, std::string_view value) = 0;

  // The value of `key`; NOT_FOUND if absent (Get never blocks: use Wait first).
  virtual absl::StatusOr<std::string> Get(std::string_view key) = 0;

  // Adds `delta` to the value read as a decimal int64 (absent = 0), stores and returns the
  // sum. INVALID_ARGUMENT if the stored value is not a decimal int64.
  virtual absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) = 0;

  // Atomically: if the current value equals `expected` (nullopt: the key is absent), sets it
  // to `desired`. Either way returns the value stored afterwards.
  virtual absl::StatusOr<CompareSetResult> CompareSet(std::string_view key,
                                                      const std::optional<std::string>& expected,
                                                      std::string_view desired) = 0;

  // Blocks until every key exists. DEADLINE_EXCEEDED naming the missing keys after `timeout`.
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;

  // Removes `key`; returns whether it existed.
  virtual absl::StatusOr<bool> Delete(std::string_view key) = 0;
};

// Prepends "<prefix>/" to every key of an underlying store it does not own, so independent
// users of one generation's store (Gloo, NCCL, barriers) cannot collide.
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, Store* base) : prefix_(std::move(prefix) + "/"), base_(base) {}

  absl::Status Set(std::string_view key, std::string_view value) override {
    return base_->Set(Key(key), value);
  }
  absl::StatusOr<std::string> Get(std::string_view key) override { return base_->Get(Key(key)); }
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override {
    return base_->Add(Key(key), delta);
  }
  absl::StatusOr<CompareSetResult> CompareSet(std::string_view key,
                                              const std::optional<std::string>& expected,
                                              std::string_view desired) override {
    return base_->CompareSet(Key(key), expected, desired);
  }
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override {
    std::vector<std::string> prefixed;
    prefixed.reserve(keys.size());
    for (const auto& k : keys) prefixed.push_back(Key(k));
    return base_->Wait(prefixed, timeout);
  }
  absl::StatusOr<bool> Delete(std::string_view key) override { return base_->Delete(Key(key)); }

 private:
  std::string Key(std::string_view key) const { return prefix_ + std::string(key); }
  std::string prefix_;
  Store* base_;
};

}  // namespace weft

#endif  // WEFT_COMMON_STORE_H_
