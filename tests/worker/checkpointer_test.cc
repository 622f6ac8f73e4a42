// Checkpointer against a real weft-checkpointd on 127.0.0.1: a save after the first copies into
// the previous save's host buffers (no new allocation), and what each checkpoint holds is the
// state at its own step, the earlier one intact after its buffers were reused; a failed copy
// keeps the buffers; a due save never waits for an upload in flight (it is deferred, and the
// log names an unreachable checkpointd as the cause when it is); a shard
// that cannot be stored ends rank 0's wait for it at once; the end of training waits for every
// rank's upload.
#include "worker/checkpointer.h"

#include <signal.h>

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "coordinator/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/sinks/ringbuffer_sink.h"
#include "spdlog/spdlog.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"
#include "tests/worker/snapshot_reader.h"
#include "worker/comm/communicator.h"
#include "worker/zero/zero_cpu.h"

namespace weft::worker {
namespace {

using ::testing::HasSubstr;

weft::v1::JobSpec TinySpec() {
  constexpr char kSpec[] = R"pb(
    name: "ckpt"
    model { num_layers: 2 hidden_size: 32 num_heads: 4 vocab_size: 61 context_length: 16 }
    training { total_steps: 4 micro_batch_size: 2 sequence_length: 16 seed: 11 }
    optimizer { learning_rate: 1e-2 }
    checkpoint { interval_steps: 1 }
    zero_stage: 3
  )pb";
  absl::StatusOr<weft::v1::JobSpec> spec = ParseJobSpecText(kSpec, "tiny.pb.txt");
  if (!spec.ok()) {
    ADD_FAILURE() << spec.status();
    return {};
  }
  ApplyJobSpecDefaults(&*spec);
  return *spec;
}

void Batch(int64_t step, int, const zero::MicroBatch& mb) {
  for (int i = 0; i < 2 * 16; ++i) {
    mb.inputs[i] = static_cast<int32_t>((step * 5 + i) % 61);
    mb.targets[i] = static_cast<int32_t>((step * 5 + i + 1) % 61);
  }
}

// Every unit's params, m and v data pointers in `slices`.
std::vector<const float*> DataOf(const std::vector<model_io::UnitSlice>& slices) {
  std::vector<const float*> out;
  for (const model_io::UnitSlice& slice : slices) {
    for (model_io::UnitState what : model_io::kUnitStates) out.push_back(slice.data(what).data());
  }
  return out;
}

// The engine as training sees it, remembering the buffers each snapshot was handed and those
// it filled.
class RecordingEngine : public zero::TrainingEngine {
 public:
  explicit RecordingEngine(zero::TrainingEngine* inner) : inner_(inner) {}

  absl::Status Snapshot(std::vector<model_io::UnitSlice>* into) const override {
    handed_ = DataOf(*into);
    if (fail_next_) {
      fail_next_ = false;
      return absl::InternalError("device copy failed");
    }
    absl::Status s = inner_->Snapshot(into);
    filled_ = DataOf(*into);
    return s;
  }
  using zero::TrainingEngine::Snapshot;
  // Of the last snapshot: the buffers it was given (none: fresh ones) and those it filled.
  const std::vector<const float*>& handed() const { return handed_; }
  const std::vector<const float*>& filled() const { return filled_; }
  // The next snapshot fails as a faulty device copy would.
  void FailNextSnapshot() { fail_next_ = true; }

  absl::StatusOr<zero::StepResult> TrainStep(int64_t step, const zero::BatchFn& batch) override {
    return inner_->TrainStep(step, batch);
  }
  absl::StatusOr<float> EvalLoss(int batches, const zero::BatchFn& batch) override {
    return inner_->EvalLoss(batches, batch);
  }
  absl::StatusOr<std::vector<float>> GatherUnit(int u) override { return inner_->GatherUnit(u); }
  absl::Status Restore(const model_io::RangeReader& read, int64_t optimizer_steps) override {
    return inner_->Restore(read, optimizer_steps);
  }
  size_t StateBytes() const override { return inner_->StateBytes(); }
  size_t WorkingBytes() const override { return inner_->WorkingBytes(); }
  int64_t optimizer_steps() const override { return inner_->optimizer_steps(); }
  const engine::ModelArch& arch() const override { return inner_->arch(); }
  int stage() const override { return inner_->stage(); }

 private:
  zero::TrainingEngine* inner_;
  mutable std::vector<const float*> handed_, filled_;
  mutable bool fail_next_ = false;
};

// Every tensor of checkpoint `step` of job "ckpt" that `expected` (a world-1 snapshot) covers
// equals it.
void ExpectCheckpointHolds(CheckpointClient& client, int64_t step,
                           const std::vector<model_io::UnitSlice>& expected) {
  for (const model_io::UnitSlice& slice : expected) {
    for (model_io::UnitState what : model_io::kUnitStates) {
      const std::string name = model_io::CheckpointTensorName(slice.unit, what);
      model_io::HostFloats stored(slice.end - slice.begin);
      ASSERT_TRUE(
          client.ReadRange("ckpt", step, name, slice.begin, slice.end, stored.data()).ok());
      EXPECT_EQ(stored, slice.data(what)) << name << " of the checkpoint at step " << step;
    }
  }
}

// A real checkpointd, the generation's store and a world-1 Gloo communicator.
class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = testing::CheckpointdProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    auto comm = comm::CreateGlooCommunicator(&store_, 0, 1, {});
    ASSERT_TRUE(comm.ok()) << comm.status();
    comm_ = std::move(*comm);
  }

  testing::TempDir dir_;
  std::unique_ptr<testing::CheckpointdProcess> daemon_;
  MemoryStore store_;
  std::unique_ptr<comm::Communicator> comm_;
};

TEST_F(CheckpointerTest, LaterSavesReuseTheHostBuffersAndStoreTheirOwnStep) {
  const weft::v1::JobSpec spec = TinySpec();
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  RecordingEngine engine(cpu->get());
  CheckpointClient client(daemon_->address());
  Checkpointer checkpointer(&client, &store_, spec, CheckpointRank{"ckpt", 1, 0, 1});

  ASSERT_TRUE(engine.TrainStep(0, Batch).ok());
  ASSERT_TRUE(checkpointer.Save(1, engine).ok());
  EXPECT_TRUE(engine.handed().empty());
  const std::vector<const float*> first = engine.filled();
  auto at1 = (*cpu)->Snapshot();
  ASSERT_TRUE(at1.ok());
  // Training goes on while step 1 uploads; step 2's save waits for that upload.
  ASSERT_TRUE(engine.TrainStep(1, Batch).ok());
  auto at2 = (*cpu)->Snapshot();
  ASSERT_TRUE(at2.ok());
  ASSERT_TRUE(checkpointer.Save(2, engine).ok());
  checkpointer.Drain();

  // The second save was handed the first one's buffers and filled them where they were.
  ASSERT_FALSE(first.empty());
  EXPECT_EQ(engine.handed(), first);
  EXPECT_EQ(engine.filled(), first);
  ASSERT_NE((*at1)[1].params, (*at2)[1].params);  // the step changed the state
  ExpectCheckpointHolds(client, 1, *at1);
  ExpectCheckpointHolds(client, 2, *at2);
  const std::optional<Checkpointer::Committed> committed = checkpointer.TakeCommitted();
  ASSERT_TRUE(committed.has_value());
  EXPECT_EQ(committed->step, 2);
  EXPECT_GT(committed->stall_ms, 0);

  // A failed copy queues nothing and keeps the buffers for the next save.
  engine.FailNextSnapshot();
  const absl::StatusOr<double> failed = checkpointer.Save(3, engine);
  EXPECT_EQ(failed.status().message(), "device copy failed");
  ASSERT_TRUE(engine.TrainStep(2, Batch).ok());
  ASSERT_TRUE(checkpointer.Save(3, engine).ok());
  EXPECT_EQ(engine.handed(), first);
  checkpointer.Drain();
  auto at3 = (*cpu)->Snapshot();
  ASSERT_TRUE(at3.ok());
  ExpectCheckpointHolds(client, 3, *at3);
}

// Hybrid sharding: in a world of 2 replicas of one rank, only rank 0 (group 0) writes. Its
// commit waits for no other rank and the manifest is a 1-rank sharding; rank 1 copies and
// allocates nothing.
TEST_F(CheckpointerTest, OnlyTheWritersUploadAndTheManifestIsTheirSharding) {
  CheckpointClient client(daemon_->address());
  CheckpointTimeouts timeouts;
  timeouts.commit_timeout_ms = 5000;  // a wait for rank 1 would time out: no commit
  const weft::v1::JobSpec spec = TinySpec();
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  RecordingEngine engine(cpu->get());
  Checkpointer replica(&client, &store_, spec, CheckpointRank{"ckpt", 1, 1, 2, 1}, timeouts);
  ASSERT_TRUE(replica.Prepare(engine, 1).ok());  // no buffers: any host has room
  const absl::StatusOr<double> nothing = replica.Save(1, engine);
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(*nothing, 0.0);
  EXPECT_TRUE(engine.filled().empty());
  replica.Drain();
  EXPECT_FALSE(replica.TakeFailed().has_value());

  Checkpointer writer(&client, &store_, spec, CheckpointRank{"ckpt", 1, 0, 2, 1}, timeouts);
  ASSERT_TRUE(engine.TrainStep(0, Batch).ok());
  ASSERT_TRUE(writer.Save(1, engine).ok());
  writer.Drain();
  const std::optional<Checkpointer::Committed> committed = writer.TakeCommitted();
  ASSERT_TRUE(committed.has_value());
  EXPECT_EQ(committed->step, 1);
  auto manifests = client.List("ckpt");
  ASSERT_TRUE(manifests.ok()) << manifests.status();
  ASSERT_EQ(manifests->size(), 1u);
  EXPECT_EQ((*manifests)[0].world_size(), 1);
  auto at1 = (*cpu)->Snapshot();
  ASSERT_TRUE(at1.ok());
  ExpectCheckpointHolds(client, 1, *at1);
}

// Rank 0 of a world of 2 whose rank 1 never stores its shard: rank 0's upload stays in flight
// (its thread waits for rank 1) until the commit times out, which is how a slow upload looks.
TEST_F(CheckpointerTest, ADueSaveIsDeferredWhileAnUploadIsInFlight) {
  weft::v1::JobSpec spec = TinySpec();
  spec.mutable_checkpoint()->set_interval_steps(2);
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CheckpointClient client(daemon_->address());
  CheckpointTimeouts timeouts;
  timeouts.commit_timeout_ms = 1500;
  Checkpointer checkpointer(&client, &store_, spec, CheckpointRank{"ckpt", 1, 0, 2}, timeouts);
  const auto should = [&](int64_t step) {
    absl::StatusOr<bool> s = checkpointer.ShouldSave(step, comm_.get());
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() && *s;
  };

  EXPECT_FALSE(should(1));  // not due
  EXPECT_TRUE(should(2));
  ASSERT_TRUE(checkpointer.Save(2, **cpu).ok());
  EXPECT_FALSE(should(3));  // not due
  EXPECT_FALSE(should(4));  // due, but step 2's upload is in flight: deferred, no wait
  EXPECT_FALSE(should(5));  // still in flight
  checkpointer.Drain();     // the commit gave up waiting for rank 1
  EXPECT_TRUE(should(5));   // the deferred save, off the interval's cadence
  EXPECT_FALSE(should(7));  // nothing due or deferred any more
  EXPECT_TRUE(should(8));

  // Training ends with a save deferred: the end takes it (after the upload in flight). Rank
  // 1, which never uploads here, reaches the end too: SaveDeferred waits for every rank.
  ASSERT_TRUE(checkpointer.Save(8, **cpu).ok());
  EXPECT_FALSE(should(10));
  // Its wait for rank 0 outlasts rank 0's commit timeout (above), which the end runs into.
  Checkpointer rank1(&client, &store_, spec, CheckpointRank{"ckpt", 1, 1, 2});
  std::future<absl::StatusOr<bool>> rank1_end =
      std::async(std::launch::async, [&] { return rank1.SaveDeferred(11, **cpu); });
  const absl::StatusOr<bool> at_end = checkpointer.SaveDeferred(11, **cpu);
  ASSERT_TRUE(at_end.ok()) << at_end.status();
  EXPECT_TRUE(*at_end);
  const absl::StatusOr<bool> again = checkpointer.SaveDeferred(11, **cpu);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(*again);  // nothing deferred any more
  const absl::StatusOr<bool> rank1_saved = rank1_end.get();
  ASSERT_TRUE(rank1_saved.ok()) << rank1_saved.status();
  EXPECT_FALSE(*rank1_saved);
}

// A save deferred behind an upload to a checkpointd that is down says so, not that storage is
// slower than the interval (which sends an operator after the wrong problem).
TEST_F(CheckpointerTest, ASaveDeferredBehindAnUnreachableCheckpointdSaysSo) {
  EXPECT_THAT(DeferredSaveReason(2, 0, "h:1"), HasSubstr("storage slower than"));
  EXPECT_THAT(DeferredSaveReason(2, 1, "h:1"),
              HasSubstr("1 of them waiting for checkpointd at h:1, which is unreachable"));

  const std::string address = daemon_->address();
  daemon_->process().Signal(SIGKILL);
  ASSERT_TRUE(daemon_->process().Wait(absl::Seconds(10)).ok());
  const weft::v1::JobSpec spec = TinySpec();  // a save every step
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CheckpointClient client(address);
  Checkpointer checkpointer(&client, &store_, spec, CheckpointRank{"ckpt", 1, 0, 1});
  auto log = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  spdlog::default_logger()->sinks().push_back(log);
  struct Unhook {
    ~Unhook() { spdlog::default_logger()->sinks().pop_back(); }
  } unhook;

  ASSERT_TRUE(checkpointer.Save(1, **cpu).ok());
  // The upload has tried to connect by the time the next save is due (it waits up to 3 s for
  // checkpointd to come back, then fails).
  absl::SleepFor(absl::Milliseconds(500));
  const absl::StatusOr<bool> save = checkpointer.ShouldSave(2, comm_.get());
  ASSERT_TRUE(save.ok()) << save.status();
  EXPECT_FALSE(*save);
  std::string deferral;
  for (const std::string& line : log->last_formatted()) {
    if (line.find("deferred") != std::string::npos) deferral = line;
  }
  EXPECT_THAT(deferral, HasSubstr(absl::StrCat("waiting for checkpointd at ", address,
                                               ", which is unreachable")));
  EXPECT_THAT(deferral, ::testing::Not(HasSubstr("storage slower")));
  checkpointer.Drain();
  const std::optional<Checkpointer::Failed> failed = checkpointer.TakeFailed();
  ASSERT_TRUE(failed.has_value());
  EXPECT_THAT(failed->reason, HasSubstr("unreachable"));
}

// The end of training on 3 ranks, rank 1's upload slow (its connection to checkpointd held):
// rank 2, whose upload ended long before, does not return from SaveDeferred (and go on to the
// collectives after training, whose timeout is short) until rank 1's upload and rank 0's
// commit have ended too.
TEST_F(CheckpointerTest, TheEndOfTrainingWaitsForEveryRanksUpload) {
  const weft::v1::JobSpec spec = TinySpec();
  // Three ranks of one engine over Gloo, so that each saves its own shard and rank 0 commits.
  MemoryStore gloo_store;
  std::vector<std::unique_ptr<comm::Communicator>> comms(3);
  std::vector<std::unique_ptr<zero::ZeroCpuEngine>> engines(3);
  std::vector<absl::Status> created(3);
  {
    std::vector<std::thread> threads;
    for (int32_t r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        auto comm = comm::CreateGlooCommunicator(&gloo_store, r, 3, {});
        if (!comm.ok()) {
          created[r] = comm.status();
          return;
        }
        comms[r] = std::move(*comm);
        auto engine = zero::ZeroCpuEngine::Create(spec, comms[r].get());
        if (!engine.ok()) {
          created[r] = engine.status();
          return;
        }
        engines[r] = std::move(*engine);
      });
    }
    for (std::thread& t : threads) t.join();
  }
  for (const absl::Status& s : created) ASSERT_TRUE(s.ok()) << s;
  auto proxy = testing::TcpProxy::Start(daemon_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  CheckpointClient direct(daemon_->address());
  // It waits for its held connection rather than failing the write.
  CheckpointClient held((*proxy)->address(), absl::Seconds(60), absl::Seconds(60));
  (*proxy)->HoldNewConnections(true);
  std::vector<std::unique_ptr<Checkpointer>> ranks;
  for (int32_t r = 0; r < 3; ++r) {
    ranks.push_back(std::make_unique<Checkpointer>(r == 1 ? &held : &direct, &store_, spec,
                                                   CheckpointRank{"ckpt", 1, r, 3}));
    ASSERT_TRUE(ranks.back()->Save(4, *engines[r]).ok());
  }
  std::vector<std::future<absl::StatusOr<bool>>> ends;
  for (int32_t r = 0; r < 3; ++r) {
    ends.push_back(std::async(std::launch::async,
                              [&, r] { return ranks[r]->SaveDeferred(4, *engines[r]); }));
  }
  EXPECT_EQ(ends[2].wait_for(std::chrono::milliseconds(500)), std::future_status::timeout)
      << "rank 2 left the end while rank 1 was still uploading";
  (*proxy)->HoldNewConnections(false);
  for (int32_t r = 0; r < 3; ++r) {
    ASSERT_EQ(ends[r].wait_for(std::chrono::seconds(30)), std::future_status::ready) << r;
    const absl::StatusOr<bool> saved = ends[r].get();
    ASSERT_TRUE(saved.ok()) << r << ": " << saved.status();
    EXPECT_FALSE(*saved);  // nothing was deferred
    EXPECT_FALSE(ranks[r]->TakeFailed().has_value()) << r;
  }
  const std::optional<Checkpointer::Committed> committed = ranks[0]->TakeCommitted();
  ASSERT_TRUE(committed.has_value());
  EXPECT_EQ(committed->step, 4);
}

// Rank 1 of 2 cannot reach checkpointd. Its failure reaches rank 0 through the store, so rank
// 0's upload ends at once with rank 1's reason and commits nothing, instead of staying in
// flight (deferring every later save, holding up the end of training) until its commit
// times out.
TEST_F(CheckpointerTest, AShardThatCannotBeStoredEndsRankZerosWaitAtOnce) {
  const weft::v1::JobSpec spec = TinySpec();
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CheckpointClient reachable(daemon_->address());
  // Port 1: nothing listens there, so every attempt is refused.
  CheckpointClient unreachable("127.0.0.1:1", absl::Seconds(5), absl::Milliseconds(100));
  CheckpointTimeouts timeouts;
  timeouts.commit_timeout_ms = 90'000;
  Checkpointer rank0(&reachable, &store_, spec, CheckpointRank{"ckpt", 1, 0, 2}, timeouts);
  Checkpointer rank1(&unreachable, &store_, spec, CheckpointRank{"ckpt", 1, 1, 2}, timeouts);
  ASSERT_TRUE(rank0.Save(1, **cpu).ok());
  ASSERT_TRUE(rank1.Save(1, **cpu).ok());
  rank1.Drain();
  const std::optional<Checkpointer::Failed> failed1 = rank1.TakeFailed();
  ASSERT_TRUE(failed1.has_value());
  EXPECT_EQ(failed1->step, 1);

  std::future<void> drained = std::async(std::launch::async, [&] { rank0.Drain(); });
  ASSERT_EQ(drained.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "rank 0 still waits for rank 1's shard";
  const std::optional<Checkpointer::Failed> failed0 = rank0.TakeFailed();
  ASSERT_TRUE(failed0.has_value());
  EXPECT_EQ(failed0->step, 1);
  EXPECT_THAT(failed0->reason, HasSubstr("rank 1 did not store its shard"));
  EXPECT_THAT(failed0->reason, HasSubstr(failed1->reason));
  EXPECT_FALSE(rank0.TakeCommitted().has_value());
  auto manifests = reachable.List("ckpt");
  ASSERT_TRUE(manifests.ok()) << manifests.status();
  EXPECT_TRUE(manifests->empty());
}

// The manifest carries the engine's count of AdamW updates, which need not be the step (a
// skipped step is not one), and a restore hands it back to the engine, whose bias corrections
// go on from it.
TEST_F(CheckpointerTest, TheCheckpointCarriesTheUpdatesAppliedBackToTheEngine) {
  const weft::v1::JobSpec spec = TinySpec();
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CheckpointClient client(daemon_->address());
  Checkpointer checkpointer(&client, &store_, spec, CheckpointRank{"ckpt", 1, 0, 1});
  ASSERT_TRUE((*cpu)->TrainStep(0, Batch).ok());
  ASSERT_EQ((*cpu)->optimizer_steps(), 1);
  // As if it came from a run that skipped some of its steps: 6 updates before this one.
  auto own = (*cpu)->Snapshot();
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_TRUE((*cpu)->Restore(testing::ReaderOf(*own), 6).ok());
  ASSERT_TRUE((*cpu)->TrainStep(8, Batch).ok());
  ASSERT_EQ((*cpu)->optimizer_steps(), 7);
  ASSERT_TRUE(checkpointer.Save(9, **cpu).ok());
  checkpointer.Drain();
  auto manifests = client.List("ckpt");
  ASSERT_TRUE(manifests.ok()) << manifests.status();
  ASSERT_EQ(manifests->size(), 1u);
  EXPECT_EQ((*manifests)[0].step(), 9);
  EXPECT_EQ((*manifests)[0].optimizer_step(), 7);

  auto fresh = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  MemoryStore store;
  Checkpointer restorer(&client, &store, spec, CheckpointRank{"ckpt", 2, 0, 1});
  auto restored = restorer.RestoreLatest(fresh->get(), comm_.get());
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->step, 9);
  EXPECT_EQ(restored->job, "ckpt");
  EXPECT_EQ(restored->world_size, 1);
  EXPECT_EQ((*fresh)->optimizer_steps(), 7);
}

// The snapshot buffers stay for the whole run: a host without room for them refuses before
// training, naming both figures, rather than losing the worker at the first save.
TEST_F(CheckpointerTest, PrepareRefusesAHostWithoutRoomForTheSnapshot) {
  const weft::v1::JobSpec spec = TinySpec();
  auto cpu = zero::ZeroCpuEngine::Create(spec, comm_.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  CheckpointClient client(daemon_->address());
  Checkpointer checkpointer(&client, &store_, spec, CheckpointRank{"ckpt", 1, 0, 1});
  const absl::Status refused = checkpointer.Prepare(**cpu, 1000);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("checkpoint.interval_steps"), std::string::npos);
  EXPECT_NE(refused.message().find("available memory is 0.00 GB"), std::string::npos);
  EXPECT_TRUE(checkpointer.Prepare(**cpu, size_t{1} << 40).ok());
}

}  // namespace
}  // namespace weft::worker
