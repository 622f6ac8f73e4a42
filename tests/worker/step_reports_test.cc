// StepReports: rank 0's step reports leave in order from their own thread, without the step
// waiting; an answer that ends the generation is seen; failures are dropped; a full queue
// holds the sender back; Discard drops what is unsent and the destructor sends the rest. The
// sender here is a function standing in for CoordinatorClient::ReportProgress (the worker's
// e2e tests send through the real one).
#include "worker/step_reports.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace weft::worker {
namespace {

weft::v1::ReportProgressRequest Step(int64_t step) {
  weft::v1::ReportProgressRequest report;
  report.set_job_id("job");
  report.mutable_metrics()->set_step(step);
  return report;
}

// Records the steps it is given; holds each call until `release` is notified (if given), and
// answers continue_training false for step `stop_at`, UNAVAILABLE for step `fail_at`.
struct Recorder {
  std::mutex mu;
  std::vector<int64_t> steps;
  absl::Notification* release = nullptr;
  absl::Notification entered;  // the first call has begun
  int64_t stop_at = -1;
  int64_t fail_at = -1;

  StepReports::SendFn Fn() {
    return [this](const weft::v1::ReportProgressRequest& report)
               -> absl::StatusOr<weft::v1::ReportProgressResponse> {
      if (!entered.HasBeenNotified()) entered.Notify();
      if (release != nullptr) release->WaitForNotification();
      const int64_t step = report.metrics().step();
      {
        std::lock_guard<std::mutex> lock(mu);
        steps.push_back(step);
      }
      if (step == fail_at) return absl::UnavailableError("coordinator unreachable");
      weft::v1::ReportProgressResponse answer;
      answer.set_continue_training(step != stop_at);
      return answer;
    };
  }
  std::vector<int64_t> Steps() {
    std::lock_guard<std::mutex> lock(mu);
    return steps;
  }
};

TEST(StepReportsTest, SendsInOrderWhileTheStepsGoOn) {
  absl::Notification release;
  Recorder recorder;
  recorder.release = &release;
  StepReports reports(recorder.Fn());
  for (int64_t step = 1; step <= 5; ++step) reports.Send(Step(step));  // none waits
  EXPECT_TRUE(recorder.Steps().empty());
  release.Notify();
  reports.Flush();
  EXPECT_EQ(recorder.Steps(), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_FALSE(reports.stopped());
}

TEST(StepReportsTest, AnAnswerEndingTheGenerationIsSeen) {
  Recorder recorder;
  recorder.stop_at = 2;
  StepReports reports(recorder.Fn());
  reports.Send(Step(1));
  reports.Flush();
  EXPECT_FALSE(reports.stopped());
  reports.Send(Step(2));
  reports.Flush();
  EXPECT_TRUE(reports.stopped());
}

TEST(StepReportsTest, AFailedReportIsDroppedAndTheNextOnesGo) {
  Recorder recorder;
  recorder.fail_at = 1;
  StepReports reports(recorder.Fn());
  reports.Send(Step(1));
  reports.Send(Step(2));
  reports.Flush();
  EXPECT_EQ(recorder.Steps(), (std::vector<int64_t>{1, 2}));
  EXPECT_FALSE(reports.stopped());
}

TEST(StepReportsTest, AFullQueueHoldsTheSenderBack) {
  absl::Notification release;
  Recorder recorder;
  recorder.release = &release;
  StepReports reports(recorder.Fn(), {.max_queued = 2});
  reports.Send(Step(1));  // in flight, or queued until the thread takes it
  reports.Send(Step(2));
  std::atomic<bool> sent_fourth{false};
  std::thread sender([&] {
    reports.Send(Step(3));
    reports.Send(Step(4));
    sent_fourth = true;
  });
  // However long this waits, the fourth cannot be queued while three wait or are in flight.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(sent_fourth.load());
  release.Notify();
  sender.join();
  EXPECT_TRUE(sent_fourth.load());
  reports.Flush();
  EXPECT_EQ(recorder.Steps(), (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST(StepReportsTest, DiscardDropsWhatIsUnsentAndTheEndSendsTheRest) {
  Recorder kept;
  {
    StepReports reports(kept.Fn());
    for (int64_t step = 1; step <= 3; ++step) reports.Send(Step(step));
  }  // no Flush: the destructor sends them
  EXPECT_EQ(kept.Steps(), (std::vector<int64_t>{1, 2, 3}));

  absl::Notification release;
  Recorder dropped;
  dropped.release = &release;
  {
    StepReports reports(dropped.Fn());
    reports.Send(Step(1));
    dropped.entered.WaitForNotification();  // step 1 is in flight
    reports.Send(Step(2));
    reports.Send(Step(3));
    reports.Discard();
    release.Notify();
  }
  EXPECT_EQ(dropped.Steps(), (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace weft::worker
