// Real Weft processes on 127.0.0.1 for the end-to-end tests of tests/worker: WorkersTest (a
// coordinator and the workers a test starts itself), Cluster (a whole deployment: coordinator,
// checkpointd and N CPU workers "node/cpu<i>", all keeping their state under one folder so that
// any of them can be killed and started again), and what their tests share (corpora, the
// recovery tests' job, waiting for a job, comparing final models).
#ifndef WEFT_TESTS_WORKER_CLUSTER_H_
#define WEFT_TESTS_WORKER_CLUSTER_H_

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "weft/v1/job.pb.h"
#include "worker/model_io/safetensors.h"

namespace weft::testing {

// Text with structure a tiny model learns in a few dozen steps.
inline std::string WordCorpus() {
  std::string text;
  const char* words[] = {"alpha ", "beta ", "gamma ", "delta ", "epsilon\n"};
  for (int i = 0; i < 4000; ++i) text += words[(i * 7 + i / 5) % 5];
  return text;
}

// English-like sentences, `lines` of them, cycling subjects, verbs and objects: a tiny model
// learns their structure within a few dozen steps.
inline std::string SentenceCorpus(int lines) {
  const char* subjects[] = {"the cat", "a dog", "the old man", "my friend", "the bird"};
  const char* verbs[] = {"sees", "likes", "finds", "wants", "helps"};
  const char* objects[] = {"the ball.", "a red hat.", "the sun.", "some bread.", "the river."};
  std::string text;
  for (int i = 0; i < lines; ++i) {
    absl::StrAppend(&text, subjects[i % 5], " ", verbs[(i / 5) % 5], " ", objects[(i / 25) % 5],
                    "\n");
  }
  return text;
}

// Polls job `id` until it has ended (SUCCEEDED, FAILED or CANCELLED) or `timeout` passes;
// returns the last status read.
inline v1::JobStatus WaitForJobEnd(CoordinatorClient& client, const std::string& id,
                                   absl::Duration timeout) {
  v1::JobStatus status;
  Eventually(
      [&] {
        auto job = client.GetJob(id);
        if (job.ok()) status = job->status();
        return job.ok() && (status.state() == v1::SUCCEEDED || status.state() == v1::FAILED ||
                            status.state() == v1::CANCELLED);
      },
      timeout);
  return status;
}

// Whether job `id` reports at least `step` steps within `timeout`.
inline bool WaitForJobStep(CoordinatorClient& client, const std::string& id, int64_t step,
                           absl::Duration timeout) {
  return Eventually(
      [&] {
        auto job = client.GetJob(id);
        return job.ok() && job->status().step() >= step;
      },
      timeout);
}

// A fixture: a coordinator on 127.0.0.1 with its state in dir_, and the weft-worker processes a
// test starts against it (host "node"; worker i logs to dir_/worker<i>.log).
class WorkersTest : public ::testing::Test {
 protected:
  // Starts the coordinator (fast ticks, then `flags`) and writes `corpus` to corpus_.
  void StartCoordinator(const std::string& corpus, const std::vector<std::string>& flags = {}) {
    std::vector<std::string> all = {"--tick-interval-ms=50"};
    all.insert(all.end(), flags.begin(), flags.end());
    auto cp = CoordinatorProcess::Start(dir_.path(), all);
    ASSERT_TRUE(cp.ok()) << cp.status();
    coordinator_ = std::move(*cp);
    client_ = std::make_unique<CoordinatorClient>(coordinator_->address());
    corpus_ = dir_.File("corpus.txt");
    WriteFile(corpus_, corpus);
  }

  // Starts the next worker on `device` ("cpu:1", "cuda:0") of `host`, writing its models under
  // dir_/models; `flags` follow the common ones.
  void StartWorker(const std::string& device, const std::vector<std::string>& flags,
                   const std::string& host = "node") {
    std::vector<std::string> argv = {BinDir() + "/weft-worker",
                                     "--coordinator=" + (workers_dial_.empty()
                                                             ? coordinator_->address()
                                                             : workers_dial_),
                                     "--device=" + device, "--host=" + host,
                                     "--output-dir=" + dir_.File("models")};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto p = Subprocess::Start(argv, dir_.File(absl::StrCat("worker", workers_.size(), ".log")));
    ASSERT_TRUE(p.ok());
    workers_.push_back(std::move(*p));
  }

  v1::JobStatus WaitForEnd(const std::string& id, absl::Duration timeout) {
    return WaitForJobEnd(*client_, id, timeout);
  }
  bool WaitForStep(const std::string& id, int64_t step, absl::Duration timeout) {
    return WaitForJobStep(*client_, id, step, timeout);
  }

  // The coordinator's log, then every worker's.
  std::string Logs() {
    std::string all = ReadFile(coordinator_->log_path());
    for (size_t i = 0; i < workers_.size(); ++i) {
      absl::StrAppend(&all, "\n--- worker ", i, "\n",
                      ReadFile(dir_.File(absl::StrCat("worker", i, ".log"))));
    }
    return all;
  }

  TempDir dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<CoordinatorClient> client_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::string corpus_;
  // The coordinator address workers started from now on dial; empty: the coordinator's own
  // (a test puts a TcpProxy in front of it here).
  std::string workers_dial_;
};

// The recovery tests' job: a tiny GPT on `world` CPU workers (min = max), checkpoints every
// 20 steps, heartbeats every 200 ms, a member silent for 1.5 s is lost, 2 restarts allowed.
inline v1::JobSpec RecoveryJobSpec(const std::string& name, const std::string& corpus, int world,
                                   int steps) {
  auto spec = ParseJobSpecText(absl::StrCat(R"pb(
    model { num_layers: 2 hidden_size: 32 num_heads: 2 vocab_size: 256 context_length: 32 }
    data { format: DATA_FORMAT_TEXT_BYTES train_path: ")pb", corpus, R"pb(" }
    optimizer { learning_rate: 0.01 }
    lr_schedule { warmup_steps: 10 }
    training { micro_batch_size: 4 seed: 5 total_steps: )pb", steps, R"pb( }
    zero_stage: 3
    checkpoint { interval_steps: 20 keep_last: 2 }
    fault { heartbeat_interval_ms: 200 heartbeat_timeout_ms: 1500 max_restarts: 2 }
    resources { device_kind: DEVICE_KIND_CPU min_workers: )pb", world, " max_workers: ", world,
                                            " }"),
                               name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_name(name);
  return *spec;
}

// The tensors of the model file a finished job wrote.
inline std::vector<model_io::TensorData> ReadModel(const v1::JobStatus& status) {
  auto file = model_io::ReadSafetensors(status.model_path());
  EXPECT_TRUE(file.ok()) << status.model_path() << ": " << file.status();
  return file.ok() ? file->tensors : std::vector<model_io::TensorData>();
}

// The two jobs' final models are the same, tensor by tensor, bit for bit.
inline void ExpectSameModel(const v1::JobStatus& a, const v1::JobStatus& b) {
  const auto x = ReadModel(a);
  const auto y = ReadModel(b);
  ASSERT_FALSE(x.empty());
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(x[i].name, y[i].name);
    EXPECT_TRUE(x[i].data == y[i].data) << x[i].name << " differs between " << a.job_id()
                                        << " and " << b.job_id();
  }
}

// `a`'s final model is `reference`'s up to the order of float sums: every tensor's largest
// difference is below `rel_tolerance` times the tensor's largest magnitude. Not compared: the
// key bias (the middle third of a GPT block's qkvb), whose exact gradient is zero (softmax
// ignores a shift shared by every key), so what the sums leave there is rounding noise that
// AdamW normalises into steps of up to the learning rate in either run.
inline void ExpectModelsClose(const v1::JobStatus& a, const v1::JobStatus& reference,
                              double rel_tolerance) {
  const auto x = ReadModel(a);
  const auto y = ReadModel(reference);
  ASSERT_FALSE(y.empty());
  ASSERT_EQ(x.size(), y.size());
  for (size_t t = 0; t < y.size(); ++t) {
    ASSERT_EQ(x[t].name, y[t].name);
    ASSERT_EQ(x[t].data.size(), y[t].data.size()) << y[t].name;
    const size_t n = y[t].data.size();
    const bool key_bias = absl::EndsWith(y[t].name, ".qkvb");
    double diff = 0, scale = 1e-12;
    for (size_t i = 0; i < n; ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(y[t].data[i])));
      if (key_bias && i >= n / 3 && i < 2 * n / 3) continue;
      diff = std::max(diff, std::abs(static_cast<double>(x[t].data[i]) - y[t].data[i]));
    }
    EXPECT_LT(diff / scale, rel_tolerance) << y[t].name << ": " << a.job_id() << " against "
                                           << reference.job_id();
  }
}

class Cluster {
 public:
  explicit Cluster(const std::string& dir, int workers = 2) : dir_(dir), num_workers_(workers) {}

  // Starts every process (call it again after KillEverything to restart them all).
  void Start() {
    ASSERT_NO_FATAL_FAILURE(StartServices());
    for (int i = 0; i < num_workers_; ++i) ASSERT_NO_FATAL_FAILURE(StartWorker(i));
  }
  // The coordinator and checkpointd only: the test starts the workers (StartWorker).
  void StartServices() {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(0));
    ASSERT_NO_FATAL_FAILURE(StartCheckpointd(0));
    workers_.clear();
  }

  // Worker i (cpu:i); without `checkpointd` it is given none (--checkpointd=none).
  void StartWorker(int i, bool checkpointd = true) {
    auto w = Subprocess::Start(
        {BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
         absl::StrCat("--device=cpu:", i), "--host=node",
         "--checkpointd=" + (!checkpointd                ? std::string("none")
                             : checkpointd_dial_.empty() ? checkpointd_->address()
                                                         : checkpointd_dial_),
         "--output-dir=" + dir_ + "/models", "--metrics-address=none"},
        absl::StrCat(dir_, "/worker", i, ".log"));
    ASSERT_TRUE(w.ok());
    if (static_cast<int>(workers_.size()) <= i) workers_.resize(i + 1);
    workers_[i] = std::move(*w);
  }

  void KillEverything() {
    for (auto& w : workers_) w->Signal(SIGKILL);
    checkpointd_->process().Signal(SIGKILL);
    coordinator_->process().Signal(SIGKILL);
    for (auto& w : workers_) (void)w->Wait(absl::Seconds(10));
    (void)checkpointd_->process().Wait(absl::Seconds(10));
    (void)coordinator_->process().Wait(absl::Seconds(10));
    workers_.clear();
  }

  // SIGKILLs the coordinator and starts it again on the same port and state: the workers keep
  // running and find it again.
  // SIGKILLs the coordinator and, `down` later, starts it again on the same port and data.
  void RestartCoordinator(absl::Duration down = absl::ZeroDuration()) {
    const int port = coordinator_->port();
    coordinator_->process().Signal(SIGKILL);
    (void)coordinator_->process().Wait(absl::Seconds(10));
    absl::SleepFor(down);
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(port));
  }

  // SIGKILLs checkpointd; RestartCheckpointd starts it again on the same port and data.
  void KillCheckpointd() {
    checkpointd_->process().Signal(SIGKILL);
    (void)checkpointd_->process().Wait(absl::Seconds(10));
  }
  void RestartCheckpointd() { ASSERT_NO_FATAL_FAILURE(StartCheckpointd(checkpointd_->port())); }

  Subprocess& worker(int i) { return *workers_[i]; }
  // The index of the worker process registered as `worker_id` ("node/cpu<i>").
  static int WorkerIndex(const std::string& worker_id) {
    int i = -1;
    const size_t at = worker_id.rfind("cpu");
    if (at == std::string::npos || !absl::SimpleAtoi(worker_id.substr(at + 3), &i)) return -1;
    return i;
  }

  CoordinatorClient& client() { return *client_; }
  const std::string& checkpointd_address() const { return checkpointd_->address(); }
  int checkpointd_port() const { return checkpointd_->port(); }
  // The checkpointd address workers started from now on dial; empty: checkpointd's own (a
  // test puts a TcpProxy in front of it here).
  void set_checkpointd_dial(const std::string& address) { checkpointd_dial_ = address; }
  // checkpointd's database (CheckpointdProcess keeps it under <its dir>/db), known before the
  // cluster is made for a test that mounts something there.
  static std::string CheckpointDirUnder(const std::string& dir) {
    return dir + "/checkpointd/db";
  }
  std::string checkpoint_dir() const { return CheckpointDirUnder(dir_); }

  v1::JobStatus Status(const std::string& id) {
    auto job = client_->GetJob(id);
    return job.ok() ? job->status() : v1::JobStatus();
  }

  bool WaitFor(const std::string& id, v1::JobState state, absl::Duration timeout) {
    return Eventually([&] { return Status(id).state() == state; }, timeout);
  }

  std::string Logs() {
    std::string all = ReadFile(coordinator_->log_path());
    for (int i = 0; i < num_workers_; ++i) {
      const std::string f = absl::StrCat("/worker", i, ".log");
      absl::StrAppend(&all, "\n--- ", f, "\n", ReadFile(dir_ + f));
    }
    // Every run's log: a restart's goes to a file of its own.
    std::vector<std::string> logs;
    std::error_code none_yet;  // checkpointd may not have been started
    for (const auto& entry :
         std::filesystem::directory_iterator(dir_ + "/checkpointd", none_yet)) {
      if (entry.path().extension() == ".log") logs.push_back(entry.path().string());
    }
    std::sort(logs.begin(), logs.end());
    for (const std::string& log : logs) absl::StrAppend(&all, "\n--- ", log, "\n", ReadFile(log));
    return all;
  }

 private:
  void StartCheckpointd(int port) {
    auto ck = CheckpointdProcess::Start(dir_ + "/checkpointd", BinDir(), port);
    ASSERT_TRUE(ck.ok()) << ck.status();
    checkpointd_ = std::move(*ck);
  }

  void StartCoordinator(int port) {
    auto cp = CoordinatorProcess::Start(dir_ + "/coordinator", {"--tick-interval-ms=50"},
                                        BinDir(), port);
    ASSERT_TRUE(cp.ok()) << cp.status();
    coordinator_ = std::move(*cp);
    client_ = std::make_unique<CoordinatorClient>(coordinator_->address());
  }

  std::string dir_;
  int num_workers_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<CheckpointdProcess> checkpointd_;
  std::vector<std::unique_ptr<Subprocess>> workers_;
  std::unique_ptr<CoordinatorClient> client_;
  std::string checkpointd_dial_;
};

// Runs `spec` on a fresh Cluster of `workers` workers under `dir` without interrupting it, and
// stops the cluster; the job's final status, which the test expects to be SUCCEEDED within
// `timeout` (a long job on a loaded 2-core machine needs more than the default).
inline v1::JobStatus RunUninterrupted(const std::string& dir, int workers,
                                      const v1::JobSpec& spec,
                                      absl::Duration timeout = absl::Seconds(120)) {
  Cluster cluster(dir, workers);
  cluster.Start();
  if (::testing::Test::HasFatalFailure()) return v1::JobStatus();
  auto job = cluster.client().SubmitJob(spec);
  if (!job.ok()) {
    ADD_FAILURE() << job.status();
    return v1::JobStatus();
  }
  EXPECT_TRUE(cluster.WaitFor(job->job_id(), v1::SUCCEEDED, timeout)) << cluster.Logs();
  const v1::JobStatus status = cluster.Status(job->job_id());
  cluster.KillEverything();
  return status;
}

}  // namespace weft::testing

#endif  // WEFT_TESTS_WORKER_CLUSTER_H_
