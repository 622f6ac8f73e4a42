// The coordinator's in-memory Store for one job generation.
//
// Besides the blocking Store interface it offers WhenAll, an asynchronous wait used by the
// gRPC handlers so that thousands of ranks can wait without holding a thread each.
#ifndef WEFT_COORDINATOR_MEMORY_STORE_H_
#define WEFT_COORDINATOR_MEMORY_STORE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/store.h"

namespace weft {

class MemoryStore : public Store {
 public:
  // Called exactly once: OK when every key exists, or the status Close() was given.
  using WaitCallback = std::function<void(absl::Status)>;

  // Told every change of a key, in the order the changes happen (under the store's lock, so
  // keep it quick): the new value, or nullptr when the key was deleted. The coordinator writes
  // the changes through to its state database, so that a generation's store outlives a restart
  // of the coordinator process (see Generation::Restored).
  using Journal = std::function<void(const std::string& key, const std::string* value)>;

  MemoryStore() = default;
  // A store holding `contents` (a journal's replay), with `journal` told of later changes.
  MemoryStore(absl::flat_hash_map<std::string, std::string> contents, Journal journal)
      : journal_(std::move(journal)), data_(std::move(contents)) {}
  ~MemoryStore() override;  // Closes with CANCELLED if still open.

  // Sets the journal told of every later change (none by default). Set it before the store
  // is shared.
  void SetJournal(Journal journal) { journal_ = std::move(journal); }

  absl::Status Set(std::string_view key, std::string_view value) override;
  absl::StatusOr<std::string> Get(std::string_view key) override;
  absl::StatusOr<int64_t> Add(std::string_view key, int64_t delta) override;
  absl::StatusOr<CompareSetResult> CompareSet(std::string_view key,
                                              const std::optional<std::string>& expected,
                                              std::string_view desired) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<bool> Delete(std::string_view key) override;

  // Runs `callback` once every key exists: inline, before returning 0, if they already do;
  // otherwise later, on the thread that sets the last missing key, and returns an id for
  // CancelWait. Callbacks run with no store lock held.
  uint64_t WhenAll(std::vector<std::string> keys, WaitCallback callback);

  // Removes a pending waiter without running it. False if it already ran (or is running).
  bool CancelWait(uint64_t id);

  // The keys of `keys` that do not exist now (for timeout messages).
  std::vector<std::string> Missing(const std::vector<std::string>& keys);

  // Ends the store: every pending waiter runs with `status`, and every later call fails with
  // it. Used when the generation ends (ABORTED).
  void Close(absl::Status status);

  size_t size();

 private:
  struct Waiter {
    std::vector<std::string> keys;
    WaitCallback callback;
  };
  // Moves waiters satisfied by `key` out of waiters_ into `ready`.
  void CollectReadyLocked(const std::string& key, std::vector<WaitCallback>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllPresentLocked(const std::vector<std::string>& keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores `value` under `key` and tells the journal.
  void PutLocked(const std::string& key, std::string value) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Journal journal_;  // set before the store is shared; read under mu_

  absl::Mutex mu_;
  absl::Status closed_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> data_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  // key -> ids of waiters that still miss it.
  absl::flat_hash_map<std::string, std::vector<uint64_t>> waiting_on_ ABSL_GUARDED_BY(mu_);
};

}  // namespace weft

#endif  // WEFT_COORDINATOR_MEMORY_STORE_H_
