#include "coordinator/deadline_timer.h"

#include <vector>

namespace weft {

DeadlineTimer::DeadlineTimer() : thread_([this] { Loop(); }) {}

DeadlineTimer::~DeadlineTimer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t DeadlineTimer::Schedule(absl::Time when, std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  by_time_.emplace(when, id);
  entries_.emplace(id, Entry{when, std::move(fn)});
  return id;
}

bool DeadlineTimer::Cancel(uint64_t id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  auto [lo, hi] = by_time_.equal_range(it->second.when);
  for (auto t = lo; t != hi; ++t) {
    if (t->second == id) {
      by_time_.erase(t);
      break;
    }
  }
  entries_.erase(it);
  return true;
}

void DeadlineTimer::Loop() {
  // Deadlines come thousands a second at 10K workers (each held heartbeat has one): waking a
  // little after the first due one and running every callback due by then, in one batch,
  // spares a wake-up per callback.
  constexpr absl::Duration kCoalesce = absl::Milliseconds(1);
  std::vector<std::function<void()>> due;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      while (true) {
        if (stopping_) return;
        if (!by_time_.empty() && by_time_.begin()->first <= absl::Now()) break;
        const absl::Time wake = by_time_.empty() ? absl::Now() + absl::Seconds(1)
                                                 : by_time_.begin()->first + kCoalesce;
        // Woken early by any change to the schedule; re-evaluated every loop.
        auto changed = [this, first = by_time_.empty() ? 0 : by_time_.begin()->second]() {
          mu_.AssertHeld();
          return stopping_ || (!by_time_.empty() && by_time_.begin()->second != first);
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), wake);
      }
      const absl::Time now = absl::Now();
      while (!by_time_.empty() && by_time_.begin()->first <= now) {
        auto first = by_time_.begin();
        auto entry = entries_.find(first->second);
        due.push_back(std::move(entry->second.fn));
        entries_.erase(entry);
        by_time_.erase(first);
      }
    }
    for (auto& fn : due) fn();
    due.clear();
  }
}

}  // namespace weft
