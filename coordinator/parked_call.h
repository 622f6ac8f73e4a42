// How the coordinator answers calls without holding its lock or a thread: side effects are
// gathered under the lock and run after it (Actions), and a call that waits — a held
// heartbeat, a Join before its rendezvous completes, a Store.Wait — is parked with a deadline
// (ParkedCall) instead of blocking a thread.
#ifndef WEFT_COORDINATOR_PARKED_CALL_H_
#define WEFT_COORDINATOR_PARKED_CALL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/deadline_timer.h"

namespace weft::coordinator {

using Clock = std::function<absl::Time()>;

// Side effects (call completions, watcher calls) gathered under the coordinator's lock and run
// after it is released: declare it before the lock, so that it is destroyed after the unlock.
class Actions {
 public:
  void Add(std::function<void()> fn) { fns_.push_back(std::move(fn)); }
  void Run() {
    for (auto& fn : fns_) fn();
    fns_.clear();
  }
  ~Actions() { Run(); }

 private:
  std::vector<std::function<void()>> fns_;
};

// A call parked until it is answered or its deadline passes, whichever comes first: exactly one
// answer reaches its completion. Thread-safe.
//
// `guard` is the lock of the state the call waits on (the coordinator's for heartbeats and
// joins; none for a store wait, whose state has its own). The deadline's answer is computed
// with `guard` held, and callers that Take() with it held never race the deadline: whoever
// runs first under the guard answers.
template <typename T>
class ParkedCall {
 public:
  using Done = std::function<void(absl::StatusOr<T>)>;
  // The answer at the deadline; runs on the timer thread with the guard held, and may tidy
  // the state that refers to `call`.
  using Expiry = std::function<absl::StatusOr<T>(const ParkedCall& call)>;

  // Parks `done` until `deadline`. The answer runs on the timer thread after the guard is
  // released.
  static std::shared_ptr<ParkedCall> Park(DeadlineTimer& timer, absl::Mutex* guard,
                                          absl::Time deadline, Done done, Expiry expire) {
    std::shared_ptr<ParkedCall> call(new ParkedCall(timer, std::move(done)));
    const uint64_t id =
        timer.Schedule(deadline, [call, guard, expire = std::move(expire)] {
          Done answer;
          std::optional<absl::StatusOr<T>> result;
          {
            std::optional<absl::MutexLock> lock;
            if (guard != nullptr) lock.emplace(guard);
            answer = call->Claim();
            if (answer) result.emplace(expire(*call));
          }
          if (answer) answer(std::move(*result));
        });
    absl::MutexLock lock(&call->mu_);
    call->timer_id_ = id;
    return call;
  }

  // Takes the completion away from the deadline (whose timer is cancelled): the caller answers
  // it. Empty if the deadline or an earlier Take got it first.
  Done Take() {
    Done done = Claim();
    uint64_t id = 0;
    {
      absl::MutexLock lock(&mu_);
      id = timer_id_;
    }
    if (done && id != 0) timer_.Cancel(id);
    return done;
  }

  // True once the completion was taken, by Take() or the deadline.
  bool Answered() {
    absl::MutexLock lock(&mu_);
    return done_ == nullptr;
  }

  // Take(), then answer with `result` among `actions` (run after the caller's lock).
  void AnswerLater(Actions& actions, absl::StatusOr<T> result) {
    if (Done done = Take()) {
      actions.Add([done = std::move(done), result = std::move(result)]() mutable {
        done(std::move(result));
      });
    }
  }

 private:
  ParkedCall(DeadlineTimer& timer, Done done) : timer_(timer), done_(std::move(done)) {}

  Done Claim() {
    absl::MutexLock lock(&mu_);
    return std::exchange(done_, nullptr);
  }

  DeadlineTimer& timer_;
  absl::Mutex mu_;
  Done done_ ABSL_GUARDED_BY(mu_);
  uint64_t timer_id_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_PARKED_CALL_H_
