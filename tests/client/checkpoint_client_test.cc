// CheckpointClient and trainctl's checkpoint commands against a real weft-checkpointd process
// on 127.0.0.1: sharded writes from concurrent ranks, commit, listing, resharded reads that
// must be bit-identical, small chunks, pin/unpin/delete/export through the trainctl binary,
// and the messages a user gets for an unreachable daemon and bad arguments.
#include <csignal>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/checkpoint_client.h"
#include "client/coordinator_client.h"
#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/tcp_proxy.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/hf/hf_checkpoint.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using ::testing::HasSubstr;
using ::weft::testing::CommandResult;
using ::weft::testing::RunCommand;
using ::weft::testing::Subprocess;
using ::weft::testing::TempDir;

// A whole tensor of random bytes; ranks take slices of it.
struct Whole {
  std::string name;
  v1::DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;
  int64_t numel() const { return NumElements(shape); }
  int es() const { return DTypeSize(dtype); }
};

Whole MakeWhole(const std::string& name, v1::DType dtype, std::vector<int64_t> shape,
                uint64_t seed) {
  Whole w{name, dtype, std::move(shape), {}};
  w.bytes.resize(w.numel() * w.es());
  std::mt19937_64 rng(seed);
  for (char& c : w.bytes) c = static_cast<char>(rng());
  return w;
}

std::pair<int64_t, int64_t> Split(int64_t n, int rank, int world) {
  return {n * rank / world, n * (rank + 1) / world};
}

// Rank `rank` of `world`'s part of every tensor.
std::vector<ShardTensor> Shard(const std::vector<Whole>& wholes, int rank, int world) {
  std::vector<ShardTensor> out;
  for (const Whole& w : wholes) {
    auto [b, e] = Split(w.numel(), rank, world);
    out.push_back({w.name, w.dtype, w.shape, b, e, w.bytes.data() + b * w.es()});
  }
  return out;
}

v1::CheckpointManifest ManifestOf(const std::string& job, int64_t step, int world,
                                  const std::vector<Whole>& wholes) {
  v1::CheckpointManifest m;
  m.set_job_id(job);
  m.set_step(step);
  m.set_world_size(world);
  m.set_optimizer_step(step);
  for (const Whole& w : wholes) {
    auto* t = m.add_tensors();
    t->set_name(w.name);
    t->set_dtype(w.dtype);
    for (int64_t d : w.shape) t->add_shape(d);
  }
  for (int r = 0; r < world; ++r) {
    auto* rs = m.add_ranks();
    rs->set_rank(r);
    rs->set_data_position(100 * step + r);
  }
  return m;
}

std::vector<Whole> MixedTensors() {
  return {MakeWhole("w", v1::DTYPE_F32, {1000, 37}, 1),
          MakeWhole("b", v1::DTYPE_BF16, {999}, 2),
          MakeWhole("u", v1::DTYPE_U8, {12345}, 3),
          MakeWhole("s", v1::DTYPE_F32, {}, 4)};  // a scalar: only one rank holds it
}

class CheckpointClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = testing::CheckpointdProcess::Start(dir_.path());
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    client_ = std::make_unique<CheckpointClient>(daemon_->address());
  }

  // Writes `wholes` from `world` concurrent ranks, each with its own client, and commits.
  void WriteAndCommit(const std::string& job, int64_t step, int world,
                      const std::vector<Whole>& wholes, const v1::JobSpec* spec = nullptr) {
    std::vector<absl::StatusOr<int64_t>> results(world, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r) {
      threads.emplace_back([&, r] {
        CheckpointClient rank_client(daemon_->address());
        results[r] = rank_client.WriteShard(job, step, r, world, Shard(wholes, r, world));
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
      int64_t expected = 0;
      for (const ShardTensor& t : Shard(wholes, r, world)) {
        expected += (t.end - t.begin) * DTypeSize(t.dtype);
      }
      EXPECT_EQ(*results[r], expected) << "rank " << r;
    }
    v1::CheckpointManifest m = ManifestOf(job, step, world, wholes);
    if (spec != nullptr) *m.mutable_spec() = *spec;
    absl::Status committed = client_->Commit(m);
    ASSERT_TRUE(committed.ok()) << committed;
  }

  // trainctl --checkpointd <ours> args...
  CommandResult Trainctl(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {testing::BinDir() + "/trainctl", "--checkpointd",
                                     daemon_->address()};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  }

  TempDir dir_;
  std::unique_ptr<testing::CheckpointdProcess> daemon_;
  std::unique_ptr<CheckpointClient> client_;
};

std::string Describe(const CommandResult& r) {
  return absl::StrCat("exit ", r.exit_code, "\n--- stdout\n", r.out, "\n--- stderr\n", r.err);
}

TEST_F(CheckpointClientTest, TwoRanksCommitListAndReadReshardedBitIdentical) {
  const auto wholes = MixedTensors();
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-a", 5, 2, wholes));

  auto list = client_->List("job-a");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 5);
  EXPECT_EQ((*list)[0].world_size(), 2);
  int64_t total = 0;
  for (const Whole& w : wholes) total += w.bytes.size();
  EXPECT_EQ((*list)[0].total_bytes(), total);
  ASSERT_EQ((*list)[0].ranks_size(), 2);
  EXPECT_EQ((*list)[0].ranks(1).data_position(), 501);

  auto latest = client_->GetManifest("job-a");
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->step(), 5);
  auto exact = client_->GetManifest("job-a", 5);
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ(exact->tensors_size(), 4);

  for (const Whole& w : wholes) {
    // One reader takes everything (step 0: the latest).
    std::string one(w.bytes.size(), '\0');
    absl::Status s = client_->ReadRange("job-a", 0, w.name, 0, w.numel(), one.data());
    ASSERT_TRUE(s.ok()) << w.name << ": " << s;
    EXPECT_TRUE(one == w.bytes) << w.name;
    // Four concurrent readers, each its own client and a quarter straddling rank borders.
    std::string four(w.bytes.size(), '\0');
    std::vector<absl::Status> results(4);
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r) {
      threads.emplace_back([&, r] {
        CheckpointClient reader(daemon_->address());
        auto [b, e] = Split(w.numel(), r, 4);
        results[r] = reader.ReadRange("job-a", 5, w.name, b, e, four.data() + b * w.es());
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < 4; ++r) ASSERT_TRUE(results[r].ok()) << w.name << " " << results[r];
    EXPECT_TRUE(four == w.bytes) << w.name;
  }
  // An empty range reads nothing and succeeds.
  EXPECT_TRUE(client_->ReadRange("job-a", 5, "w", 7, 7, nullptr).ok());
}

TEST_F(CheckpointClientTest, SmallChunksRoundTrip) {
  const std::vector<Whole> wholes = {MakeWhole("w", v1::DTYPE_F32, {5003}, 7),
                                     MakeWhole("h", v1::DTYPE_BF16, {77}, 8)};
  // 1000 bytes: 250 f32 / 500 bf16 elements per chunk; 1 byte: rounded up to one element.
  for (size_t chunk_bytes : {size_t{1000}, size_t{1}}) {
    const int64_t step = static_cast<int64_t>(chunk_bytes);
    auto bytes = client_->WriteShard("job-c", step, 0, 1, Shard(wholes, 0, 1), chunk_bytes);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, 5003 * 4 + 77 * 2);
    ASSERT_TRUE(client_->Commit(ManifestOf("job-c", step, 1, wholes)).ok());
    for (const Whole& w : wholes) {
      std::string out(w.bytes.size(), '\0');
      ASSERT_TRUE(client_->ReadRange("job-c", step, w.name, 0, w.numel(), out.data()).ok());
      EXPECT_TRUE(out == w.bytes) << w.name << " chunk_bytes " << chunk_bytes;
      // An unaligned inner range, too.
      std::string part(13 * w.es(), '\0');
      ASSERT_TRUE(client_->ReadRange("job-c", step, w.name, 61, 74, part.data()).ok());
      EXPECT_TRUE(part == w.bytes.substr(61 * w.es(), 13 * w.es()));
    }
  }
}

// A stream's deadline grows with its bytes: a 64 MB shard streams well past a 1 ms call timeout
// and lands whole (with the call timeout alone it would end DEADLINE_EXCEEDED).
TEST_F(CheckpointClientTest, LargeShardsOutliveTheCallTimeout) {
  const std::vector<Whole> wholes = {MakeWhole("big", v1::DTYPE_F32, {16 << 20}, 9)};
  CheckpointClient hurried(daemon_->address(), absl::Milliseconds(1));
  auto bytes = hurried.WriteShard("job-big", 1, 0, 1, Shard(wholes, 0, 1));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, int64_t{64} << 20);
}

// A connection reset mid-stream while the daemon lives: WriteShard goes again over a new
// connection, the daemon's second stream of that rank waits for it to see the first die, and
// the checkpoint reads back whole.
TEST_F(CheckpointClientTest, AShardWriteOutlastsAConnectionLostMidStream) {
  auto proxy = testing::TcpProxy::Start(daemon_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  testing::TcpProxy& link = **proxy;
  // 64 MiB: the daemon stores it far slower than the test sees its first MiB pass.
  const std::vector<Whole> wholes = {MakeWhole("big", v1::DTYPE_F32, {16 << 20}, 11)};
  CheckpointClient client(link.address());
  absl::StatusOr<int64_t> written = absl::UnknownError("not run");
  std::thread writer(
      [&] { written = client.WriteShard("job-cut", 1, 0, 1, Shard(wholes, 0, 1)); });
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (link.bytes_to_server() < (1 << 20) && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  link.CutAll();
  writer.join();
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, int64_t{64} << 20);
  EXPECT_EQ(link.cuts(), 1) << "the cut must have met the stream";
  EXPECT_GE(link.accepted(), 2) << "the stream went again over a new connection";
  ASSERT_TRUE(client_->Commit(ManifestOf("job-cut", 1, 1, wholes)).ok());
  std::string out(wholes[0].bytes.size(), '\0');
  ASSERT_TRUE(client_->ReadRange("job-cut", 1, "big", 0, wholes[0].numel(), out.data()).ok());
  EXPECT_TRUE(out == wholes[0].bytes);
}

// The commit's answer is lost after the daemon committed: the client reads the step's manifest
// back, finds it committed as it asked, and reports success instead of a lost checkpoint.
TEST_F(CheckpointClientTest, ACommitWhoseAnswerIsLostIsReadBack) {
  auto proxy = testing::TcpProxy::Start(daemon_->port());
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  testing::TcpProxy& link = **proxy;
  const auto wholes = MixedTensors();
  CheckpointClient client(link.address());
  ASSERT_TRUE(client.WriteShard("job-lost", 5, 0, 1, Shard(wholes, 0, 1)).ok());
  link.CutOnNextGrpcResponse();
  const absl::Status committed = client.Commit(ManifestOf("job-lost", 5, 1, wholes));
  EXPECT_TRUE(committed.ok()) << "a commit that landed must not be reported lost: " << committed;
  EXPECT_EQ(link.cuts(), 1);
  auto list = client_->List("job-lost");
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 5);
  // The daemon's own refusal is not second-guessed: a commit of a committed step still fails.
  EXPECT_EQ(client.Commit(ManifestOf("job-lost", 5, 1, wholes)).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST_F(CheckpointClientTest, BadArgumentsAndUnknownCheckpointsGiveClearErrors) {
  const auto wholes = MixedTensors();
  auto shard = Shard(wholes, 0, 1);
  auto bad = client_->WriteShard("job-e", -1, 0, 1, shard);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("step -1"));
  bad = client_->WriteShard("job-e", 1, 2, 2, shard);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("rank 2"));
  bad = client_->WriteShard("a/b", 1, 0, 1, shard);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  auto past_end = shard;
  past_end[0].end = past_end[0].end + 1;
  bad = client_->WriteShard("job-e", 1, 0, 1, past_end);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("tensor w"));

  // Only rank 0 of 2 wrote: the commit names the missing rank.
  ASSERT_TRUE(client_->WriteShard("job-e", 1, 0, 2, Shard(wholes, 0, 2)).ok());
  absl::Status commit = client_->Commit(ManifestOf("job-e", 1, 2, wholes));
  EXPECT_EQ(commit.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(commit.message(), HasSubstr("1"));

  auto manifest = client_->GetManifest("no-such-job");
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(manifest.status().message(), HasSubstr("no-such-job"));
  EXPECT_EQ(client_->GetManifest("job-e", -3).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto list = client_->List("no-such-job");
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->empty());

  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-f", 3, 1, wholes));
  float f;
  absl::Status read = client_->ReadRange("job-f", 3, "nope", 0, 1, &f);
  EXPECT_EQ(read.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.message(), HasSubstr("nope"));
  EXPECT_EQ(client_->ReadRange("job-f", 4, "w", 0, 1, &f).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->ReadRange("job-f", -1, "w", 0, 1, &f).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->ReadRange("job-f", 3, "w", 5, 4, &f).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client_->ReadRange("job-f", 3, "w", 0, 37001, &f).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(client_->SetPinned("job-f", 4, true).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->Delete("job-f", -2).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckpointClientUnreachableTest, MessageNamesTheDaemon) {
  // Port 1 on loopback: nothing listens there. Each call waits its 1 s timeout (less than the
  // default reconnect wait) for the daemon to appear before it gives up.
  CheckpointClient client("127.0.0.1:1", absl::Seconds(1));
  auto list = client.List("job");
  EXPECT_EQ(list.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(list.status().message(), HasSubstr("checkpointd 127.0.0.1:1 unreachable"));
  float f = 1;
  ShardTensor t{"w", v1::DTYPE_F32, {1}, 0, 1, &f};
  auto written = client.WriteShard("job", 1, 0, 1, {t});
  EXPECT_EQ(written.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(written.status().message(), HasSubstr("checkpointd 127.0.0.1:1"));

  CommandResult r = RunCommand({testing::BinDir() + "/trainctl", "--checkpointd", "127.0.0.1:1",
                                "--timeout-s", "1", "checkpoints", "job"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("checkpointd 127.0.0.1:1 unreachable")) << Describe(r);
}

// The daemon is killed and started again on its port. Meanwhile a new client commits: it
// waits for the daemon and the commit lands once. And a client that had talked to the old
// process lists, reads and writes: each goes again on the dead connection's UNAVAILABLE, and
// what was stored before the kill reads back bit for bit. Sent at once, every call would fail.
TEST(CheckpointClientRestartTest, CallsOutlastADaemonRestart) {
  TempDir dir;
  auto daemon = testing::CheckpointdProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  const std::string address = (*daemon)->address();
  // A wait far longer than a restart takes on a loaded machine.
  CheckpointClient client(address, absl::Seconds(60), /*reconnect_wait=*/absl::Seconds(60));
  const auto wholes = MixedTensors();
  ASSERT_TRUE(client.WriteShard("job-r", 1, 0, 1, Shard(wholes, 0, 1)).ok());
  ASSERT_TRUE(client.Commit(ManifestOf("job-r", 1, 1, wholes)).ok());
  ASSERT_TRUE(client.WriteShard("job-r", 2, 0, 1, Shard(wholes, 0, 1)).ok());

  (*daemon)->process().Signal(SIGKILL);
  ASSERT_TRUE((*daemon)->process().Wait(absl::Seconds(30)).ok());
  absl::Status committed = absl::UnknownError("not run");
  absl::StatusOr<std::vector<v1::CheckpointManifest>> listed = absl::UnknownError("not run");
  std::string read(wholes[0].bytes.size(), '\0');
  absl::Status read_status = absl::UnknownError("not run");
  absl::StatusOr<int64_t> written = absl::UnknownError("not run");
  std::thread calls([&] {
    // A fresh channel, so that the commit is never sent on the connection the kill left: a
    // call sent there may or may not have arrived, so a commit would not go again.
    committed = CheckpointClient(address, absl::Seconds(60), absl::Seconds(60))
                    .Commit(ManifestOf("job-r", 2, 1, wholes));
    listed = client.List("job-r");
    read_status = client.ReadRange("job-r", 1, wholes[0].name, 0, wholes[0].numel(), read.data());
    written = client.WriteShard("job-r", 3, 0, 1, Shard(wholes, 0, 1));
  });
  // Long enough for the first call to find nothing listening.
  absl::SleepFor(absl::Milliseconds(300));
  auto restarted =
      testing::CheckpointdProcess::Start(dir.path(), testing::BinDir(), (*daemon)->port());
  calls.join();
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_TRUE(committed.ok()) << committed;
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].step(), 2);
  EXPECT_EQ((*listed)[1].step(), 1);
  ASSERT_TRUE(read_status.ok()) << read_status;
  EXPECT_TRUE(read == wholes[0].bytes);
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_TRUE(client.Commit(ManifestOf("job-r", 3, 1, wholes)).ok());
  for (int64_t step : {2, 3}) {
    for (const Whole& w : wholes) {
      std::string out(w.bytes.size(), '\0');
      ASSERT_TRUE(client.ReadRange("job-r", step, w.name, 0, w.numel(), out.data()).ok())
          << w.name << " step " << step;
      EXPECT_TRUE(out == w.bytes) << w.name << " step " << step;
    }
  }
}

TEST_F(CheckpointClientTest, TrainctlListPinUnpinDelete) {
  const std::vector<Whole> wholes = {MakeWhole("w", v1::DTYPE_F32, {4096}, 11)};
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-t", 10, 2, wholes));
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-t", 20, 1, wholes));

  CommandResult r = Trainctl({"checkpoints", "job-t"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("STEP"));
  EXPECT_THAT(r.out, HasSubstr("WORLD SIZE"));
  EXPECT_THAT(r.out, HasSubstr("16.0 KiB"));
  // Newest first.
  EXPECT_LT(r.out.find("\n20 "), r.out.find("\n10 ")) << r.out;

  ASSERT_EQ(Trainctl({"checkpoint", "pin", "job-t", "10"}).exit_code, 0);
  r = Trainctl({"checkpoints", "job-t", "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  v1::ListCheckpointsResponse listed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &listed).ok()) << r.out;
  ASSERT_EQ(listed.checkpoints_size(), 2);
  EXPECT_EQ(listed.checkpoints(0).step(), 20);
  EXPECT_EQ(listed.checkpoints(1).world_size(), 2);
  EXPECT_TRUE(listed.checkpoints(1).pinned());
  EXPECT_FALSE(listed.checkpoints(0).pinned());

  r = Trainctl({"checkpoint", "delete", "job-t", "10"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("pinned")) << Describe(r);
  r = Trainctl({"checkpoint", "unpin", "job-t", "10"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("unpinned job-t step 10"));
  r = Trainctl({"checkpoint", "delete", "job-t", "10"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  auto list = client_->List("job-t");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 20);

  // Mistakes a user makes.
  r = Trainctl({"checkpoint", "delete", "job-t", "10"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("step 10")) << Describe(r);
  r = Trainctl({"checkpoint", "pin", "job-t", "--", "-1"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("must be >= 0")) << Describe(r);
  r = Trainctl({"checkpoint", "pin", "job-t", "latest"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("not a number")) << Describe(r);
  r = Trainctl({"checkpoint", "pin", "no-such-job", "5"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no-such-job")) << Describe(r);
  // No coordinator answers at the default address: it cannot tell whether the job exists, so
  // the empty list stands, with a warning.
  r = Trainctl({"checkpoints", "no-such-job"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("no committed checkpoints"));
  EXPECT_THAT(r.err, HasSubstr("warning: cannot check that job no-such-job exists"));
}

// `trainctl checkpoints JOB` for a job the coordinator does not know (a mistyped id) is an
// error, not an empty list; a known job without checkpoints is an empty list; and a job the
// coordinator has forgotten still lists the checkpoints checkpointd holds.
TEST_F(CheckpointClientTest, TrainctlCheckpointsOfAnUnknownJobFails) {
  auto coordinator = testing::CoordinatorProcess::Start(dir_.File("coordinator"));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string at = (*coordinator)->address();
  CommandResult r = Trainctl({"--coordinator", at, "checkpoints", "no-such-job"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("trainctl: job no-such-job: no such job")) << Describe(r);
  EXPECT_EQ(r.out, "") << Describe(r);
  r = Trainctl({"--coordinator", at, "checkpoints", "no-such-job", "-o", "json"});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);

  v1::JobSpec spec;
  spec.set_name("tiny");
  auto* model = spec.mutable_model();
  model->set_num_layers(2);
  model->set_hidden_size(64);
  model->set_num_heads(4);
  model->set_vocab_size(256);
  model->set_context_length(64);
  spec.mutable_data()->set_train_path("/tmp/x.txt");
  spec.mutable_data()->set_format(v1::DATA_FORMAT_TEXT_BYTES);
  spec.mutable_optimizer()->set_learning_rate(0.001f);
  spec.mutable_training()->set_total_steps(10);
  spec.mutable_training()->set_micro_batch_size(4);
  spec.mutable_resources()->set_device_kind(v1::DEVICE_KIND_CPU);
  spec.mutable_resources()->set_min_workers(2);  // none registered: it stays PENDING
  auto submitted = CoordinatorClient(at).SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  r = Trainctl({"--coordinator", at, "checkpoints", submitted->job_id()});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("no committed checkpoints"));
  EXPECT_EQ(r.err, "") << Describe(r);

  const std::vector<Whole> wholes = {MakeWhole("w", v1::DTYPE_F32, {16}, 3)};
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("gone-job", 5, 1, wholes));
  r = Trainctl({"--coordinator", at, "checkpoints", "gone-job"});
  EXPECT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("\n5 "));
}

TEST_F(CheckpointClientTest, TrainctlExportGivesALoadableModel) {
  v1::JobSpec spec;
  auto* model = spec.mutable_model();
  model->set_num_layers(2);
  model->set_hidden_size(16);
  model->set_num_heads(2);
  model->set_vocab_size(256);
  model->set_context_length(8);
  ApplyJobSpecDefaults(&spec);
  const engine::GptConfig config = engine::ConfigFromSpec(spec.model());
  const int units = engine::NumUnits(config);
  // What the worker stores: per unit its flat params and the AdamW moments.
  std::vector<std::vector<float>> params(units);
  std::vector<Whole> wholes;
  for (int u = 0; u < units; ++u) {
    const int64_t n = static_cast<int64_t>(engine::UnitSize(config, u));
    params[u].resize(n);
    engine::InitUnit(config, u, 1234, params[u].data());
    Whole p{absl::StrCat("u", u, ".params"), v1::DTYPE_F32, {n}, std::string(n * 4, '\0')};
    std::memcpy(p.bytes.data(), params[u].data(), n * 4);
    wholes.push_back(std::move(p));
    wholes.push_back(MakeWhole(absl::StrCat("u", u, ".m"), v1::DTYPE_F32, {n}, 100 + u));
    wholes.push_back(MakeWhole(absl::StrCat("u", u, ".v"), v1::DTYPE_F32, {n}, 200 + u));
  }
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-x", 30, 1, wholes, &spec));

  const std::string path = dir_.File("model.safetensors");
  CommandResult r = Trainctl({"checkpoint", "export", "job-x", "30", "--out", path});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr(path));
  auto loaded = model_io::LoadModel(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->units.size(), params.size());
  for (int u = 0; u < units; ++u) {
    ASSERT_EQ(loaded->units[u].size(), params[u].size());
    EXPECT_EQ(std::memcmp(loaded->units[u].data(), params[u].data(), params[u].size() * 4), 0)
        << "unit " << u;
  }
  EXPECT_EQ(loaded->spec.model().num_layers(), 2);

  // The same checkpoint as a Hugging Face directory, sharded: imported back bit for bit.
  const std::string hf_dir = dir_.File("hf");
  r = Trainctl({"checkpoint", "export", "job-x", "30", "--format", "hf", "--out", hf_dir,
                "--max-shard-bytes", "3000"});
  ASSERT_EQ(r.exit_code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr(hf_dir));
  EXPECT_TRUE(std::filesystem::exists(hf_dir + "/model.safetensors.index.json"));
  auto importer = hf::HfImporter::Open(hf_dir, spec.model());
  ASSERT_TRUE(importer.ok()) << importer.status();
  for (int u = 0; u < units; ++u) {
    std::vector<float> unit(params[u].size());
    ASSERT_TRUE((*importer)->ReadParams(u, 0, unit.size(), unit.data()).ok());
    EXPECT_EQ(std::memcmp(unit.data(), params[u].data(), unit.size() * 4), 0) << "unit " << u;
  }
  r = Trainctl({"checkpoint", "export", "job-x", "30", "--format", "hf", "--out", hf_dir});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("not an empty directory")) << Describe(r);

  // A checkpoint that is not a GPT model says so.
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-y", 1, 1, MixedTensors()));
  r = Trainctl({"checkpoint", "export", "job-y", "1", "--out", dir_.File("y.safetensors")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("no GPT model parameters")) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("u0.params")) << Describe(r);
  r = Trainctl({"checkpoint", "export", "job-x", "31", "--out", dir_.File("z.safetensors")});
  EXPECT_EQ(r.exit_code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("step 31")) << Describe(r);
}

}  // namespace
}  // namespace weft
