// Unit tests for ParkedCall: exactly one answer reaches a parked call, whether the answer or
// the deadline comes first.
#include "coordinator/parked_call.h"

#include <atomic>
#include <string>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace weft::coordinator {
namespace {

using Call = ParkedCall<std::string>;
constexpr absl::Duration kPatience = absl::Seconds(10);

// Counts answers and keeps the last one.
struct Answers {
  std::atomic<int> count{0};
  absl::StatusOr<std::string> last = absl::UnknownError("none");
  absl::Notification first;
  Call::Done Done() {
    return [this](absl::StatusOr<std::string> r) {
      last = std::move(r);
      if (count.fetch_add(1) == 0) first.Notify();
    };
  }
};

TEST(ParkedCallTest, TakeBeforeTheDeadlineWinsAndTheDeadlineNeverAnswers) {
  DeadlineTimer timer;
  Answers answers;
  std::atomic<int> expired{0};
  auto call = Call::Park(timer, nullptr, absl::Now() + absl::Milliseconds(50), answers.Done(),
                         [&](const Call&) -> absl::StatusOr<std::string> {
                           ++expired;
                           return std::string("late");
                         });
  Call::Done done = call->Take();
  ASSERT_TRUE(done);
  done(std::string("answer"));
  EXPECT_FALSE(call->Take());  // only once
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(answers.count.load(), 1);
  EXPECT_EQ(*answers.last, "answer");
  EXPECT_EQ(expired.load(), 0);
}

TEST(ParkedCallTest, TheDeadlineAnswersWithItsExpiryUnderTheGuard) {
  DeadlineTimer timer;
  absl::Mutex guard;
  Answers answers;
  bool guard_held = false;
  auto call = Call::Park(timer, &guard, absl::Now() + absl::Milliseconds(20), answers.Done(),
                         [&](const Call&) -> absl::StatusOr<std::string> {
                           guard.AssertHeld();
                           guard_held = true;
                           return absl::DeadlineExceededError("too late");
                         });
  ASSERT_TRUE(answers.first.WaitForNotificationWithTimeout(kPatience));
  EXPECT_TRUE(guard_held);
  EXPECT_EQ(answers.last.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(call->Take());  // the deadline took it
  EXPECT_EQ(answers.count.load(), 1);
}

TEST(ParkedCallTest, AnswerLaterRunsOnlyWithTheActions) {
  DeadlineTimer timer;
  Answers answers;
  auto call = Call::Park(timer, nullptr, absl::Now() + absl::Hours(1), answers.Done(),
                         [](const Call&) -> absl::StatusOr<std::string> { return "never"; });
  {
    Actions actions;
    call->AnswerLater(actions, std::string("queued"));
    EXPECT_EQ(answers.count.load(), 0);  // not before the actions run
    call->AnswerLater(actions, std::string("second"));  // already taken: dropped
  }
  EXPECT_EQ(answers.count.load(), 1);
  EXPECT_EQ(*answers.last, "queued");
}

}  // namespace
}  // namespace weft::coordinator
