// One thread that runs callbacks at deadlines: expiry of held heartbeats, Join and store Wait
// calls, and the coordinator's periodic tick. Thousands of parked calls cost one thread.
#ifndef WEFT_COORDINATOR_DEADLINE_TIMER_H_
#define WEFT_COORDINATOR_DEADLINE_TIMER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace weft {

class DeadlineTimer {
 public:
  DeadlineTimer();
  // Stops the thread; callbacks not yet run are dropped.
  ~DeadlineTimer();

  // Runs `fn` on the timer thread at (or soon after: about a millisecond, to batch deadlines
  // that fall close together) `when`. Returns an id for Cancel (never 0).
  uint64_t Schedule(absl::Time when, std::function<void()> fn);

  // True if the callback was removed before it started; false if it ran, is running, or the id
  // is unknown. So exactly one of {Cancel returns true, the callback runs} happens.
  bool Cancel(uint64_t id);

 private:
  void Loop();

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  std::multimap<absl::Time, uint64_t> by_time_ ABSL_GUARDED_BY(mu_);
  struct Entry {
    absl::Time when;
    std::function<void()> fn;
  };
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace weft

#endif  // WEFT_COORDINATOR_DEADLINE_TIMER_H_
