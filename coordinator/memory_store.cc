#include "coordinator/memory_store.h"

#include <memory>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"

namespace weft {

MemoryStore::~MemoryStore() { Close(absl::CancelledError("store destroyed")); }

bool MemoryStore::AllPresentLocked(const std::vector<std::string>& keys) {
  for (const auto& k : keys) {
    if (!data_.contains(k)) return false;
  }
  return true;
}

void MemoryStore::CollectReadyLocked(const std::string& key, std::vector<WaitCallback>* ready) {
  auto it = waiting_on_.find(key);
  if (it == waiting_on_.end()) return;
  std::vector<uint64_t> ids = std::move(it->second);
  waiting_on_.erase(it);
  for (uint64_t id : ids) {
    auto w = waiters_.find(id);
    if (w == waiters_.end()) continue;  // cancelled or already fired
    bool complete = true;
    for (const auto& k : w->second.keys) {
      if (!data_.contains(k)) {
        // Still missing another key: keep waiting on that one.
        waiting_on_[k].push_back(id);
        complete = false;
        break;
      }
    }
    if (complete) {
      ready->push_back(std::move(w->second.callback));
      waiters_.erase(w);
    }
  }
}

void MemoryStore::PutLocked(const std::string& key, std::string value) {
  std::string& slot = data_[key];
  slot = std::move(value);
  if (journal_) journal_(key, &slot);
}

absl::Status MemoryStore::Set(std::string_view key, std::string_view value) {
  std::vector<WaitCallback> ready;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    std::string k(key);
    PutLocked(k, std::string(value));
    CollectReadyLocked(k, &ready);
  }
  for (auto& cb : ready) cb(absl::OkStatus());
  return absl::OkStatus();
}

absl::StatusOr<std::string> MemoryStore::Get(std::string_view key) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  auto it = data_.find(std::string(key));
  if (it == data_.end()) {
    return absl::NotFoundError(absl::StrCat("key \"", std::string(key), "\" not set"));
  }
  return it->second;
}

absl::StatusOr<int64_t> MemoryStore::Add(std::string_view key, int64_t delta) {
  std::vector<WaitCallback> ready;
  int64_t sum = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    std::string k(key);
    auto it = data_.find(k);
    int64_t current = 0;
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(
          absl::StrCat("key \"", k, "\" holds a value that is not a decimal int64"));
    }
    if (__builtin_add_overflow(current, delta, &sum)) {
      return absl::InvalidArgumentError(absl::StrCat("key \"", k, "\": adding ", delta, " to ",
                                                     current, " overflows int64"));
    }
    PutLocked(k, absl::StrCat(sum));
    CollectReadyLocked(k, &ready);
  }
  for (auto& cb : ready) cb(absl::OkStatus());
  return sum;
}

absl::StatusOr<CompareSetResult> MemoryStore::CompareSet(
    std::string_view key, const std::optional<std::string>& expected, std::string_view desired) {
  std::vector<WaitCallback> ready;
  CompareSetResult result;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    std::string k(key);
    auto it = data_.find(k);
    const bool matches = expected.has_value() ? (it != data_.end() && it->second == *expected)
                                              : it == data_.end();
    if (matches) {
      PutLocked(k, std::string(desired));
      result.swapped = true;
      result.value = std::string(desired);
      CollectReadyLocked(k, &ready);
    } else if (it != data_.end()) {
      result.value = it->second;
    }
  }
  for (auto& cb : ready) cb(absl::OkStatus());
  return result;
}

uint64_t MemoryStore::WhenAll(std::vector<std::string> keys, WaitCallback callback) {
  absl::Status now;
  {
    absl::MutexLock lock(&mu_);
    if (closed_.ok() && !AllPresentLocked(keys)) {
      const uint64_t id = next_waiter_id_++;
      for (const auto& k : keys) {
        if (!data_.contains(k)) {
          waiting_on_[k].push_back(id);
          break;  // re-registered on the next missing key when this one appears
        }
      }
      waiters_.emplace(id, Waiter{std::move(keys), std::move(callback)});
      return id;
    }
    now = closed_;
  }
  callback(now);
  return 0;
}

bool MemoryStore::CancelWait(uint64_t id) {
  absl::MutexLock lock(&mu_);
  return waiters_.erase(id) > 0;  // stale entries in waiting_on_ are skipped when seen
}

std::vector<std::string> MemoryStore::Missing(const std::vector<std::string>& keys) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> missing;
  for (const auto& k : keys) {
    if (!data_.contains(k)) missing.push_back(k);
  }
  return missing;
}

absl::Status MemoryStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  struct Shared {
    absl::Notification done;
    absl::Status status;
  };
  auto shared = std::make_shared<Shared>();
  const uint64_t id = WhenAll(keys, [shared](absl::Status s) {
    shared->status = std::move(s);
    shared->done.Notify();
  });
  if (id == 0 || shared->done.WaitForNotificationWithTimeout(timeout)) {
    shared->done.WaitForNotification();
    return shared->status;
  }
  if (!CancelWait(id)) {  // fired while timing out
    shared->done.WaitForNotification();
    return shared->status;
  }
  return absl::DeadlineExceededError(
      absl::StrCat("store wait timed out after ", absl::FormatDuration(timeout),
                   "; missing keys: ", absl::StrJoin(Missing(keys), ", ")));
}

absl::StatusOr<bool> MemoryStore::Delete(std::string_view key) {
  absl::MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  const std::string k(key);
  if (data_.erase(k) == 0) return false;
  if (journal_) journal_(k, nullptr);
  return true;
}

void MemoryStore::Close(absl::Status status) {
  std::vector<WaitCallback> callbacks;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.ok()) return;
    closed_ = status.ok() ? absl::AbortedError("store closed") : std::move(status);
    for (auto& [id, w] : waiters_) callbacks.push_back(std::move(w.callback));
    waiters_.clear();
    waiting_on_.clear();
    data_.clear();
  }
  for (auto& cb : callbacks) cb(closed_);
}

size_t MemoryStore::size() {
  absl::MutexLock lock(&mu_);
  return data_.size();
}

}  // namespace weft
