// Unit tests for MemoryStore (coordinator/) and PrefixStore (common/store.h).
#include "coordinator/memory_store.h"

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft {
namespace {

using ::testing::ElementsAre;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A long timeout for waits that must be satisfied: only a broken store ever reaches it.
constexpr absl::Duration kLong = absl::Seconds(10);

// Records the statuses a WhenAll callback was called with.
struct CallbackLog {
  std::atomic<int> calls{0};
  absl::Status last;
  MemoryStore::WaitCallback Callback() {
    return [this](absl::Status s) {
      last = std::move(s);
      calls.fetch_add(1);
    };
  }
};

// ---- Set / Get / Delete ----------------------------------------------------------------------

TEST(MemoryStoreTest, SetThenGet) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", "v1").ok());
  absl::StatusOr<std::string> got = store.Get("k");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v1");
  ASSERT_TRUE(store.Set("k", "v2").ok());  // overwrite
  EXPECT_EQ(*store.Get("k"), "v2");
  EXPECT_EQ(store.size(), 1u);
}

TEST(MemoryStoreTest, BinaryValuesAndEmptyValueRoundTrip) {
  MemoryStore store;
  const std::string binary("\0\x01\xff\0nccl", 8);
  ASSERT_TRUE(store.Set("id", binary).ok());
  EXPECT_EQ(*store.Get("id"), binary);
  ASSERT_TRUE(store.Set("empty", "").ok());
  absl::StatusOr<std::string> empty = store.Get("empty");
  ASSERT_TRUE(empty.ok());  // present with an empty value is not absent
  EXPECT_EQ(*empty, "");
}

TEST(MemoryStoreTest, GetMissingIsNotFoundNamingTheKey) {
  MemoryStore store;
  absl::StatusOr<std::string> got = store.Get("nccl/unique_id");
  EXPECT_EQ(got.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("nccl/unique_id"));
}

TEST(MemoryStoreTest, DeleteReportsWhetherTheKeyExisted) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", "v").ok());
  absl::StatusOr<bool> deleted = store.Delete("k");
  ASSERT_TRUE(deleted.ok());
  EXPECT_TRUE(*deleted);
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kNotFound);
  deleted = store.Delete("k");
  ASSERT_TRUE(deleted.ok());
  EXPECT_FALSE(*deleted);
  EXPECT_EQ(store.size(), 0u);
}

// ---- Add -------------------------------------------------------------------------------------

TEST(MemoryStoreTest, AddTreatsAbsentAsZeroAndStoresDecimal) {
  MemoryStore store;
  EXPECT_EQ(*store.Add("n", 5), 5);
  EXPECT_EQ(*store.Add("n", -7), -2);
  EXPECT_EQ(*store.Add("n", 0), -2);
  EXPECT_EQ(*store.Get("n"), "-2");
  ASSERT_TRUE(store.Set("m", "40").ok());
  EXPECT_EQ(*store.Add("m", 2), 42);
}

TEST(MemoryStoreTest, AddOnNonIntegerIsInvalidArgumentAndLeavesValue) {
  MemoryStore store;
  for (const char* bad : {"abc", "1.5", "12abc", "", "99999999999999999999"}) {
    ASSERT_TRUE(store.Set("k", bad).ok());
    absl::StatusOr<int64_t> sum = store.Add("k", 1);
    EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument) << "value \"" << bad << "\"";
    EXPECT_THAT(std::string(sum.status().message()), HasSubstr("\"k\""));
    EXPECT_EQ(*store.Get("k"), bad);
  }
}

// The sum of an int64 counter can overflow; signed overflow is undefined behaviour, and a
// wrapped-around sum would be handed out as if valid.
TEST(MemoryStoreTest, AddOverflowIsAnErrorAndLeavesValue) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", "9223372036854775807").ok());
  absl::StatusOr<int64_t> sum = store.Add("k", 1);
  EXPECT_FALSE(sum.ok()) << "got " << *sum;
  EXPECT_EQ(*store.Get("k"), "9223372036854775807");
}

// ---- CompareSet ------------------------------------------------------------------------------

TEST(MemoryStoreTest, CompareSetExpectAbsentOnAbsentKeySwaps) {
  MemoryStore store;
  absl::StatusOr<CompareSetResult> r = store.CompareSet("k", std::nullopt, "first");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(r->value, "first");
  EXPECT_EQ(*store.Get("k"), "first");
}

// Sets "k" to `held`, then CompareSet("k", expected, desired): the swap happens or not as
// `swapped` says, and both the result and the store hold the value that won.
void CheckCompareSetOnHeldKey(const std::string& held, const std::optional<std::string>& expected,
                              const std::string& desired, bool swapped) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", held).ok());
  absl::StatusOr<CompareSetResult> r = store.CompareSet("k", expected, desired);
  ASSERT_TRUE(r.ok());
  const std::string now_held = swapped ? desired : held;
  EXPECT_EQ(r->swapped, swapped);
  EXPECT_EQ(r->value, now_held);
  EXPECT_EQ(*store.Get("k"), now_held);
}

TEST(MemoryStoreTest, CompareSetExpectAbsentOnPresentKeyReturnsCurrent) {
  CheckCompareSetOnHeldKey("held", std::nullopt, "mine", /*swapped=*/false);
}

TEST(MemoryStoreTest, CompareSetMatchingValueSwaps) {
  CheckCompareSetOnHeldKey("a", std::string("a"), "b", /*swapped=*/true);
}

TEST(MemoryStoreTest, CompareSetMismatchKeepsValue) {
  CheckCompareSetOnHeldKey("a", std::string("x"), "b", /*swapped=*/false);
}

TEST(MemoryStoreTest, CompareSetExpectedValueOnAbsentKeyDoesNotCreate) {
  MemoryStore store;
  // An empty expected value is not the same as "absent".
  absl::StatusOr<CompareSetResult> r = store.CompareSet("k", std::string(""), "b");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->swapped);
  EXPECT_EQ(r->value, std::nullopt);
  EXPECT_EQ(store.Get("k").status().code(), absl::StatusCode::kNotFound);
}

TEST(MemoryStoreTest, CompareSetIncrementRaceEndsExact) {
  MemoryStore store;
  constexpr int kThreads = 8;
  constexpr int kIncrements = 200;
  std::atomic<int> failed_swaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIncrements; ++i) {
        while (true) {
          absl::StatusOr<std::string> current = store.Get("counter");
          std::optional<std::string> expected;
          int64_t value = 0;
          if (current.ok()) {
            expected = *current;
            ASSERT_TRUE(absl::SimpleAtoi(*current, &value));
          } else {
            ASSERT_EQ(current.status().code(), absl::StatusCode::kNotFound);
          }
          absl::StatusOr<CompareSetResult> r =
              store.CompareSet("counter", expected, absl::StrCat(value + 1));
          ASSERT_TRUE(r.ok()) << r.status();
          if (r->swapped) break;
          failed_swaps.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store.Get("counter"), absl::StrCat(kThreads * kIncrements));
}

TEST(MemoryStoreTest, AddRaceEndsExactAndEverySumIsSeenOnce) {
  MemoryStore store;
  constexpr int kThreads = 8;
  constexpr int kAdds = 1000;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, &seen, t] {
      for (int i = 0; i < kAdds; ++i) {
        absl::StatusOr<int64_t> sum = store.Add("arrivals", 1);
        ASSERT_TRUE(sum.ok());
        seen[t].push_back(*sum);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*store.Get("arrivals"), absl::StrCat(kThreads * kAdds));
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  ASSERT_EQ(all.size(), static_cast<size_t>(kThreads * kAdds));  // no sum returned twice
  EXPECT_EQ(*all.begin(), 1);
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
}

// ---- Wait ------------------------------------------------------------------------------------

TEST(MemoryStoreTest, WaitOnPresentKeysReturnsAtOnce) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Set("b", "2").ok());
  EXPECT_TRUE(store.Wait({"a", "b"}, absl::ZeroDuration()).ok());
  EXPECT_TRUE(store.Wait({}, absl::ZeroDuration()).ok());
}

TEST(MemoryStoreTest, WaitTimeoutNamesOnlyMissingKeys) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("present", "1").ok());
  const absl::Time start = absl::Now();
  absl::Status s = store.Wait({"present", "missing1", "missing2"}, absl::Milliseconds(20));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(15));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), EndsWith("missing keys: missing1, missing2"));
}

TEST(MemoryStoreTest, WaitSatisfiedByLaterSetFromAnotherThread) {
  MemoryStore store;
  std::thread setter([&store] {
    absl::SleepFor(absl::Milliseconds(5));
    ASSERT_TRUE(store.Set("nccl_id", "xyz").ok());
  });
  absl::Status s = store.Wait({"nccl_id"}, kLong);
  setter.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(*store.Get("nccl_id"), "xyz");
}

TEST(MemoryStoreTest, MultiKeyWaitNeedsEveryKey) {
  MemoryStore store;
  absl::Notification waiting_started;
  std::atomic<bool> returned{false};
  absl::Status result;
  std::thread waiter([&] {
    waiting_started.Notify();
    result = store.Wait({"rank0", "rank1", "rank2"}, kLong);
    returned = true;
  });
  waiting_started.WaitForNotification();
  ASSERT_TRUE(store.Set("rank2", "x").ok());
  ASSERT_TRUE(store.Add("rank0", 1).ok());  // Add wakes waiters too
  absl::SleepFor(absl::Milliseconds(5));
  EXPECT_FALSE(returned.load());  // rank1 still missing
  ASSERT_TRUE(store.CompareSet("rank1", std::nullopt, "y").ok());  // and CompareSet
  waiter.join();
  EXPECT_TRUE(result.ok()) << result;
}

TEST(MemoryStoreTest, WaitNeedsAllKeysPresentTogether) {
  MemoryStore store;
  CallbackLog log;
  const uint64_t id = store.WhenAll({"a", "b"}, log.Callback());
  ASSERT_NE(id, 0u);
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Delete("a").ok());
  ASSERT_TRUE(store.Set("b", "1").ok());
  EXPECT_EQ(log.calls.load(), 0);  // "a" is gone again
  ASSERT_TRUE(store.Set("a", "2").ok());
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_TRUE(log.last.ok());
}

TEST(MemoryStoreTest, ManyWaitersOnOneKeyAllWake) {
  MemoryStore store;
  constexpr int kWaiters = 16;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&] {
      if (store.Wait({"go"}, kLong).ok()) ok.fetch_add(1);
    });
  }
  absl::SleepFor(absl::Milliseconds(5));
  ASSERT_TRUE(store.Set("go", "1").ok());
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), kWaiters);
}

// ---- WhenAll / CancelWait --------------------------------------------------------------------

TEST(MemoryStoreTest, WhenAllRunsInlineWhenKeysExist) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("a", "1").ok());
  CallbackLog log;
  EXPECT_EQ(store.WhenAll({"a"}, log.Callback()), 0u);
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_TRUE(log.last.ok());
}

TEST(MemoryStoreTest, WhenAllRunsOnTheSettingThreadExactlyOnce) {
  MemoryStore store;
  std::thread::id ran_on;
  int calls = 0;
  const uint64_t id = store.WhenAll({"a", "b"}, [&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    ran_on = std::this_thread::get_id();
    ++calls;
  });
  EXPECT_NE(id, 0u);
  std::thread other([&store] {
    ASSERT_TRUE(store.Set("b", "1").ok());
    ASSERT_TRUE(store.Set("a", "1").ok());  // the last missing key
  });
  const std::thread::id other_id = other.get_id();
  other.join();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ran_on, other_id);
  ASSERT_TRUE(store.Set("a", "2").ok());  // later sets do not re-run it
  EXPECT_EQ(calls, 1);
}

TEST(MemoryStoreTest, CallbackMayCallBackIntoTheStore) {
  MemoryStore store;
  absl::StatusOr<std::string> seen;
  store.WhenAll({"k"}, [&](absl::Status s) {
    ASSERT_TRUE(s.ok());
    seen = store.Get("k");                    // no lock held: must not deadlock
    ASSERT_TRUE(store.Set("ack", "1").ok());  // nor this
  });
  ASSERT_TRUE(store.Set("k", "v").ok());
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(*seen, "v");
  EXPECT_EQ(*store.Get("ack"), "1");
}

TEST(MemoryStoreTest, CancelWaitRemovesPendingWaiter) {
  MemoryStore store;
  CallbackLog log;
  const uint64_t id = store.WhenAll({"k"}, log.Callback());
  ASSERT_NE(id, 0u);
  EXPECT_TRUE(store.CancelWait(id));
  EXPECT_FALSE(store.CancelWait(id));  // already removed
  ASSERT_TRUE(store.Set("k", "v").ok());
  store.Close(absl::AbortedError("end"));
  EXPECT_EQ(log.calls.load(), 0);  // neither the Set nor the Close ran it
}

TEST(MemoryStoreTest, CancelWaitAfterFiringReturnsFalse) {
  MemoryStore store;
  CallbackLog log;
  const uint64_t id = store.WhenAll({"k"}, log.Callback());
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_FALSE(store.CancelWait(id));
}

TEST(MemoryStoreTest, CancelWaitUnknownIdReturnsFalse) {
  MemoryStore store;
  EXPECT_FALSE(store.CancelWait(0));
  EXPECT_FALSE(store.CancelWait(12345));
}

TEST(MemoryStoreTest, CancellingOneWaiterLeavesOthers) {
  MemoryStore store;
  CallbackLog a, b;
  const uint64_t id_a = store.WhenAll({"k"}, a.Callback());
  const uint64_t id_b = store.WhenAll({"k"}, b.Callback());
  EXPECT_NE(id_a, id_b);
  EXPECT_TRUE(store.CancelWait(id_a));
  ASSERT_TRUE(store.Set("k", "v").ok());
  EXPECT_EQ(a.calls.load(), 0);
  EXPECT_EQ(b.calls.load(), 1);
}

TEST(MemoryStoreTest, MissingListsAbsentKeysInOrder) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("b", "1").ok());
  EXPECT_THAT(store.Missing({"a", "b", "c"}), ElementsAre("a", "c"));
  EXPECT_THAT(store.Missing({"b"}), IsEmpty());
}

// ---- Close -----------------------------------------------------------------------------------

TEST(MemoryStoreTest, CloseWakesBlockedWaitWithItsStatus) {
  MemoryStore store;
  absl::Status result;
  absl::Notification started;
  std::thread waiter([&] {
    started.Notify();
    result = store.Wait({"never"}, kLong);
  });
  started.WaitForNotification();
  absl::SleepFor(absl::Milliseconds(5));
  const absl::Time close_time = absl::Now();
  store.Close(absl::AbortedError("generation 3 of job j-1 ended: worker lost"));
  waiter.join();
  EXPECT_LT(absl::Now() - close_time, absl::Seconds(5));
  EXPECT_EQ(result.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(result.message(), "generation 3 of job j-1 ended: worker lost");
}

TEST(MemoryStoreTest, CloseRunsPendingCallbacksAndFailsEveryLaterCall) {
  MemoryStore store;
  ASSERT_TRUE(store.Set("k", "v").ok());
  CallbackLog log;
  store.WhenAll({"missing"}, log.Callback());
  const absl::Status closed = absl::AbortedError("ended");
  store.Close(closed);
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_EQ(log.last, closed);

  EXPECT_EQ(store.Set("k", "v"), closed);
  EXPECT_EQ(store.Get("k").status(), closed);  // data dropped, and the store refuses
  EXPECT_EQ(store.Add("n", 1).status(), closed);
  EXPECT_EQ(store.CompareSet("k", std::nullopt, "x").status(), closed);
  EXPECT_EQ(store.Delete("k").status(), closed);
  EXPECT_EQ(store.Wait({"k"}, absl::Seconds(1)), closed);
  EXPECT_EQ(store.size(), 0u);

  CallbackLog late;
  EXPECT_EQ(store.WhenAll({"k"}, late.Callback()), 0u);  // runs inline with the status
  EXPECT_EQ(late.calls.load(), 1);
  EXPECT_EQ(late.last, closed);
}

TEST(MemoryStoreTest, CloseWithOkStatusStillCloses) {
  MemoryStore store;
  store.Close(absl::OkStatus());
  absl::Status s = store.Set("k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
}

TEST(MemoryStoreTest, SecondCloseKeepsFirstStatus) {
  MemoryStore store;
  store.Close(absl::AbortedError("first"));
  store.Close(absl::UnavailableError("second"));
  EXPECT_EQ(store.Set("k", "v"), absl::AbortedError("first"));
}

TEST(MemoryStoreTest, DestructorRunsPendingCallbacksCancelled) {
  CallbackLog log;
  {
    MemoryStore store;
    store.WhenAll({"never"}, log.Callback());
  }
  EXPECT_EQ(log.calls.load(), 1);
  EXPECT_EQ(log.last.code(), absl::StatusCode::kCancelled);
}

// ---- PrefixStore -----------------------------------------------------------------------------

TEST(PrefixStoreTest, NamespacesEveryOperation) {
  MemoryStore base;
  PrefixStore gloo("gloo", &base);
  PrefixStore nccl("nccl", &base);

  ASSERT_TRUE(gloo.Set("addr/0", "10.0.0.1:4000").ok());
  EXPECT_EQ(*base.Get("gloo/addr/0"), "10.0.0.1:4000");
  EXPECT_EQ(nccl.Get("addr/0").status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(*gloo.Add("count", 2), 2);
  EXPECT_EQ(*nccl.Add("count", 5), 5);
  EXPECT_EQ(*base.Get("gloo/count"), "2");
  EXPECT_EQ(*base.Get("nccl/count"), "5");

  absl::StatusOr<CompareSetResult> r = nccl.CompareSet("id", std::nullopt, "unique");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->swapped);
  EXPECT_EQ(*base.Get("nccl/id"), "unique");
  r = gloo.CompareSet("id", std::nullopt, "other");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->swapped);  // a different key

  EXPECT_TRUE(nccl.Wait({"id", "count"}, absl::ZeroDuration()).ok());
  absl::Status s = nccl.Wait({"addr/0"}, absl::Milliseconds(1));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl/addr/0"));

  EXPECT_TRUE(*gloo.Delete("addr/0"));
  EXPECT_FALSE(*nccl.Delete("addr/0"));
  EXPECT_EQ(base.Get("gloo/addr/0").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*base.Get("nccl/id"), "unique");
}

TEST(PrefixStoreTest, NestedPrefixesCompose) {
  MemoryStore base;
  PrefixStore job("job/7/gen/2", &base);
  PrefixStore barrier("barrier", &job);
  ASSERT_TRUE(barrier.Set("b0", "1").ok());
  EXPECT_EQ(*base.Get("job/7/gen/2/barrier/b0"), "1");
}

TEST(PrefixStoreTest, WaitThroughPrefixWokenBySetThroughPrefix) {
  MemoryStore base;
  PrefixStore a("p", &base);
  PrefixStore b("p", &base);
  std::thread setter([&b] {
    absl::SleepFor(absl::Milliseconds(2));
    ASSERT_TRUE(b.Set("ready", "1").ok());
  });
  EXPECT_TRUE(a.Wait({"ready"}, kLong).ok());
  setter.join();
}

// The journal hears every change in order (what the coordinator writes through to its state
// database), and a store built from a journal's replay holds what it said.
TEST(MemoryStoreJournalTest, EveryChangeIsJournaledAndAReplayRestoresIt) {
  std::vector<std::string> heard;
  absl::flat_hash_map<std::string, std::string> replay;
  MemoryStore store;
  store.SetJournal([&](const std::string& key, const std::string* value) {
    heard.push_back(value ? absl::StrCat(key, "=", *value) : absl::StrCat(key, " deleted"));
    if (value) {
      replay[key] = *value;
    } else {
      replay.erase(key);
    }
  });
  ASSERT_TRUE(store.Set("a", "1").ok());
  ASSERT_TRUE(store.Add("n", 2).ok());
  ASSERT_TRUE(store.Add("n", 3).ok());
  ASSERT_TRUE(store.CompareSet("a", std::string("1"), "two").ok());
  ASSERT_TRUE(store.CompareSet("a", std::string("9"), "3").ok());  // no swap: not journaled
  ASSERT_TRUE(store.Set("gone", "x").ok());
  ASSERT_TRUE(store.Delete("gone").ok());
  ASSERT_TRUE(store.Delete("never").ok());  // nothing deleted: not journaled
  ASSERT_FALSE(store.Add("a", 1).ok());     // not a number: refused, not journaled
  EXPECT_THAT(heard, ElementsAre("a=1", "n=2", "n=5", "a=two", "gone=x", "gone deleted"));

  MemoryStore restored(replay, nullptr);
  EXPECT_EQ(restored.Get("a").value_or(""), "two");
  EXPECT_EQ(restored.Get("n").value_or(""), "5");
  EXPECT_FALSE(restored.Get("gone").ok());
  // A waiter on a restored key is satisfied at once.
  EXPECT_TRUE(restored.Wait({"a", "n"}, absl::Milliseconds(1)).ok());
}

}  // namespace
}  // namespace weft
