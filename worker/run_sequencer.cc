#include "worker/run_sequencer.h"

#include <utility>

namespace weft::worker {

RunSequencer::RunSequencer() : thread_([this] { Loop(); }) {}

RunSequencer::~RunSequencer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void RunSequencer::Start(GenerationRun* run) { Push(Task{run, nullptr}); }

void RunSequencer::Retire(std::unique_ptr<GenerationRun> run) {
  if (run) Push(Task{nullptr, std::move(run)});
}

void RunSequencer::Push(Task task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void RunSequencer::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &RunSequencer::Idle));
}

bool RunSequencer::Idle() const { return tasks_.empty() && !busy_; }

bool RunSequencer::HasWork() const { return stopping_ || !tasks_.empty(); }

void RunSequencer::Loop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &RunSequencer::HasWork));
      if (tasks_.empty()) return;  // stopping, nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
      // A run started while the agent shuts down would only be aborted again.
      if (stopping_) task.start = nullptr;
      busy_ = true;
    }
    if (task.start != nullptr) task.start->Start();
    task.retire.reset();  // joins the run's thread
    absl::MutexLock lock(&mu_);
    busy_ = false;
  }
}

}  // namespace weft::worker
