#include "worker/step_reports.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace weft::worker {

StepReports::StepReports(SendFn send, const StepReportsOptions& options)
    : send_(std::move(send)), options_(options), thread_([this] { Loop(); }) {}

StepReports::~StepReports() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closing_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void StepReports::Send(weft::v1::ReportProgressRequest report) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return queue_.size() < options_.max_queued; });
  queue_.push_back(std::move(report));
  changed_.notify_all();
}

void StepReports::Flush() {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait(lock, [&] { return queue_.empty() && !sending_; });
}

void StepReports::Discard() {
  std::lock_guard<std::mutex> lock(mu_);
  queue_.clear();
  changed_.notify_all();
}

void StepReports::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    changed_.wait(lock, [&] { return !queue_.empty() || closing_; });
    if (queue_.empty()) return;  // closing, everything sent
    weft::v1::ReportProgressRequest report = std::move(queue_.front());
    queue_.pop_front();
    sending_ = true;
    changed_.notify_all();  // room in the queue
    lock.unlock();
    const absl::StatusOr<weft::v1::ReportProgressResponse> answer = send_(report);
    if (!answer.ok()) {
      if (lost_in_a_row_++ == 0) {
        spdlog::warn("job {}: the report of step {} was lost: {} (later losses are counted, "
                     "not logged)",
                     report.job_id(), report.metrics().step(), answer.status().ToString());
      }
    } else {
      if (lost_in_a_row_ > 0) {
        spdlog::info("job {}: reports go through again at step {}; {} were lost",
                     report.job_id(), report.metrics().step(), lost_in_a_row_);
        lost_in_a_row_ = 0;
      }
      if (!answer->continue_training()) stopped_.store(true);
    }
    lock.lock();
    sending_ = false;
    changed_.notify_all();  // a Flush may be done
  }
}

}  // namespace weft::worker
