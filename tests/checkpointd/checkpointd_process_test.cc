// weft-checkpointd as a real process on 127.0.0.1: write, commit, list, resharded reads,
// refusals of bad input, crash during a write, on-disk corruption, retention and pins, a full
// disk.
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/crc32c.h"
#include "common/rpc.h"
#include "common/security.h"
#include "common/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/small_disk.h"
#include "tests/testing/subprocess.h"
#include "weft/v1/checkpoint.grpc.pb.h"

namespace weft {
namespace {

using testing::Subprocess;
using testing::TempDir;
using ::testing::HasSubstr;

// A weft-checkpointd process over `data_dir`; restartable on the same directory.
class Daemon {
 public:
  explicit Daemon(std::string data_dir, std::vector<std::string> extra_args = {})
      : dir_(std::move(data_dir)), extra_args_(std::move(extra_args)) {}

  absl::Status Start() {
    static int counter = 0;
    const std::string tag = absl::StrCat(counter++);
    const std::string port_file = absl::StrCat(dir_, "/.port-", tag);
    const std::string metrics_file = absl::StrCat(dir_, "/.metrics-", tag);
    log_ = absl::StrCat(dir_, "/checkpointd-", tag, ".log");
    std::filesystem::create_directories(dir_);
    std::vector<std::string> argv = {
        testing::BinDir() + "/weft-checkpointd", "--listen=127.0.0.1:0",
        "--port-file=" + port_file, "--data-dir=" + dir_ + "/db",
        "--metrics-address=127.0.0.1:0", "--metrics-port-file=" + metrics_file,
        "--log-level=debug"};
    argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
    auto proc = Subprocess::Start(argv, log_);
    if (!proc.ok()) return proc.status();
    process_ = std::move(*proc);
    auto port = testing::WaitForFile(port_file, absl::Seconds(30));
    if (!port.ok()) {
      return absl::UnavailableError(absl::StrCat("no start: ", testing::ReadFile(log_)));
    }
    auto mport = testing::WaitForFile(metrics_file, absl::Seconds(10));
    if (!mport.ok()) return mport.status();
    address_ = absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*port));
    metrics_ = absl::StrCat("127.0.0.1:", absl::StripAsciiWhitespace(*mport));
    std::remove(port_file.c_str());
    std::remove(metrics_file.c_str());
    ChannelOptions options;
    options.private_connection = true;
    stub_ = v1::Checkpoint::NewStub(MakeChannel(address_, options));
    return absl::OkStatus();
  }
  // SIGTERM (clean) or SIGKILL, then wait.
  void Stop(int signo) {
    process_->Signal(signo);
    auto rc = process_->Wait(absl::Seconds(30));
    ASSERT_TRUE(rc.ok()) << rc.status();
    if (signo == SIGTERM) {
      EXPECT_EQ(*rc, 0) << testing::ReadFile(log_);
    }
    stub_.reset();
  }

  v1::Checkpoint::Stub* stub() { return stub_.get(); }  // sends no bearer token
  // A stub of its own connection that sends `token` on every call.
  std::unique_ptr<v1::Checkpoint::Stub> StubWithToken(const std::string& token) {
    auto security = LoadSecurity({}, token);
    EXPECT_TRUE(security.ok()) << security.status();
    securities_.push_back(std::make_unique<Security>(*security));
    return v1::Checkpoint::NewStub(MakeChannel(
        address_, {.private_connection = true, .security = securities_.back().get()}));
  }
  const std::string& metrics() const { return metrics_; }
  const std::string& dir() const { return dir_; }
  Subprocess& process() { return *process_; }

 private:
  std::string dir_;
  std::vector<std::string> extra_args_;
  std::vector<std::unique_ptr<Security>> securities_;  // of StubWithToken's channels
  std::string log_;
  std::string address_;
  std::string metrics_;
  std::unique_ptr<Subprocess> process_;
  std::unique_ptr<v1::Checkpoint::Stub> stub_;
};

struct Tensor {
  v1::TensorLayout layout;
  std::string bytes;  // the whole tensor, little-endian
  int es = 1;
  int64_t numel() const { return static_cast<int64_t>(bytes.size()) / es; }
};

Tensor MakeTensor(const std::string& name, v1::DType dtype, std::vector<int64_t> shape,
                  uint64_t seed) {
  Tensor t;
  t.layout.set_name(name);
  t.layout.set_dtype(dtype);
  int64_t n = 1;
  for (int64_t d : shape) {
    t.layout.add_shape(d);
    n *= d;
  }
  t.es = dtype == v1::DTYPE_F32 ? 4 : dtype == v1::DTYPE_BF16 ? 2 : 1;
  t.bytes.resize(n * t.es);
  std::mt19937_64 rng(seed);
  for (auto& c : t.bytes) c = static_cast<char>(rng());
  return t;
}

v1::ShardChunk Chunk(const Tensor& t, int64_t begin, int64_t end) {
  v1::ShardChunk c;
  c.set_tensor(t.layout.name());
  c.set_offset_elements(begin);
  c.set_data(t.bytes.substr(begin * t.es, (end - begin) * t.es));
  c.set_crc32c(Crc32c(c.data().data(), c.data().size()));
  return c;
}

// Rank `rank` of `world` holds [rank*n/world, (rank+1)*n/world) of every tensor.
std::pair<int64_t, int64_t> Split(int64_t n, int rank, int world) {
  return {n * rank / world, n * (rank + 1) / world};
}

v1::ShardHeader Header(const std::string& job, int64_t step, int rank, int world,
                       const std::vector<Tensor>& tensors) {
  v1::ShardHeader h;
  h.set_job_id(job);
  h.set_step(step);
  h.set_rank(rank);
  h.set_world_size(world);
  for (const Tensor& t : tensors) {
    *h.add_tensors() = t.layout;
    auto [b, e] = Split(t.numel(), rank, world);
    if (b == e) continue;
    auto* r = h.add_ranges();
    r->set_tensor(t.layout.name());
    r->set_begin(b);
    r->set_end(e);
  }
  return h;
}

// Sends `messages` as one WriteShard stream.
grpc::Status SendStream(v1::Checkpoint::Stub* stub,
                        const std::vector<v1::WriteShardRequest>& messages,
                        int64_t* bytes = nullptr) {
  grpc::ClientContext context;
  SetTimeout(&context, absl::Seconds(60));
  v1::WriteShardResponse response;
  auto writer = stub->WriteShard(&context, &response);
  for (const auto& m : messages) {
    if (!writer->Write(m)) break;
  }
  writer->WritesDone();
  grpc::Status s = writer->Finish();
  if (bytes) *bytes = response.bytes_written();
  return s;
}

std::vector<v1::WriteShardRequest> ShardMessages(const v1::ShardHeader& h,
                                                 const std::vector<Tensor>& tensors,
                                                 int64_t chunk_elems) {
  std::vector<v1::WriteShardRequest> out(1);
  *out[0].mutable_header() = h;
  for (const auto& r : h.ranges()) {
    const Tensor& t = *std::find_if(tensors.begin(), tensors.end(), [&](const Tensor& x) {
      return x.layout.name() == r.tensor();
    });
    for (int64_t b = r.begin(); b < r.end(); b += chunk_elems) {
      out.emplace_back();
      *out.back().mutable_chunk() = Chunk(t, b, std::min(r.end(), b + chunk_elems));
    }
  }
  return out;
}

grpc::Status WriteRank(v1::Checkpoint::Stub* stub, const std::string& job, int64_t step,
                       int rank, int world, const std::vector<Tensor>& tensors,
                       int64_t chunk_elems = 10007) {
  return SendStream(stub, ShardMessages(Header(job, step, rank, world, tensors), tensors,
                                        chunk_elems));
}

v1::CheckpointManifest Manifest(const std::string& job, int64_t step, int world,
                                const std::vector<Tensor>& tensors, int keep_last = 0) {
  v1::CheckpointManifest m;
  m.set_job_id(job);
  m.set_step(step);
  m.set_world_size(world);
  m.set_optimizer_step(step);
  for (const Tensor& t : tensors) *m.add_tensors() = t.layout;
  for (int r = 0; r < world; ++r) {
    auto* rs = m.add_ranks();
    rs->set_rank(r);
    rs->set_data_position(1000 * step + r);
    rs->set_rng_state(absl::StrCat("rng-", r));
  }
  if (keep_last > 0) m.mutable_spec()->mutable_checkpoint()->set_keep_last(keep_last);
  return m;
}

grpc::Status Commit(v1::Checkpoint::Stub* stub, const v1::CheckpointManifest& m) {
  grpc::ClientContext context;
  SetTimeout(&context, absl::Seconds(30));
  v1::CommitCheckpointRequest request;
  *request.mutable_manifest() = m;
  v1::CommitCheckpointResponse response;
  return stub->CommitCheckpoint(&context, request, &response);
}

// Reads [begin, end) of `tensor`; checks every piece's CRC and contiguity.
grpc::Status Read(v1::Checkpoint::Stub* stub, const std::string& job, int64_t step,
                  const std::string& tensor, int64_t begin, int64_t end, int es,
                  std::string* out) {
  grpc::ClientContext context;
  SetTimeout(&context, absl::Seconds(60));
  v1::ReadRangeRequest request;
  request.set_job_id(job);
  request.set_step(step);
  request.set_tensor(tensor);
  request.set_begin(begin);
  request.set_end(end);
  auto reader = stub->ReadRange(&context, request);
  v1::ReadRangeResponse response;
  int64_t pos = begin;
  out->clear();
  while (reader->Read(&response)) {
    const auto& c = response.chunk();
    EXPECT_EQ(c.tensor(), tensor);
    EXPECT_EQ(c.offset_elements(), pos);
    EXPECT_EQ(Crc32c(c.data().data(), c.data().size()), c.crc32c());
    EXPECT_LE(c.data().size(), 4u << 20);
    pos += static_cast<int64_t>(c.data().size()) / es;
    out->append(c.data());
  }
  return reader->Finish();
}

std::vector<int64_t> ListSteps(v1::Checkpoint::Stub* stub, const std::string& job) {
  grpc::ClientContext context;
  SetTimeout(&context, absl::Seconds(30));
  v1::ListCheckpointsRequest request;
  request.set_job_id(job);
  v1::ListCheckpointsResponse response;
  grpc::Status s = stub->ListCheckpoints(&context, request, &response);
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<int64_t> steps;
  for (const auto& m : response.checkpoints()) steps.push_back(m.step());
  return steps;
}

grpc::Status Pin(v1::Checkpoint::Stub* stub, const std::string& job, int64_t step, bool pin) {
  grpc::ClientContext context;
  v1::SetPinnedRequest request;
  request.set_job_id(job);
  request.set_step(step);
  request.set_pinned(pin);
  v1::SetPinnedResponse response;
  return stub->SetPinned(&context, request, &response);
}

grpc::Status Delete(v1::Checkpoint::Stub* stub, const std::string& job, int64_t step) {
  grpc::ClientContext context;
  v1::DeleteCheckpointRequest request;
  request.set_job_id(job);
  request.set_step(step);
  v1::DeleteCheckpointResponse response;
  return stub->DeleteCheckpoint(&context, request, &response);
}

class CheckpointdTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(daemon_.Start().ok()); }
  std::vector<Tensor> SmallTensors(uint64_t seed) {
    return {MakeTensor("w", v1::DTYPE_F32, {300, 1000}, seed),
            MakeTensor("b", v1::DTYPE_BF16, {777}, seed + 1),
            MakeTensor("m", v1::DTYPE_U8, {5, 1001}, seed + 2),
            MakeTensor("s", v1::DTYPE_F32, {}, seed + 3)};  // a scalar: only rank 0 holds it
  }
  void WriteAndCommit(const std::string& job, int64_t step, int world,
                      const std::vector<Tensor>& tensors, int keep_last = 0) {
    for (int r = 0; r < world; ++r) {
      grpc::Status s = WriteRank(daemon_.stub(), job, step, r, world, tensors);
      ASSERT_TRUE(s.ok()) << s.error_message();
    }
    grpc::Status s = Commit(daemon_.stub(), Manifest(job, step, world, tensors, keep_last));
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  TempDir tmp_;
  Daemon daemon_{tmp_.path()};
};

TEST_F(CheckpointdTest, WriteCommitListAndReadAtOtherWorldSizes) {
  const auto tensors = SmallTensors(1);
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-a", 100, 2, tensors));
  EXPECT_THAT(ListSteps(daemon_.stub(), "job-a"), ::testing::ElementsAre(100));
  EXPECT_TRUE(ListSteps(daemon_.stub(), "job-other").empty());

  grpc::ClientContext context;
  v1::GetManifestRequest request;
  request.set_job_id("job-a");  // step 0: latest
  v1::CheckpointManifest m;
  ASSERT_TRUE(daemon_.stub()->GetManifest(&context, request, &m).ok());
  EXPECT_EQ(m.step(), 100);
  EXPECT_EQ(m.world_size(), 2);
  ASSERT_EQ(m.ranks_size(), 2);
  EXPECT_EQ(m.ranks(1).rng_state(), "rng-1");
  EXPECT_GT(m.ranks(1).ranges_size(), 0);
  EXPECT_TRUE(m.has_commit_time());
  int64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  EXPECT_EQ(m.total_bytes(), total);

  for (const Tensor& t : tensors) {
    for (int readers : {1, 2, 4, 3}) {
      std::string whole;
      for (int r = 0; r < readers; ++r) {
        auto [b, e] = Split(t.numel(), r, readers);
        std::string part;
        grpc::Status s = Read(daemon_.stub(), "job-a", 100, t.layout.name(), b, e, t.es, &part);
        ASSERT_TRUE(s.ok()) << s.error_message();
        ASSERT_EQ(part.size(), static_cast<size_t>((e - b) * t.es));
        whole += part;
      }
      EXPECT_TRUE(whole == t.bytes) << t.layout.name() << " with " << readers << " readers";
    }
  }
  // Random ranges, including empty ones and ones crossing chunk and rank boundaries.
  std::mt19937_64 rng(7);
  const Tensor& w = tensors[0];
  for (int i = 0; i < 20; ++i) {
    int64_t b = rng() % (w.numel() + 1), e = rng() % (w.numel() + 1);
    if (b > e) std::swap(b, e);
    std::string part;
    ASSERT_TRUE(Read(daemon_.stub(), "job-a", 100, "w", b, e, 4, &part).ok());
    EXPECT_TRUE(part == w.bytes.substr(b * 4, (e - b) * 4)) << b << ".." << e;
  }
  auto metrics = testing::HttpGet(daemon_.metrics(), "/metrics");
  ASSERT_TRUE(metrics.ok());
  EXPECT_THAT(*metrics, HasSubstr("weft_checkpointd_checkpoints_committed_total 1"));
  EXPECT_THAT(*metrics, HasSubstr("weft_checkpointd_save_seconds_count 2"));
  EXPECT_THAT(*metrics, HasSubstr("weft_checkpointd_bytes_read_total"));
  EXPECT_THAT(*metrics, HasSubstr("weft_checkpointd_restore_seconds"));
  EXPECT_THAT(*metrics, HasSubstr("weft_checkpointd_store_bytes"));
}

TEST_F(CheckpointdTest, BadReadsAreRefused) {
  const auto tensors = SmallTensors(2);
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-r", 5, 2, tensors));
  std::string out;
  auto* stub = daemon_.stub();
  EXPECT_EQ(Read(stub, "job-r", 5, "w", 0, 300001, 4, &out).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Read(stub, "job-r", 5, "w", 10, 5, 4, &out).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Read(stub, "job-r", 5, "w", -1, 5, 4, &out).error_code(),
            grpc::StatusCode::OUT_OF_RANGE);
  EXPECT_EQ(Read(stub, "job-r", 5, "nope", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Read(stub, "job-r", 6, "w", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Read(stub, "other", 5, "w", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Read(stub, "", 5, "w", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(stub, "a/b", 5, "w", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Read(stub, "job-r", -3, "w", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  grpc::ClientContext context;
  v1::GetManifestRequest request;
  request.set_job_id("job-none");
  v1::CheckpointManifest m;
  EXPECT_EQ(daemon_.stub()->GetManifest(&context, request, &m).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(CheckpointdTest, CommitWithMissingRanksIsRefused) {
  const auto tensors = SmallTensors(3);
  ASSERT_TRUE(WriteRank(daemon_.stub(), "job-m", 7, 0, 3, tensors).ok());
  grpc::Status s = Commit(daemon_.stub(), Manifest("job-m", 7, 3, tensors));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("ranks 1, 2"));
  EXPECT_TRUE(ListSteps(daemon_.stub(), "job-m").empty());
  // The missing ranks arrive: now it commits.
  ASSERT_TRUE(WriteRank(daemon_.stub(), "job-m", 7, 1, 3, tensors).ok());
  ASSERT_TRUE(WriteRank(daemon_.stub(), "job-m", 7, 2, 3, tensors).ok());
  // A manifest that disagrees with what the ranks wrote is refused too.
  auto bad = Manifest("job-m", 7, 3, tensors);
  bad.mutable_tensors(0)->set_dtype(v1::DTYPE_BF16);
  EXPECT_EQ(Commit(daemon_.stub(), bad).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  auto bad_world = Manifest("job-m", 7, 2, tensors);
  EXPECT_EQ(Commit(daemon_.stub(), bad_world).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  auto missing_tensor = Manifest("job-m", 7, 3, {tensors[0], tensors[1], tensors[2]});
  EXPECT_EQ(Commit(daemon_.stub(), missing_tensor).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  auto invalid = Manifest("job-m", 7, 3, tensors);
  invalid.set_world_size(0);
  EXPECT_EQ(Commit(daemon_.stub(), invalid).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  for (int64_t optimizer_step : {int64_t{-1}, int64_t{8}}) {  // more updates than steps
    auto bad_count = Manifest("job-m", 7, 3, tensors);
    bad_count.set_optimizer_step(optimizer_step);
    const grpc::Status refused = Commit(daemon_.stub(), bad_count);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(refused.error_message(), ::testing::HasSubstr("manifest.optimizer_step"));
  }
  EXPECT_TRUE(ListSteps(daemon_.stub(), "job-m").empty());
  ASSERT_TRUE(Commit(daemon_.stub(), Manifest("job-m", 7, 3, tensors)).ok());
  EXPECT_EQ(Commit(daemon_.stub(), Manifest("job-m", 7, 3, tensors)).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  // A committed checkpoint takes no more shards.
  EXPECT_EQ(WriteRank(daemon_.stub(), "job-m", 7, 0, 3, tensors).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(ListSteps(daemon_.stub(), "job-m"), ::testing::ElementsAre(7));
}

TEST_F(CheckpointdTest, BadStreamsAreRefusedAndLeaveNothing) {
  const auto tensors = SmallTensors(4);
  auto* stub = daemon_.stub();
  const auto good = ShardMessages(Header("job-b", 9, 0, 1, tensors), tensors, 50000);

  auto bad_crc = good;
  bad_crc[3].mutable_chunk()->set_crc32c(bad_crc[3].chunk().crc32c() ^ 1);
  grpc::Status s = SendStream(stub, bad_crc);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("CRC32C"));

  std::vector<std::pair<std::string, std::vector<v1::WriteShardRequest>>> cases;
  cases.push_back({"empty stream", {}});
  cases.push_back({"chunk first", {good[1]}});
  {
    auto m = good;
    m[0].mutable_header()->set_rank(1);
    cases.push_back({"rank out of range", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->set_rank(-1);
    cases.push_back({"negative rank", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->set_step(-1);
    cases.push_back({"negative step", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->set_job_id("");
    cases.push_back({"no job", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->set_job_id("x/y");
    cases.push_back({"slash in job", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->mutable_ranges(0)->set_end(m[0].header().ranges(0).begin());
    cases.push_back({"empty range", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->mutable_ranges(0)->set_end(300001);
    cases.push_back({"range past end", m});
  }
  {
    auto m = good;
    *m[0].mutable_header()->add_ranges() = m[0].header().ranges(0);
    cases.push_back({"overlapping ranges", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->mutable_tensors()->RemoveLast();
    cases.push_back({"range without layout", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->mutable_tensors(0)->set_dtype(v1::DTYPE_UNSPECIFIED);
    cases.push_back({"no dtype", m});
  }
  {
    auto m = good;
    m[0].mutable_header()->mutable_tensors(0)->set_shape(0, 0);
    cases.push_back({"zero dimension", m});
  }
  {
    auto m = good;
    std::swap(m[1], m[2]);
    cases.push_back({"chunks out of order", m});
  }
  {
    auto m = good;
    m.pop_back();
    cases.push_back({"stream ends early", m});
  }
  {
    auto m = good;
    m.push_back(good[1]);
    cases.push_back({"extra chunk", m});
  }
  {
    auto m = good;
    m.push_back(good[0]);
    cases.push_back({"second header", m});
  }
  {
    auto m = good;
    auto* c = m[1].mutable_chunk();
    c->mutable_data()->push_back('x');  // not whole f32 elements
    c->set_crc32c(Crc32c(c->data().data(), c->data().size()));
    cases.push_back({"partial element", m});
  }
  {
    // One chunk of 5 MiB: over the limit.
    const std::vector<Tensor> big = {MakeTensor("big", v1::DTYPE_F32, {2 << 20}, 9)};
    auto m = ShardMessages(Header("job-b", 9, 0, 1, big), big, 1310720);
    cases.push_back({"oversized chunk", m});
  }
  {
    auto m = good;
    m[1].mutable_chunk()->set_tensor("b");
    cases.push_back({"wrong tensor", m});
  }
  for (const auto& [name, messages] : cases) {
    grpc::Status st = SendStream(stub, messages);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << name << ": " << st.error_code() << " " << st.error_message();
  }
  // Nothing of the failed streams counts as a written shard.
  s = Commit(stub, Manifest("job-b", 9, 1, tensors));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("ranks 0"));
  EXPECT_TRUE(ListSteps(stub, "job-b").empty());
  // A good stream after all that commits and reads back.
  int64_t bytes = 0;
  ASSERT_TRUE(SendStream(stub, good, &bytes).ok());
  int64_t total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  EXPECT_EQ(bytes, total);
  ASSERT_TRUE(Commit(stub, Manifest("job-b", 9, 1, tensors)).ok());
  std::string out;
  ASSERT_TRUE(Read(stub, "job-b", 9, "w", 0, tensors[0].numel(), 4, &out).ok());
  EXPECT_TRUE(out == tensors[0].bytes);
}

TEST_F(CheckpointdTest, RetentionKeepsLastKPlusPinned) {
  const std::vector<Tensor> tensors = {MakeTensor("w", v1::DTYPE_F32, {1000}, 5)};
  auto* stub = daemon_.stub();
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-k", 10, 2, tensors, 2));
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-k", 20, 2, tensors, 2));
  ASSERT_TRUE(Pin(stub, "job-k", 10, true).ok());
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-k", 30, 2, tensors, 2));
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-k", 40, 2, tensors, 2));
  EXPECT_THAT(ListSteps(stub, "job-k"), ::testing::ElementsAre(40, 30, 10));
  std::string out;
  EXPECT_EQ(Read(stub, "job-k", 20, "w", 0, 10, 4, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(Read(stub, "job-k", 10, "w", 0, 1000, 4, &out).ok());
  EXPECT_TRUE(out == tensors[0].bytes);

  grpc::Status s = Delete(stub, "job-k", 10);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("pinned"));
  EXPECT_EQ(Pin(stub, "job-k", 20, true).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Pin(stub, "", 20, true).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Delete(stub, "job-k", 20).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Delete(stub, "a/b", 20).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Pin(stub, "job-k", 10, false).ok());
  ASSERT_TRUE(Delete(stub, "job-k", 10).ok());
  EXPECT_EQ(Delete(stub, "job-k", 10).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(ListSteps(stub, "job-k"), ::testing::ElementsAre(40, 30));
  EXPECT_EQ(Read(stub, "job-k", 10, "w", 0, 10, 4, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  // Deleting the latest makes the previous one the latest.
  ASSERT_TRUE(Delete(stub, "job-k", 40).ok());
  grpc::ClientContext context;
  v1::GetManifestRequest request;
  request.set_job_id("job-k");
  v1::CheckpointManifest m;
  ASSERT_TRUE(stub->GetManifest(&context, request, &m).ok());
  EXPECT_EQ(m.step(), 30);
}

TEST_F(CheckpointdTest, KillDuringWriteKeepsPreviousCheckpoint) {
  const std::vector<Tensor> small = {MakeTensor("w", v1::DTYPE_F32, {4096}, 6)};
  ASSERT_NO_FATAL_FAILURE(WriteAndCommit("job-c", 1, 1, small));
  // Step 2: 64 MiB sent slowly in 1 MiB chunks; the daemon is killed part way.
  std::vector<Tensor> big = {MakeTensor("w", v1::DTYPE_F32, {4096}, 6),
                             MakeTensor("big", v1::DTYPE_U8, {64 << 20}, 7)};
  const auto header = Header("job-c", 2, 0, 1, big);
  std::atomic<int> sent{0};
  std::atomic<bool> writer_done{false};
  grpc::Status finished;  // written before writer_done is set
  std::thread writer([&] {
    grpc::ClientContext context;
    v1::WriteShardResponse response;
    auto stream = daemon_.stub()->WriteShard(&context, &response);
    v1::WriteShardRequest m;
    *m.mutable_header() = header;
    stream->Write(m);
    for (const auto& r : header.ranges()) {
      const Tensor& t = r.tensor() == "w" ? big[0] : big[1];
      for (int64_t b = r.begin(); b < r.end(); b += (1 << 20) / t.es) {
        *m.mutable_chunk() = Chunk(t, b, std::min(r.end(), b + (1 << 20) / t.es));
        if (!stream->Write(m)) break;
        ++sent;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    stream->WritesDone();
    finished = stream->Finish();
    writer_done.store(true);
  });
  // Whatever fails below, the writer is not left running (or its thread unjoined).
  absl::Cleanup stop_writer = [&] {
    if (!writer.joinable()) return;
    daemon_.Stop(SIGKILL);
    writer.join();
  };
  // A loaded machine may take a while to take 20 MiB; a stream that ends first says why.
  ASSERT_TRUE(testing::Eventually([&] { return sent.load() >= 20 || writer_done.load(); },
                                  absl::Seconds(120)));
  ASSERT_FALSE(writer_done.load()) << "the write ended after " << sent.load()
                                   << " chunks, before the kill: " << finished.error_message();
  daemon_.Stop(SIGKILL);
  writer.join();
  EXPECT_FALSE(finished.ok());
  ASSERT_TRUE(daemon_.Start().ok());
  EXPECT_THAT(ListSteps(daemon_.stub(), "job-c"), ::testing::ElementsAre(1));
  std::string out;
  ASSERT_TRUE(Read(daemon_.stub(), "job-c", 1, "w", 0, 4096, 4, &out).ok());
  EXPECT_TRUE(out == small[0].bytes);
  // The interrupted shard was dropped at startup: the step cannot be committed.
  grpc::Status s = Commit(daemon_.stub(), Manifest("job-c", 2, 1, big));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_EQ(Read(daemon_.stub(), "job-c", 2, "w", 0, 1, 4, &out).error_code(),
            grpc::StatusCode::NOT_FOUND);
  daemon_.Stop(SIGTERM);
}

TEST_F(CheckpointdTest, CorruptedDataOnDiskIsDataLoss) {
  // A recognisable 2 MiB u8 tensor in 1 MiB chunks: its values land in blob files.
  Tensor t;
  t.layout.set_name("pattern");
  t.layout.set_dtype(v1::DTYPE_U8);
  t.layout.add_shape(2 << 20);
  const std::string marker = "WEFT-CORRUPTION-PATTERN-";
  while (t.bytes.size() < (2u << 20)) t.bytes += marker;
  t.bytes.resize(2 << 20);
  const std::vector<Tensor> tensors = {t};
  ASSERT_TRUE(WriteRank(daemon_.stub(), "job-x", 3, 0, 1, tensors, 1 << 20).ok());
  ASSERT_TRUE(Commit(daemon_.stub(), Manifest("job-x", 3, 1, tensors)).ok());
  daemon_.Stop(SIGTERM);

  bool flipped = false;
  for (const auto& entry : std::filesystem::directory_iterator(daemon_.dir() + "/db")) {
    if (entry.path().extension() != ".blob") continue;
    std::string contents = testing::ReadFile(entry.path());
    const size_t at = contents.find(marker + marker);
    if (at == std::string::npos) continue;
    std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at + 5));
    const char c = contents[at + 5] ^ 0x20;
    f.write(&c, 1);
    flipped = true;
    break;
  }
  ASSERT_TRUE(flipped) << "pattern not found in any blob file";
  ASSERT_TRUE(daemon_.Start().ok());
  std::string out;
  grpc::Status s = Read(daemon_.stub(), "job-x", 3, "pattern", 0, 2 << 20, 1, &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DATA_LOSS) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("pattern"));
  EXPECT_THAT(s.error_message(), HasSubstr("step 3"));
  std::fprintf(stderr, "corruption reported as: %s\n", s.error_message().c_str());
  // The listing is still served; only that tensor's data is lost.
  EXPECT_THAT(ListSteps(daemon_.stub(), "job-x"), ::testing::ElementsAre(3));
}

// A full disk (a real one: an 8 MiB tmpfs) refuses saves with RESOURCE_EXHAUSTED naming the
// free and needed bytes, while listing, reading and deleting go on; deleting frees space, and
// the daemon starts again on the disk even when something else has filled it to the last
// byte. Needs root (mount); skips otherwise.
TEST(CheckpointdFullDiskTest, RefusesSavesKeepsServingFreesSpaceAndRestarts) {
  TempDir tmp;
  auto disk = testing::SmallDisk::Mount(tmp.File("db"), 8 << 20);
  if (!disk.ok()) GTEST_SKIP() << disk.status();
  // A quarter of the reserve (512 KiB) is the ballast.
  Daemon daemon(tmp.path(), {"--disk-reserve-bytes=2097152"});
  ASSERT_TRUE(daemon.Start().ok());
  // 1 MiB a checkpoint, until the disk refuses one.
  std::map<int64_t, Tensor> saved;
  grpc::Status refused;
  for (int64_t step = 1; step <= 20; ++step) {
    const std::vector<Tensor> tensors = {MakeTensor("w", v1::DTYPE_F32, {256 << 10}, step)};
    refused = WriteRank(daemon.stub(), "job-f", step, 0, 1, tensors, 64 << 10);
    if (!refused.ok()) break;
    const grpc::Status s = Commit(daemon.stub(), Manifest("job-f", step, 1, tensors));
    ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.error_message();
    saved.emplace(step, tensors[0]);
  }
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr(" bytes free, "));
  EXPECT_THAT(refused.error_message(), HasSubstr(" needed (1048576 to write"));
  std::fprintf(stderr, "refused as: %s\n", refused.error_message().c_str());
  ASSERT_GE(saved.size(), 3u);

  auto expect_serving = [&] {
    std::vector<int64_t> steps;
    for (const auto& [step, t] : saved) steps.insert(steps.begin(), step);
    EXPECT_EQ(ListSteps(daemon.stub(), "job-f"), steps);
    for (const auto& [step, t] : saved) {
      std::string out;
      const grpc::Status s = Read(daemon.stub(), "job-f", step, "w", 0, t.numel(), 4, &out);
      ASSERT_TRUE(s.ok()) << "step " << step << ": " << s.error_message();
      EXPECT_TRUE(out == t.bytes) << "step " << step;
    }
  };
  ASSERT_NO_FATAL_FAILURE(expect_serving());

  // Something else takes the rest of the disk, to the last byte: deleting still works, and
  // gives the checkpoint's space back at once.
  ASSERT_TRUE(disk.value()->Fill("filler-1").ok());
  const int64_t full = (*disk)->FreeBytes();
  EXPECT_LT(full, 4096);
  ASSERT_TRUE(Delete(daemon.stub(), "job-f", saved.begin()->first).ok());
  saved.erase(saved.begin());
  EXPECT_GE((*disk)->FreeBytes() - full, 512 << 10);
  ASSERT_NO_FATAL_FAILURE(expect_serving());

  // Killed, and started again on the disk full to the last byte: it serves.
  ASSERT_TRUE((*disk)->Fill("filler-2").ok());
  daemon.Stop(SIGKILL);
  const absl::Status started = daemon.Start();
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_NO_FATAL_FAILURE(expect_serving());
  const std::vector<Tensor> next = {MakeTensor("w", v1::DTYPE_F32, {256 << 10}, 99)};
  EXPECT_EQ(WriteRank(daemon.stub(), "job-f", 100, 0, 1, next).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(Delete(daemon.stub(), "job-f", saved.begin()->first).ok());
  saved.erase(saved.begin());

  // Once the other files are gone, saves go on (the store did not stay broken).
  std::filesystem::remove((*disk)->path() + "/filler-1");
  std::filesystem::remove((*disk)->path() + "/filler-2");
  ASSERT_TRUE(WriteRank(daemon.stub(), "job-f", 100, 0, 1, next).ok());
  ASSERT_TRUE(Commit(daemon.stub(), Manifest("job-f", 100, 1, next)).ok());
  saved.emplace(100, next[0]);
  ASSERT_NO_FATAL_FAILURE(expect_serving());
  daemon.Stop(SIGTERM);
}

// With --auth-tokens-file, checkpointd refuses every call that lacks an accepted bearer token,
// as the coordinator does (same status, same messages), before the store sees it.
TEST(CheckpointdAuthTest, CallsWithoutAnAcceptedTokenAreRefusedAndStoreNothing) {
  TempDir tmp;
  constexpr char kToken[] = "checkpointd-test-token-5e0c";
  testing::WriteFile(tmp.File("tokens"), absl::StrCat("# workers\n", kToken, "\n"));
  Daemon daemon(tmp.File("d"), {"--auth-tokens-file=" + tmp.File("tokens")});
  ASSERT_TRUE(daemon.Start().ok());
  const std::vector<Tensor> tensors = {MakeTensor("w", v1::DTYPE_F32, {100, 10}, 7)};
  auto wrong = daemon.StubWithToken("not-the-token-of-the-file");
  auto right = daemon.StubWithToken(kToken);
  const std::vector<std::pair<v1::Checkpoint::Stub*, std::string>> refused = {
      {daemon.stub(), "missing bearer token"}, {wrong.get(), "bearer token not accepted"}};
  for (const auto& [stub, message] : refused) {
    SCOPED_TRACE(message);
    auto expect_refused = [&](const grpc::Status& s) {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr(message));
    };
    expect_refused(WriteRank(stub, "job-t", 10, 0, 1, tensors));
    expect_refused(Commit(stub, Manifest("job-t", 10, 1, tensors)));
    std::string out;
    expect_refused(Read(stub, "job-t", 10, "w", 0, 10, 4, &out));
    expect_refused(Pin(stub, "job-t", 10, true));
    expect_refused(Delete(stub, "job-t", 10));
    grpc::ClientContext context;
    v1::ListCheckpointsRequest list;
    list.set_job_id("job-t");
    v1::ListCheckpointsResponse response;
    expect_refused(stub->ListCheckpoints(&context, list, &response));
  }
  // The refused shard was not stored: committing it with the right token finds no rank 0.
  EXPECT_FALSE(Commit(right.get(), Manifest("job-t", 10, 1, tensors)).ok());
  EXPECT_TRUE(ListSteps(right.get(), "job-t").empty());

  ASSERT_TRUE(WriteRank(right.get(), "job-t", 10, 0, 1, tensors).ok());
  ASSERT_TRUE(Commit(right.get(), Manifest("job-t", 10, 1, tensors)).ok());
  EXPECT_THAT(ListSteps(right.get(), "job-t"), ::testing::ElementsAre(10));
  std::string out;
  ASSERT_TRUE(Read(right.get(), "job-t", 10, "w", 0, 1000, 4, &out).ok());
  EXPECT_EQ(out, tensors[0].bytes);
}

// A second checkpointd may neither share a served port (clients would alternate between two
// stores) nor the data directory of a running one; either fails at once, naming the port or
// the directory and its holder.
TEST(CheckpointdExclusiveTest, ASecondDaemonOnAServedPortOrTheSameDataDirectoryExits) {
  TempDir tmp;
  auto first = testing::CheckpointdProcess::Start(tmp.File("first"));
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string listen = (*first)->address();
  testing::CommandResult r = testing::RunCommand(
      {testing::BinDir() + "/weft-checkpointd", "--listen=" + listen,
       "--data-dir=" + tmp.File("second"), "--metrics-address=none"},
      {}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.err;  // not killed at the timeout, still serving
  EXPECT_THAT(r.err, ::testing::AllOf(HasSubstr("--listen " + listen),
                                      HasSubstr(absl::StrCat("port ", (*first)->port())),
                                      HasSubstr("Address already in use")));

  const std::string dir = tmp.File("first") + "/db";  // CheckpointdProcess's
  r = testing::RunCommand({testing::BinDir() + "/weft-checkpointd", "--listen=127.0.0.1:0",
                           "--data-dir=" + dir, "--metrics-address=none"},
                          {}, absl::Seconds(20));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, ::testing::AllOf(
                         HasSubstr("--data-dir " + dir),
                         HasSubstr(absl::StrCat("in use by weft-checkpointd (pid ",
                                                (*first)->process().pid(), ")"))));
  EXPECT_TRUE((*first)->process().Running());
}

TEST(CheckpointdAuthTest, BadTokenFileStopsTheDaemonNamingTheFlag) {
  TempDir tmp;
  testing::WriteFile(tmp.File("short"), "short\n");
  for (const auto& [file, message] : std::vector<std::pair<std::string, std::string>>{
           {tmp.File("missing"), ": cannot read"},
           {tmp.File("short"), ":1: a token must be 16-4096 printable characters"}}) {
    const testing::CommandResult r = testing::RunCommand(
        {testing::BinDir() + "/weft-checkpointd", "--listen=127.0.0.1:0",
         "--data-dir=" + tmp.File("db"), "--metrics-address=none",
         "--auth-tokens-file=" + file});
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--auth-tokens-file " + file + message));
  }
}

}  // namespace
}  // namespace weft
