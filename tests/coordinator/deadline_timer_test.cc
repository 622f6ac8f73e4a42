// Unit tests for DeadlineTimer: ordering, Cancel semantics, volume, shutdown.
#include "coordinator/deadline_timer.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft {
namespace {

using ::testing::ElementsAre;

// Upper bound for "soon": only a broken timer ever waits this long.
constexpr absl::Duration kPatience = absl::Seconds(10);

// Thread-safe record of which callbacks ran, in order.
class RunLog {
 public:
  void Add(int v) {
    absl::MutexLock lock(&mu_);
    values_.push_back(v);
  }
  std::vector<int> values() {
    absl::MutexLock lock(&mu_);
    return values_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int> values_;
};

TEST(DeadlineTimerTest, RunsCallbacksInDeadlineOrder) {
  DeadlineTimer timer;
  RunLog log;
  absl::Notification last;
  const absl::Time now = absl::Now();
  timer.Schedule(now + absl::Milliseconds(30), [&] {
    log.Add(30);
    last.Notify();
  });
  timer.Schedule(now + absl::Milliseconds(10), [&] { log.Add(10); });
  timer.Schedule(now + absl::Milliseconds(20), [&] { log.Add(20); });
  timer.Schedule(now + absl::Milliseconds(5), [&] { log.Add(5); });
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(kPatience));
  EXPECT_THAT(log.values(), ElementsAre(5, 10, 20, 30));
}

TEST(DeadlineTimerTest, EqualDeadlinesRunInScheduleOrder) {
  DeadlineTimer timer;
  RunLog log;
  absl::Notification last;
  const absl::Time when = absl::Now() + absl::Milliseconds(5);
  for (int i = 0; i < 5; ++i) timer.Schedule(when, [&log, i] { log.Add(i); });
  timer.Schedule(when, [&] { last.Notify(); });
  ASSERT_TRUE(last.WaitForNotificationWithTimeout(kPatience));
  EXPECT_THAT(log.values(), ElementsAre(0, 1, 2, 3, 4));
}

TEST(DeadlineTimerTest, DoesNotRunBeforeDeadline) {
  DeadlineTimer timer;
  absl::Notification ran;
  absl::Time ran_at;
  const absl::Time when = absl::Now() + absl::Milliseconds(20);
  timer.Schedule(when, [&] {
    ran_at = absl::Now();
    ran.Notify();
  });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(kPatience));
  EXPECT_GE(ran_at, when);
}

TEST(DeadlineTimerTest, PastDeadlineRunsPromptly) {
  DeadlineTimer timer;
  absl::Notification ran;
  timer.Schedule(absl::Now() - absl::Hours(1), [&] { ran.Notify(); });
  EXPECT_TRUE(ran.WaitForNotificationWithTimeout(kPatience));
}

TEST(DeadlineTimerTest, EarlierDeadlineScheduledLaterWakesTheTimer) {
  DeadlineTimer timer;
  std::atomic<bool> far_ran{false};
  timer.Schedule(absl::Now() + absl::Hours(1), [&] { far_ran = true; });
  absl::Notification near;
  const absl::Time start = absl::Now();
  timer.Schedule(absl::Now() + absl::Milliseconds(2), [&] { near.Notify(); });
  ASSERT_TRUE(near.WaitForNotificationWithTimeout(kPatience));
  // Not delayed until the timer's own idle wake-up (1 s) or the far deadline.
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));
  EXPECT_FALSE(far_ran.load());
}

TEST(DeadlineTimerTest, ScheduleReturnsDistinctNonZeroIds) {
  DeadlineTimer timer;
  const absl::Time far = absl::Now() + absl::Hours(1);
  std::vector<uint64_t> ids;
  for (int i = 0; i < 100; ++i) ids.push_back(timer.Schedule(far, [] {}));
  std::sort(ids.begin(), ids.end());
  EXPECT_NE(ids.front(), 0u);
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
}

TEST(DeadlineTimerTest, CancelBeforeFireReturnsTrueAndCallbackNeverRuns) {
  DeadlineTimer timer;
  std::atomic<bool> cancelled_ran{false};
  const absl::Time now = absl::Now();
  const uint64_t id = timer.Schedule(now + absl::Milliseconds(10), [&] { cancelled_ran = true; });
  EXPECT_TRUE(timer.Cancel(id));
  EXPECT_FALSE(timer.Cancel(id));  // a second Cancel finds nothing
  // A later callback running proves the timer went past the cancelled deadline.
  absl::Notification after;
  timer.Schedule(now + absl::Milliseconds(20), [&] { after.Notify(); });
  ASSERT_TRUE(after.WaitForNotificationWithTimeout(kPatience));
  EXPECT_FALSE(cancelled_ran.load());
}

TEST(DeadlineTimerTest, CancellingTheEarliestLetsTheNextRun) {
  DeadlineTimer timer;
  RunLog log;
  absl::Notification done;
  const absl::Time now = absl::Now();
  const uint64_t first = timer.Schedule(now + absl::Milliseconds(5), [&] { log.Add(1); });
  timer.Schedule(now + absl::Milliseconds(10), [&] {
    log.Add(2);
    done.Notify();
  });
  ASSERT_TRUE(timer.Cancel(first));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(kPatience));
  EXPECT_THAT(log.values(), ElementsAre(2));
}

TEST(DeadlineTimerTest, CancelAfterFireReturnsFalse) {
  DeadlineTimer timer;
  absl::Notification ran;
  const uint64_t id = timer.Schedule(absl::Now(), [&] { ran.Notify(); });
  ASSERT_TRUE(ran.WaitForNotificationWithTimeout(kPatience));
  EXPECT_FALSE(timer.Cancel(id));
}

TEST(DeadlineTimerTest, CancelWhileRunningReturnsFalse) {
  DeadlineTimer timer;
  absl::Notification started, release, finished;
  const uint64_t id = timer.Schedule(absl::Now(), [&] {
    started.Notify();
    release.WaitForNotification();
    finished.Notify();
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(kPatience));
  EXPECT_FALSE(timer.Cancel(id));  // must not block on the running callback either
  release.Notify();
  ASSERT_TRUE(finished.WaitForNotificationWithTimeout(kPatience));
}

TEST(DeadlineTimerTest, CancelUnknownIdReturnsFalse) {
  DeadlineTimer timer;
  EXPECT_FALSE(timer.Cancel(0));
  EXPECT_FALSE(timer.Cancel(987654321));
}

TEST(DeadlineTimerTest, CallbackMayScheduleAndCancel) {
  DeadlineTimer timer;
  absl::Notification chained;
  std::atomic<bool> victim_ran{false};
  const uint64_t victim =
      timer.Schedule(absl::Now() + absl::Milliseconds(50), [&] { victim_ran = true; });
  std::atomic<bool> cancel_result{false};
  timer.Schedule(absl::Now(), [&] {
    cancel_result = timer.Cancel(victim);
    timer.Schedule(absl::Now(), [&] { chained.Notify(); });
  });
  ASSERT_TRUE(chained.WaitForNotificationWithTimeout(kPatience));
  EXPECT_TRUE(cancel_result.load());
  absl::Notification later;
  timer.Schedule(absl::Now() + absl::Milliseconds(60), [&] { later.Notify(); });
  ASSERT_TRUE(later.WaitForNotificationWithTimeout(kPatience));
  EXPECT_FALSE(victim_ran.load());
}

TEST(DeadlineTimerTest, TenThousandTimersAllFireInDeadlineOrder) {
  DeadlineTimer timer;
  constexpr int kTimers = 10000;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> offset_us(0, 30000);
  // Far enough ahead that every timer is scheduled before the first one is due.
  const absl::Time base = absl::Now() + absl::Milliseconds(100);
  absl::Mutex mu;
  std::vector<absl::Time> fired;  // the deadline of each callback, in run order
  fired.reserve(kTimers);
  std::atomic<int> count{0};
  absl::Notification all;
  for (int i = 0; i < kTimers; ++i) {
    const absl::Time when = base + absl::Microseconds(offset_us(rng));
    timer.Schedule(when, [&, when] {
      {
        absl::MutexLock lock(&mu);
        fired.push_back(when);
      }
      if (count.fetch_add(1) + 1 == kTimers) all.Notify();
    });
  }
  const bool scheduled_in_time = absl::Now() < base;
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(kPatience)) << count.load() << " fired";
  absl::MutexLock lock(&mu);
  ASSERT_EQ(fired.size(), static_cast<size_t>(kTimers));
  // (A timer scheduled after its deadline passed may legitimately run after later ones.)
  if (scheduled_in_time) {
    EXPECT_TRUE(std::is_sorted(fired.begin(), fired.end()));
  }
}

TEST(DeadlineTimerTest, ExactlyOneOfCancelOrRunUnderRaces) {
  DeadlineTimer timer;
  constexpr int kTimers = 2000;
  std::vector<std::atomic<int>> runs(kTimers);
  std::vector<uint64_t> ids(kTimers);
  const absl::Time base = absl::Now();
  for (int i = 0; i < kTimers; ++i) {
    // Deadlines spread over ~4 ms so that Cancel races the timer thread.
    ids[i] = timer.Schedule(base + absl::Microseconds(2 * i), [&runs, i] { runs[i].fetch_add(1); });
  }
  std::vector<bool> cancelled(kTimers);
  for (int i = 0; i < kTimers; ++i) cancelled[i] = timer.Cancel(ids[i]);
  // The timer runs in deadline order: once this one runs, every earlier one has finished.
  absl::Notification sentinel;
  timer.Schedule(base + absl::Milliseconds(10), [&] { sentinel.Notify(); });
  ASSERT_TRUE(sentinel.WaitForNotificationWithTimeout(kPatience));
  for (int i = 0; i < kTimers; ++i) {
    EXPECT_EQ(runs[i].load() + (cancelled[i] ? 1 : 0), 1) << "timer " << i;
  }
}

TEST(DeadlineTimerTest, DestructorDropsPendingCallbacksPromptly) {
  std::atomic<bool> ran{false};
  auto token = std::make_shared<int>(0);
  const absl::Time start = absl::Now();
  {
    DeadlineTimer timer;
    timer.Schedule(absl::Now() + absl::Hours(1), [&ran, token] { ran = true; });
    EXPECT_EQ(token.use_count(), 2);
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_FALSE(ran.load());
  EXPECT_EQ(token.use_count(), 1);  // the dropped callback was destroyed
}

TEST(DeadlineTimerTest, IdleTimerDestroysPromptly) {
  const absl::Time start = absl::Now();
  { DeadlineTimer timer; }
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(900));  // not after its 1 s idle wake-up
}

}  // namespace
}  // namespace weft
