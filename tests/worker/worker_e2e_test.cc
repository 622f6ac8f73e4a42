// weft-worker end to end: a real coordinator and real worker processes on 127.0.0.1 train a
// job (also with hybrid sharding over two simulated hosts, from a uint32 token file, from a
// prepared dataset with sequential sampling, and from text through trainctl's tokenizer and
// dataset commands to a text sample), fail it cleanly on bad data and on a model too big for
// the host's memory, survive a rank killed mid-collective without hanging, and stop on cancel.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator_client.h"
#include "common/crc32c.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/worker/cluster.h"
#include "worker/data/manifest.h"
#include "worker/data/tokenizer.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using testing::Eventually;
using ::testing::HasSubstr;

class WorkerE2eTest : public testing::WorkersTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(testing::SentenceCorpus(2000)));
  }

  // `n` workers, on host "node" or, with `per_host`, on simulated hosts "a", "b", ... (host
  // name and host id) of `per_host` each.
  void StartWorkers(int n, int per_host = 0) {
    for (int i = 0; i < n; ++i) ASSERT_NO_FATAL_FAILURE(StartNextWorker(per_host));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    for (auto& w : workers_) ASSERT_TRUE(w->Running()) << "a worker exited at startup\n" << Logs();
  }

  // The next of StartWorkers' workers (cpu:<number started so far>).
  void StartNextWorker(int per_host = 0) {
    const size_t i = workers_.size();
    const std::string host =
        per_host > 0 ? std::string(1, static_cast<char>('a' + i / per_host)) : "node";
    std::vector<std::string> flags = {
        "--collective-timeout-ms=20000", "--metrics-address=127.0.0.1:0",
        "--metrics-port-file=" + dir_.File(absl::StrCat("metrics", i, ".port"))};
    if (per_host > 0) flags.push_back("--host-id=" + host);
    ASSERT_NO_FATAL_FAILURE(StartWorker(absl::StrCat("cpu:", i), flags, host));
  }

  // `spec_text` written to a file and submitted with `trainctl submit`, as a user does; the
  // job's id once it SUCCEEDED (a failure is reported, with the workers' logs).
  void SubmitWithTrainctlAndWait(const std::string& spec_text, std::string* job_id,
                                 v1::JobStatus* status) {
    testing::WriteFile(dir_.File("job.pb.txt"), spec_text);
    auto submitted = testing::RunCommand(
        {testing::BinDir() + "/trainctl", "--coordinator=" + coordinator_->address(), "submit",
         dir_.File("job.pb.txt")},
        {}, absl::Seconds(30));
    ASSERT_EQ(submitted.exit_code, 0) << submitted.err;
    *job_id = std::string(absl::StripAsciiWhitespace(submitted.out));
    *status = WaitForEnd(*job_id, absl::Seconds(180));
    ASSERT_EQ(status->state(), v1::SUCCEEDED) << status->DebugString() << Logs();
  }

  v1::JobSpec Spec(int64_t steps) {
    auto spec = ParseJobSpecText(absl::StrCat(R"pb(
      name: "e2e"
      model { num_layers: 2 hidden_size: 32 num_heads: 2 vocab_size: 256 context_length: 32 }
      data { format: DATA_FORMAT_TEXT_BYTES val_fraction: 0.1 train_path: ")pb", corpus_,
                                              R"pb(" }
      optimizer { learning_rate: 0.01 }
      lr_schedule { warmup_steps: 5 }
      training { micro_batch_size: 4 val_interval_steps: 20 seed: 3 total_steps: )pb",
                                              steps, R"pb( }
      zero_stage: 3
      resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
      fault { heartbeat_interval_ms: 200 heartbeat_timeout_ms: 1500 max_restarts: 0 }
    )pb"),
                                 "e2e");
    EXPECT_TRUE(spec.ok()) << spec.status();
    return *spec;
  }

  // `trainctl sample` continues a prompt with the finished job's model.
  void ExpectModelSamples(const std::string& job_id) {
    auto sample = testing::RunCommand({testing::BinDir() + "/trainctl",
                                       "--coordinator=" + coordinator_->address(), "sample",
                                       job_id, "--prompt=the cat", "--tokens=40",
                                       "--temperature=0"});
    EXPECT_EQ(sample.exit_code, 0) << sample.err;
    EXPECT_THAT(sample.out, ::testing::StartsWith("the cat"));
    EXPECT_GE(sample.out.size(), 40u);
  }

  // Submits `spec` and expects the job to fail without a restart, its error holding each of
  // `fragments`.
  void ExpectFailsWithoutRestart(const v1::JobSpec& spec,
                                 const std::vector<std::string>& fragments) {
    auto submitted = client_->SubmitJob(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(30));
    EXPECT_EQ(s.state(), v1::FAILED) << Logs();
    for (const std::string& fragment : fragments) EXPECT_THAT(s.error(), HasSubstr(fragment));
    EXPECT_EQ(s.restarts(), 0);
  }

  bool AllWorkersIdle(size_t expected) {
    auto workers = client_->ListWorkers();
    if (!workers.ok() || workers->size() != expected) return false;
    for (const auto& w : *workers) {
      if (w.state() != v1::WORKER_IDLE) return false;
    }
    return true;
  }
};

TEST_F(WorkerE2eTest, TwoWorkersTrainToCompletionAndTheModelSamples) {
  StartWorkers(2);
  auto submitted = client_->SubmitJob(Spec(60));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(180));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.DebugString() << Logs();
  EXPECT_EQ(s.step(), 60);
  // From ln(256) = 5.5 at the start to well under 3 on this repetitive text.
  EXPECT_LT(s.last_metrics().loss(), 3.0) << s.last_metrics().DebugString();
  EXPECT_GT(s.last_metrics().val_loss(), 0.0);
  EXPECT_GT(s.last_metrics().tokens_per_s(), 0.0);
  EXPECT_GT(s.last_metrics().state_bytes(), 0);
  EXPECT_EQ(s.model_host(), "node");
  ASSERT_FALSE(s.model_path().empty());
  // The CPU engine's memory plan, as the GPU's is: what AUTO chose and why.
  std::string plan;
  for (const auto& e : s.events()) {
    if (e.type() == v1::MEMORY_PLANNED) plan = e.message();
  }
  EXPECT_THAT(plan, HasSubstr("activation checkpointing none (chosen by AUTO)"));
  EXPECT_THAT(plan, HasSubstr("per rank of"));

  ExpectModelSamples(submitted->job_id());
  EXPECT_TRUE(Eventually([&] { return AllWorkersIdle(2); }, absl::Seconds(10)));

  // Each worker's own Prometheus endpoint saw every step.
  for (int i = 0; i < 2; ++i) {
    auto port = testing::WaitForFile(dir_.File(absl::StrCat("metrics", i, ".port")),
                                     absl::Seconds(5));
    ASSERT_TRUE(port.ok());
    auto body = testing::HttpGet(
        absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*port)), "/metrics");
    ASSERT_TRUE(body.ok()) << body.status();
    const std::string id = absl::StrCat("node/cpu", i);
    EXPECT_THAT(*body, HasSubstr(absl::StrCat("weft_worker_steps_total{worker_id=\"", id,
                                              "\"} 60")));
    EXPECT_THAT(*body, HasSubstr("weft_worker_step_phase_seconds{phase=\"exposed_comm\""));
    EXPECT_THAT(*body, HasSubstr(absl::StrCat("weft_worker_generation_runs_total{outcome=\"completed\",worker_id=\"", id, "\"} 1")));
  }
}

// Every connection from the workers to the coordinator (their sessions, heartbeats, store
// calls and step reports) reset at once mid-training while every process lives, as a network
// blip or a restarted proxy does: the heartbeats see "Connection reset by peer" and go again,
// the sessions reconnect within their grace, and the job finishes without a restart.
TEST_F(WorkerE2eTest, ConnectionsToTheCoordinatorResetMidTrainingCostNoRestart) {
  auto proxy = testing::TcpProxy::Start(coordinator_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  workers_dial_ = (*proxy)->address();
  StartWorkers(2);
  v1::JobSpec spec = Spec(400);
  spec.mutable_fault()->set_max_restarts(2);
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_TRUE(WaitForStep(submitted->job_id(), 20, absl::Seconds(60))) << Logs();
  (*proxy)->CutAll();
  auto at_cut = client_->GetJob(submitted->job_id());
  ASSERT_TRUE(at_cut.ok()) << at_cut.status();
  ASSERT_LT(at_cut->status().step(), 400) << "the reset must come mid-training";
  EXPECT_GE((*proxy)->cuts(), 2) << "every worker's connection must have been reset";
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(120));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.DebugString() << Logs();
  EXPECT_EQ(s.step(), 400);
  EXPECT_EQ(s.restarts(), 0) << s.DebugString() << Logs();
  EXPECT_GE((*proxy)->accepted(), 4) << "both workers must have come back over new connections";
}

// A rendezvous whose members lose their connections to the coordinator: worker 1's JoinJob
// is lost with the heartbeat answer that carried it, and worker 0's Join is reset while the
// coordinator holds it for worker 1. Worker 1, back, heartbeats without a job and gets its
// JoinJob again; worker 0's Join goes again; the generation forms and the job finishes with no
// restart. Idle heartbeats are held for minutes here, so the only response worker 1's
// connection carries after the submit is the one with its JoinJob; worker 1's new connections
// are held until worker 0's Join has been cut, so the two losses overlap every time.
class WorkerRendezvousE2eTest : public WorkerE2eTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(StartCoordinator(
        testing::SentenceCorpus(2000),
        {"--heartbeat-interval-ms=600000", "--heartbeat-timeout-ms=600001",
         "--connection-lost-grace-ms=5000"}));
  }
};

TEST_F(WorkerRendezvousE2eTest, ConnectionsResetDuringTheRendezvousCostNoRestart) {
  std::vector<std::unique_ptr<testing::TcpProxy>> links;
  for (int i = 0; i < 2; ++i) {
    auto proxy = testing::TcpProxy::Start(coordinator_->port());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    workers_dial_ = (*proxy)->address();
    links.push_back(std::move(*proxy));
    ASSERT_NO_FATAL_FAILURE(StartNextWorker());
  }
  ASSERT_TRUE(Eventually([&] { return AllWorkersIdle(2); }, absl::Seconds(30))) << Logs();
  v1::JobSpec spec = Spec(40);
  spec.mutable_fault()->set_heartbeat_timeout_ms(10000);
  // Worker 1's next connection waits until the test lets it through.
  links[1]->HoldNewConnections(true);
  links[1]->CutOnNextGrpcResponse();
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  ASSERT_TRUE(Eventually([&] { return links[1]->cuts() == 1; }, absl::Seconds(10)))
      << "worker 1's JoinJob answer was never cut\n" << Logs();
  // Worker 0 joined and waits at the coordinator for worker 1, which cannot come back yet.
  ASSERT_TRUE(Eventually(
      [&] {
        auto job = client_->GetJob(submitted->job_id());
        return job.ok() && job->status().awaiting_join_size() == 1 &&
               job->status().awaiting_join(0) == "node/cpu1";
      },
      absl::Seconds(10)))
      << Logs();
  links[0]->CutAll();
  EXPECT_GE(links[0]->cuts(), 1);
  EXPECT_EQ(links[1]->accepted(), 1) << "worker 1 must not have come back before now";
  links[1]->HoldNewConnections(false);

  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(120));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.DebugString() << Logs();
  EXPECT_EQ(s.step(), 40);
  EXPECT_EQ(s.restarts(), 0) << s.DebugString() << Logs();
  EXPECT_EQ(s.generation(), 1);
  EXPECT_THAT(testing::ReadFile(coordinator_->log_path()),
              HasSubstr("worker node/cpu1 heartbeats without a job"));
  EXPECT_GE(links[0]->accepted(), 2) << "worker 0 came back over a new connection";
  EXPECT_GE(links[1]->accepted(), 2) << "worker 1 came back over a new connection";
}

// The same job on a Llama (grouped-query attention, untied head): it trains through the real
// services on CPU workers and its model samples.
TEST_F(WorkerE2eTest, TwoWorkersTrainATinyLlamaAndItSamples) {
  StartWorkers(2);
  v1::JobSpec spec = Spec(60);
  v1::ModelSpec* m = spec.mutable_model();
  m->set_architecture(v1::LLAMA);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_intermediate_size(64);
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(180));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.DebugString() << Logs();
  EXPECT_EQ(s.step(), 60);
  EXPECT_LT(s.last_metrics().loss(), 3.0) << s.last_metrics().DebugString();
  ExpectModelSamples(submitted->job_id());
}

// Hybrid sharding over two simulated hosts of two workers each: ZeRO-3 within a host,
// replicated across the two (Gloo over loopback either way). The job succeeds, and its model
// is the full-sharding job's on the same four workers and batches up to float summation order.
TEST_F(WorkerE2eTest, HostShardingOverTwoHostsTrainsLikeFullSharding) {
  StartWorkers(4, /*per_host=*/2);
  std::vector<v1::JobStatus> ended;
  for (const bool hybrid : {true, false}) {
    v1::JobSpec spec = Spec(30);
    spec.mutable_resources()->set_min_workers(4);
    spec.mutable_resources()->set_max_workers(4);
    if (hybrid) spec.mutable_sharding()->set_scope(v1::ShardingSpec::HOST);
    auto submitted = client_->SubmitJob(spec);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    ended.push_back(WaitForEnd(submitted->job_id(), absl::Seconds(180)));
    ASSERT_EQ(ended.back().state(), v1::SUCCEEDED) << ended.back().DebugString() << Logs();
    EXPECT_TRUE(Eventually([&] { return AllWorkersIdle(4); }, absl::Seconds(10)));
  }
  EXPECT_THAT(Logs(), HasSubstr("hybrid sharding, 2 replicas of 2 ranks"));
  EXPECT_NEAR(ended[0].last_metrics().loss(), ended[1].last_metrics().loss(),
              1e-4 * ended[1].last_metrics().loss());
  // Float rounding of the gradient sums only: measured at most 1.1e-5 of a tensor's scale.
  testing::ExpectModelsClose(ended[0], ended[1], 1e-4);
}

// HOST scope over hosts of unequal size: the generation fails naming every host's rank count
// (not permanently, but this job allows no restart).
TEST_F(WorkerE2eTest, HostShardingOverUnevenHostsFailsNamingTheirCounts) {
  StartWorkers(3, /*per_host=*/2);
  v1::JobSpec spec = Spec(10);
  spec.mutable_resources()->set_min_workers(3);
  spec.mutable_sharding()->set_scope(v1::ShardingSpec::HOST);
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(60));
  EXPECT_EQ(s.state(), v1::FAILED) << Logs();
  EXPECT_THAT(s.error(), HasSubstr("sharding.scope HOST needs every host"));
  EXPECT_THAT(s.error(), HasSubstr("ranks by host: a=2, b=1"));
}

TEST_F(WorkerE2eTest, BadDataFilesFailTheJobWithTheFileNamedAndNoRestart) {
  StartWorkers(2);
  struct Case {
    std::string name;
    std::string contents;  // empty name: the file does not exist
    std::string expected;
  };
  testing::WriteFile(dir_.File("short.txt"), "tiny");
  testing::WriteFile(dir_.File("empty.txt"), "");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir_.File("missing.txt"), "missing.txt"},
      {dir_.File("empty.txt"), "empty.txt"},
      {dir_.File("short.txt"), "short.txt"},
  };
  for (const auto& [path, fragment] : cases) {
    v1::JobSpec spec = Spec(10);
    spec.mutable_fault()->set_max_restarts(3);  // a permanent error must not use them
    spec.mutable_data()->set_train_path(path);
    auto submitted = client_->SubmitJob(spec);
    ASSERT_TRUE(submitted.ok());
    const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(30));
    EXPECT_EQ(s.state(), v1::FAILED) << fragment << "\n" << Logs();
    EXPECT_THAT(s.error(), HasSubstr(fragment));
    EXPECT_THAT(s.error(), HasSubstr("permanent"));
    EXPECT_EQ(s.restarts(), 0);
    ASSERT_TRUE(Eventually([&] { return AllWorkersIdle(2); }, absl::Seconds(10))) << Logs();
  }
  // A uint16 token file with a token outside the vocabulary.
  {
    std::ofstream bin(dir_.File("tokens.bin"), std::ios::binary);
    int32_t header[256] = {20240520, 1, 200};
    bin.write(reinterpret_cast<const char*>(header), sizeof(header));
    for (uint16_t i = 0; i < 200; ++i) {
      const uint16_t token = i == 150 ? 999 : i % 50;
      bin.write(reinterpret_cast<const char*>(&token), 2);
    }
  }
  v1::JobSpec spec = Spec(10);
  spec.mutable_data()->set_train_path(dir_.File("tokens.bin"));
  spec.mutable_data()->set_format(v1::DATA_FORMAT_UINT16_BIN);
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok());
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(30));
  EXPECT_EQ(s.state(), v1::FAILED);
  EXPECT_THAT(s.error(), HasSubstr("tokens.bin"));
  EXPECT_THAT(s.error(), HasSubstr("999"));
}

// A CPU job far too big for the host (GPT-2 at 19B parameters: 164 GB of state a rank at
// stage 3 over two) is refused by the CPU engine's memory plan before any worker allocates: the
// job fails within seconds, its error naming the bytes by part and the memory available, with
// no restart; no worker is killed by the kernel for memory, and both are idle again.
TEST_F(WorkerE2eTest, ACpuJobTooBigForTheHostFailsAtOnceNamingTheBytes) {
  StartWorkers(2);
  v1::JobSpec spec = Spec(10);
  spec.mutable_model()->set_num_layers(24);
  spec.mutable_model()->set_hidden_size(8192);
  spec.mutable_model()->set_num_heads(64);
  spec.mutable_fault()->set_max_restarts(3);  // a permanent error must not use them
  const absl::Time start = absl::Now();
  ExpectFailsWithoutRestart(
      spec, {"host memory: the job needs", "GiB (parameter/optimizer state ",
             "per rank at ZeRO stage 3 over 2 ranks", "available to each of the job's 2 ranks "
             "on this host (MemAvailable", "permanent"});
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
  for (auto& w : workers_) EXPECT_TRUE(w->Running()) << Logs();
  EXPECT_TRUE(Eventually([&] { return AllWorkersIdle(2); }, absl::Seconds(10))) << Logs();
}

// A learning rate of 1e38 makes every step after the first overflow: its gradient is NaN, the
// step is skipped, and with fault.max_skipped_steps 2 the third such step fails the job for
// good (restarts left unused: a resumed job would replay the same steps), naming what to
// change. No step's state reached the weights: the last reported grad norm is not finite, the
// first one was.
TEST_F(WorkerE2eTest, AGradientThatStaysNonFiniteFailsTheJobWithoutARestart) {
  StartWorkers(2);
  v1::JobSpec spec = Spec(20);
  spec.mutable_optimizer()->set_learning_rate(1e38);
  spec.mutable_lr_schedule()->set_warmup_steps(0);
  spec.mutable_lr_schedule()->set_kind(v1::LrSchedule::CONSTANT);
  spec.mutable_fault()->set_max_skipped_steps(2);
  spec.mutable_fault()->set_max_restarts(3);  // a permanent error must not use them
  ExpectFailsWithoutRestart(spec, {"not finite", "3 steps in a row (2-4)",
                                   "fault.max_skipped_steps allows 2", "permanent"});
}

// llm.c's Llama-3 token file: the same 1 KiB header as the uint16 one, then uint32 ids.
void WriteUint32Tokens(const std::string& path, const std::vector<uint32_t>& ids) {
  std::ofstream bin(path, std::ios::binary);
  int32_t header[256] = {20240801, 7, static_cast<int32_t>(ids.size())};
  bin.write(reinterpret_cast<const char*>(header), sizeof(header));
  bin.write(reinterpret_cast<const char*>(ids.data()), 4 * ids.size());
}

TEST_F(WorkerE2eTest, Uint32TokenFileTrainsAndAnIdPastTheVocabularyFailsNamingIt) {
  StartWorkers(2);
  // A vocabulary past uint16, and ids that need the upper half: 65536 + a cycle of 64.
  constexpr int kVocab = 70000;
  std::vector<uint32_t> ids(3000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 65536 + i % 64;
  WriteUint32Tokens(dir_.File("llama.bin"), ids);
  v1::JobSpec spec = Spec(20);
  spec.mutable_model()->set_vocab_size(kVocab);
  spec.mutable_model()->set_padded_vocab_size(0);
  spec.mutable_data()->set_train_path(dir_.File("llama.bin"));
  spec.mutable_data()->set_format(v1::DATA_FORMAT_UINT32_BIN);
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(120));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.DebugString() << Logs();
  EXPECT_EQ(s.step(), 20);
  // Below a uniform guess over the vocabulary (ln 70000 = 11.2): the ids were learned from.
  EXPECT_LT(s.last_metrics().loss(), std::log(kVocab) - 1.0) << s.last_metrics().DebugString();
  ASSERT_TRUE(Eventually([&] { return AllWorkersIdle(2); }, absl::Seconds(10))) << Logs();

  ids[2900] = kVocab;  // in the held-out validation tail: still refused at start
  WriteUint32Tokens(dir_.File("bad-llama.bin"), ids);
  spec.mutable_data()->set_train_path(dir_.File("bad-llama.bin"));
  ExpectFailsWithoutRestart(spec, {"bad-llama.bin: token 70000 at token index 2900",
                                   "model.vocab_size is 70000"});
}

// A prepared dataset (worker/data/manifest.h) of byte tokens in uint16 shards: `train` shards
// from the corpus's first 90% and one val shard from the rest.
std::string WritePreparedDataset(const std::string& dir, const std::string& text, int train) {
  data::DatasetManifest m;
  m.token_format = v1::DATA_FORMAT_UINT16_BIN;
  m.tokenizer = {"bytes", "", 0, 256, -1, -1};
  m.document_separator = "none";
  const size_t val_begin = text.size() * 9 / 10;
  auto add = [&](const std::string& file, size_t begin, size_t end,
                 std::vector<data::ManifestShard>* split) {
    std::string bytes(1024 + 2 * (end - begin), '\0');
    const int32_t header[3] = {20240520, 1, static_cast<int32_t>(end - begin)};
    std::memcpy(bytes.data(), header, sizeof(header));
    for (size_t i = begin; i < end; ++i) {
      bytes[1024 + 2 * (i - begin)] = text[i];
    }
    testing::WriteFile(dir + "/" + file, bytes);
    split->push_back({file, static_cast<int64_t>(end - begin), static_cast<int64_t>(bytes.size()),
                      Crc32c(bytes.data(), bytes.size())});
  };
  for (int k = 0; k < train; ++k) {
    add(absl::StrCat("train-", k, ".bin"), val_begin * k / train, val_begin * (k + 1) / train,
        &m.train);
  }
  add("val-0.bin", val_begin, text.size(), &m.val);
  const absl::Status written = data::WriteManifest(m, dir);
  EXPECT_TRUE(written.ok()) << written;
  return dir;
}

TEST_F(WorkerE2eTest, PreparedDatasetTrainsSequentiallyAndAChangedShardFailsNamingIt) {
  StartWorkers(2);
  const std::string dir = WritePreparedDataset(dir_.path(), testing::ReadFile(corpus_), 3);
  v1::JobSpec spec = Spec(40);
  spec.mutable_data()->Clear();
  spec.mutable_data()->set_manifest_path(dir);
  spec.mutable_data()->set_sampling(v1::DataSpec::SEQUENTIAL);
  auto submitted = client_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(180));
  ASSERT_EQ(s.state(), v1::SUCCEEDED) << s.DebugString() << Logs();
  EXPECT_EQ(s.step(), 40);
  // Learned from (a uniform guess is ln 256 = 5.5), and validated on the val shard.
  EXPECT_LT(s.last_metrics().loss(), 4.0) << s.last_metrics().DebugString();
  EXPECT_GT(s.last_metrics().val_loss(), 0.0);
  ASSERT_TRUE(Eventually([&] { return AllWorkersIdle(2); }, absl::Seconds(10))) << Logs();

  // The same size, one token changed: only the checksum can tell, and it does, at start.
  const std::string shard = dir + "/train-1.bin";
  std::string bytes = testing::ReadFile(shard);
  bytes[1024 + 100] ^= 1;
  testing::WriteFile(shard, bytes);
  spec.mutable_fault()->set_max_restarts(3);  // a permanent error must not use them
  ExpectFailsWithoutRestart(
      spec, {"train-1.bin: shard changed after its manifest was written", "permanent"});
}

// The whole path a user takes, with the real commands: a SentencePiece tokenizer trained on a
// folder of text, the text prepared into a dataset, the job submitted on its manifest, and
// `trainctl sample` answering a text prompt in text.
TEST_F(WorkerE2eTest, TextToTokenizerToDatasetToJobToTextSample) {
  StartWorkers(2);
  const std::string trainctl = testing::BinDir() + "/trainctl";
  const std::string coordinator = "--coordinator=" + coordinator_->address();
  // Documents of 50 lines each between "%" lines, so that some are held out for validation.
  std::string text;
  const std::string sentences = testing::SentenceCorpus(2000);
  size_t line = 0;
  for (size_t begin = 0, end; begin < sentences.size(); begin = end + 1, ++line) {
    end = sentences.find('\n', begin);
    if (line > 0 && line % 50 == 0) text += "%\n";
    text += sentences.substr(begin, end - begin + 1);
  }
  testing::WriteFile(dir_.File("text.txt"), text);
  const std::string model = dir_.File("tok.model");
  const std::string dataset = dir_.File("dataset");
  for (const std::vector<std::string>& argv :
       {std::vector<std::string>{trainctl, "data", "train-tokenizer", "--out", model,
                                 "--vocab-size", "300", "--doc-separator", "%",
                                 dir_.File("text.txt")},
        std::vector<std::string>{trainctl, "data", "prepare", "--out", dataset, "--tokenizer",
                                 model, "--doc-separator", "%", "--val-fraction", "0.1", "-q",
                                 dir_.File("text.txt")}}) {
    auto ran = testing::RunCommand(argv, {}, absl::Seconds(60));
    ASSERT_EQ(ran.exit_code, 0) << argv[2] << ": " << ran.err;
  }
  std::string job_id;
  v1::JobStatus s;
  ASSERT_NO_FATAL_FAILURE(SubmitWithTrainctlAndWait(
      absl::StrCat(
          R"pb(
            name: "text-e2e"
            model { num_layers: 2 hidden_size: 32 num_heads: 2 vocab_size: 300 context_length: 32 }
            data { manifest_path: ")pb",
          dataset,
          R"pb(" sampling: SEQUENTIAL }
               optimizer { learning_rate: 0.01 }
               lr_schedule { warmup_steps: 5 }
               training { micro_batch_size: 4 val_interval_steps: 20 seed: 3 total_steps: 60 }
               resources { device_kind: DEVICE_KIND_CPU min_workers: 2 }
               fault { heartbeat_interval_ms: 200 heartbeat_timeout_ms: 1500 max_restarts: 0 }
          )pb"),
      &job_id, &s));

  const std::string prompt = "the old man";
  auto sample = testing::RunCommand({trainctl, coordinator, "sample", job_id, "--prompt", prompt,
                                     "--tokens=20", "--temperature=0"},
                                    {}, absl::Seconds(60));
  ASSERT_EQ(sample.exit_code, 0) << sample.err;
  ASSERT_THAT(sample.out, ::testing::StartsWith(prompt));
  const std::string continuation =
      std::string(absl::StripAsciiWhitespace(sample.out.substr(prompt.size())));
  EXPECT_FALSE(continuation.empty()) << sample.out;
  EXPECT_EQ(data::FindInvalidUtf8(sample.out), std::nullopt) << sample.out;
  // Text, not the token ids a model without a tokenizer prints: the corpus's letters.
  EXPECT_TRUE(std::any_of(continuation.begin(), continuation.end(),
                          [](char c) { return absl::ascii_isalpha(c); }))
      << sample.out;

  auto json = testing::RunCommand({trainctl, coordinator, "-o", "json", "sample", job_id,
                                   "--prompt", prompt, "--tokens=5"},
                                  {}, absl::Seconds(60));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_THAT(json.out, HasSubstr("\"tokenizer\": \"sentencepiece\""));

  // Python reads the model file's tokenizer back (examples/python/weft_model.py, standard
  // library only): the very .model the dataset was prepared with.
  auto python = testing::RunCommand(
      {"/usr/bin/python3", std::string(WEFT_SOURCE_DIR) + "/examples/python/weft_model.py",
       s.model_path(), "--tokenizer-out", dir_.File("from-model.model")},
      {}, absl::Seconds(30));
  ASSERT_EQ(python.exit_code, 0) << python.err;
  EXPECT_THAT(python.out, HasSubstr("\"kind\": \"sentencepiece\""));
  EXPECT_EQ(testing::ReadFile(dir_.File("from-model.model")),
            testing::ReadFile(dataset + "/tokenizer.model"));
}

// Chat data end to end: conversations prepared with --chat, a job trained on them, and its
// model file recording the template, so that `trainctl sample --chat` answers without
// --template.
TEST_F(WorkerE2eTest, ChatDatasetToJobToChatSampleWithTheRecordedTemplate) {
  StartWorkers(1);
  const std::string trainctl = testing::BinDir() + "/trainctl";
  const std::string coordinator = "--coordinator=" + coordinator_->address();
  const std::string fixtures = std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/chat/";
  const std::string dataset = dir_.File("chat");
  auto prepared = testing::RunCommand(
      {trainctl, "data", "prepare", "--chat", "--template", "chatml", "--out", dataset,
       "--tokenizer", fixtures + "chatml.tokenizer.json", "--val-fraction", "0", "-q",
       fixtures + "conversations.jsonl"},
      {}, absl::Seconds(60));
  ASSERT_EQ(prepared.exit_code, 0) << prepared.err;
  std::string job_id;
  v1::JobStatus s;
  ASSERT_NO_FATAL_FAILURE(SubmitWithTrainctlAndWait(
      absl::StrCat(
          R"pb(
            name: "chat-e2e"
            model { num_layers: 1 hidden_size: 32 num_heads: 2 vocab_size: 576 context_length: 128 }
            data { manifest_path: ")pb",
          dataset,
          R"pb(" }
               optimizer { learning_rate: 0.01 }
               training { micro_batch_size: 2 seed: 3 total_steps: 4 }
               resources { device_kind: DEVICE_KIND_CPU min_workers: 1 }
               fault { heartbeat_interval_ms: 200 heartbeat_timeout_ms: 1500 max_restarts: 0 }
          )pb"),
      &job_id, &s));

  auto model = model_io::LoadModel(s.model_path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->chat_template, "chatml");
  auto sample = testing::RunCommand({trainctl, coordinator, "-o", "json", "sample", job_id,
                                     "--chat", "--tokens=4", "What is 2+2?"},
                                    {}, absl::Seconds(60));
  ASSERT_EQ(sample.exit_code, 0) << sample.err;
  EXPECT_THAT(sample.out, HasSubstr("\"template\": \"chatml\""));
  EXPECT_THAT(sample.out, HasSubstr("\"tokenizer\": \"tokenizer.json\""));
}

TEST_F(WorkerE2eTest, RankKilledMidTrainingFailsTheJobAndTheSurvivorDoesNotHang) {
  StartWorkers(2);
  auto submitted = client_->SubmitJob(Spec(100000));
  ASSERT_TRUE(submitted.ok());
  ASSERT_TRUE(WaitForStep(submitted->job_id(), 3, absl::Seconds(60))) << Logs();
  workers_[1]->Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  const v1::JobStatus s = WaitForEnd(submitted->job_id(), absl::Seconds(30));
  EXPECT_EQ(s.state(), v1::FAILED) << Logs();
  EXPECT_THAT(s.error(), HasSubstr("node/cpu1"));
  // Declared dead after the 1.5 s heartbeat timeout, the survivor is told to abort its
  // collectives at once: back to idle long before the 20 s collective timeout.
  ASSERT_TRUE(Eventually(
      [&] {
        auto workers = client_->ListWorkers();
        if (!workers.ok()) return false;
        for (const auto& w : *workers) {
          if (w.info().worker_id() == "node/cpu0") return w.state() == v1::WORKER_IDLE;
        }
        return false;
      },
      absl::Seconds(15)))
      << Logs();
  // The coordinator's IDLE is bookkeeping; the worker's own log says when its run really
  // ended (its collectives returned).
  ASSERT_TRUE(Eventually(
      [&] {
        return absl::StrContains(testing::ReadFile(dir_.File("worker0.log")), ": aborted:");
      },
      absl::Seconds(15)))
      << Logs();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  EXPECT_TRUE(workers_[0]->Running());
}

// A device the worker cannot drive is refused at startup, naming it: an unknown kind, and a
// CUDA ordinal this host does not have (or any CUDA device, in a build without CUDA).
TEST_F(WorkerE2eTest, BadDeviceIsRefusedNamingIt) {
  for (const std::string device : {"tpu:0", "cpu:x", "cuda:64"}) {
    testing::CommandResult r = testing::RunCommand(
        {testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
         "--device=" + device, "--metrics-address=none"},
        {}, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 1) << device << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--device"));
    EXPECT_THAT(r.err, HasSubstr(device));
  }
  testing::CommandResult cuda = testing::RunCommand(
      {testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
       "--device=cuda:64", "--metrics-address=none"},
      {}, absl::Seconds(30));
  EXPECT_TRUE(absl::StrContains(cuda.err, "CUDA device(s)") ||
              absl::StrContains(cuda.err, "built without CUDA"))
      << cuda.err;
}

// What a worker states about its machine and its network reaches `trainctl workers`: the host
// id it was given (not its host name) and the NCCL variables it runs with, the inherited ones
// included; Gloo listens on the named interface's address.
TEST_F(WorkerE2eTest, WorkersShowTheirHostIdAndNetworkSettings) {
  std::vector<std::string> argv = {
      testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
      "--device=cpu:0", "--host=renamed-host", "--host-id=rack7-node3", "--net-interface=lo",
      "--nccl-socket-threads=4", "--nccl-env=NCCL_P2P_DISABLE=1", "--metrics-address=none"};
  auto worker = testing::Subprocess::Start(argv, dir_.File("worker0.log"),
                                           {{"NCCL_DEBUG", "WARN"}});
  ASSERT_TRUE(worker.ok()) << worker.status();
  workers_.push_back(std::move(*worker));
  testing::CommandResult table;
  ASSERT_TRUE(Eventually(
      [&] {
        table = testing::RunCommand(
            {testing::BinDir() + "/trainctl", "--coordinator=" + coordinator_->address(),
             "workers"},
            {}, absl::Seconds(30));
        return absl::StrContains(table.out, "renamed-host/cpu0");
      },
      absl::Seconds(20)))
      << table.out << table.err << Logs();
  EXPECT_THAT(table.out, HasSubstr("NETWORK"));
  EXPECT_THAT(table.out, HasSubstr("rack7-node3"));
  EXPECT_THAT(table.out, HasSubstr("127.0.0.1 NCCL_DEBUG=WARN NCCL_P2P_DISABLE=1 "
                                   "NCCL_SOCKET_IFNAME=lo NCCL_SOCKET_NTHREADS=4"));
}

// Network flags that cannot work stop the worker at startup, naming the flag and the reason.
TEST_F(WorkerE2eTest, BadNetworkFlagsAreRefusedNamingThem) {
  struct Case {
    std::string flag;
    std::string message;
  };
  for (const Case& c :
       {Case{"--net-interface=nosuchif0", "--net-interface: no network interface \"nosuchif0\""},
        Case{"--nccl-env=NCCL_DEBUG", "--nccl-env: \"NCCL_DEBUG\" is not NCCL_NAME=value"},
        Case{"--nccl-socket-threads=99", "--nccl-socket-threads: must be 1-16"},
        Case{"--data-address=198.18.255.254",
             "--data-address: cannot listen on \"198.18.255.254\""}}) {
    testing::CommandResult r = testing::RunCommand(
        {testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
         c.flag, "--metrics-address=none"},
        {}, absl::Seconds(30));
    EXPECT_EQ(r.exit_code, 1) << c.flag << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.flag;
  }
}

// MFU's denominator must be a number of TFLOP/s, never negative.
TEST_F(WorkerE2eTest, BadPeakTflopsIsRefusedNamingIt) {
  for (const std::string value : {"-1", "fast"}) {
    testing::CommandResult r = testing::RunCommand(
        {testing::BinDir() + "/weft-worker", "--coordinator=" + coordinator_->address(),
         "--peak-tflops=" + value, "--metrics-address=none"},
        {}, absl::Seconds(30));
    EXPECT_NE(r.exit_code, 0) << value << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--peak-tflops")) << value;
  }
}

// The worker's Prometheus endpoint answers scrape after scrape. Its serving threads have small
// fixed stacks from which glibc takes the static TLS of every loaded library; with OpenBLAS,
// the CUDA runtime and NCCL loaded, the first scrape used to crash the worker (see
// common/thread_stack.cc).
TEST_F(WorkerE2eTest, MetricsEndpointAnswersEveryScrape) {
  StartWorkers(1);
  auto port = testing::WaitForFile(dir_.File("metrics0.port"), absl::Seconds(10));
  ASSERT_TRUE(port.ok());
  const std::string address = absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*port));
  for (int i = 0; i < 20; ++i) {
    auto body = testing::HttpGet(address, "/metrics");
    ASSERT_TRUE(body.ok()) << "scrape " << i << ": " << body.status() << "\n" << Logs();
    EXPECT_THAT(*body, HasSubstr("weft_worker_"));
  }
  EXPECT_TRUE(workers_[0]->Running()) << Logs();
}

TEST_F(WorkerE2eTest, CancelStopsTrainingWithinAStep) {
  StartWorkers(2);
  auto submitted = client_->SubmitJob(Spec(100000));
  ASSERT_TRUE(submitted.ok());
  ASSERT_TRUE(WaitForStep(submitted->job_id(), 2, absl::Seconds(60))) << Logs();
  ASSERT_TRUE(client_->CancelJob(submitted->job_id(), "test").ok());
  const absl::Time cancelled = absl::Now();
  EXPECT_TRUE(Eventually(
      [&] {
        return absl::StrContains(testing::ReadFile(dir_.File("worker0.log")), ": aborted:") &&
               absl::StrContains(testing::ReadFile(dir_.File("worker1.log")), ": aborted:");
      },
      absl::Seconds(10)))
      << Logs();
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(5));
  // The workers are reusable: a new job runs on them.
  auto next = client_->SubmitJob(Spec(10));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(WaitForEnd(next->job_id(), absl::Seconds(60)).state(), v1::SUCCEEDED) << Logs();
}

}  // namespace
}  // namespace weft
