// CheckpointStore in-process: checks that need the database itself (a stored value whose own
// CRC32C fails, the sweep of uncommitted data, concurrent streams of one rank).
#include "checkpointd/store.h"

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/crc32c.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "tests/testing/subprocess.h"

namespace weft::checkpointd {
namespace {

using ::testing::HasSubstr;

v1::ShardHeader Header(int64_t step, int rank, int world, int64_t numel) {
  v1::ShardHeader h;
  h.set_job_id("j");
  h.set_step(step);
  h.set_rank(rank);
  h.set_world_size(world);
  auto* t = h.add_tensors();
  t->set_name("t");
  t->set_dtype(v1::DTYPE_U8);
  t->add_shape(numel);
  auto* r = h.add_ranges();
  r->set_tensor("t");
  r->set_begin(numel * rank / world);
  r->set_end(numel * (rank + 1) / world);
  return h;
}

v1::ShardChunk Chunk(int64_t begin, int64_t end) {
  v1::ShardChunk c;
  c.set_tensor("t");
  c.set_offset_elements(begin);
  std::string data(end - begin, '\0');
  for (int64_t i = begin; i < end; ++i) data[i - begin] = static_cast<char>(i * 7);
  c.set_data(data);
  c.set_crc32c(Crc32c(data.data(), data.size()));
  return c;
}

v1::CheckpointManifest Manifest(int64_t step, int world, int64_t numel) {
  v1::CheckpointManifest m;
  m.set_job_id("j");
  m.set_step(step);
  m.set_world_size(world);
  auto* t = m.add_tensors();
  t->set_name("t");
  t->set_dtype(v1::DTYPE_U8);
  t->add_shape(numel);
  return m;
}

absl::Status WriteRank(CheckpointStore* store, int64_t step, int rank, int world,
                       int64_t numel) {
  auto h = Header(step, rank, world, numel);
  auto w = store->BeginShard(h);
  if (!w.ok()) return w.status();
  const auto& r = h.ranges(0);
  for (int64_t b = r.begin(); b < r.end(); b += 1000) {
    if (auto s = (*w)->AddChunk(Chunk(b, std::min(r.end(), b + 1000))); !s.ok()) return s;
  }
  return (*w)->Finish().status();
}

class StoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<CheckpointStore> Open(absl::Duration grace = absl::Hours(1),
                                        absl::Duration open_stream_wait = absl::Seconds(10)) {
    StoreOptions options;
    options.data_dir = dir_.path() + "/db";
    options.gc_grace = grace;
    options.open_stream_wait = open_stream_wait;
    auto store = CheckpointStore::Open(options, std::make_shared<prometheus::Registry>());
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? std::move(*store) : nullptr;
  }
  testing::TempDir dir_;
};

TEST_F(StoreTest, StoredValueFailingItsOwnCrcIsDataLoss) {
  {
    auto store = Open();
    ASSERT_TRUE(WriteRank(store.get(), 4, 0, 1, 3000).ok());
    ASSERT_TRUE(store->Commit(Manifest(4, 1, 3000)).ok());
  }
  {
    // Rewrite one chunk's data keeping its old CRC, as a silent disk error would.
    rocksdb::DB* raw = nullptr;
    rocksdb::Options options;
    ASSERT_TRUE(rocksdb::DB::Open(options, dir_.path() + "/db", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    const std::string key =
        absl::StrFormat("ckpt/j/%020d/%06d/t/%020d", 4, 0, 1000);
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), key, &value).ok());
    value[10] ^= 1;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, value).ok());
  }
  auto store = Open();
  v1::ReadRangeRequest request;
  request.set_job_id("j");
  request.set_step(4);
  request.set_tensor("t");
  request.set_begin(0);
  request.set_end(999);
  EXPECT_TRUE(store->ReadRange(request, [](const v1::ShardChunk&) { return true; }).ok());
  request.set_end(3000);
  absl::Status s = store->ReadRange(request, [](const v1::ShardChunk&) { return true; });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("tensor t"));
  EXPECT_THAT(s.message(), HasSubstr("step 4"));
  EXPECT_THAT(s.message(), HasSubstr("CRC32C"));
}

TEST_F(StoreTest, SweepCollectsUncommittedDataPastGrace) {
  {
    auto store = Open(absl::Hours(1));
    ASSERT_TRUE(WriteRank(store.get(), 8, 0, 2, 3000).ok());
    ASSERT_TRUE(store->Sweep().ok());  // within grace: kept
    ASSERT_TRUE(WriteRank(store.get(), 8, 1, 2, 3000).ok());
    ASSERT_TRUE(store->Commit(Manifest(8, 2, 3000)).ok());
    ASSERT_TRUE(WriteRank(store.get(), 9, 0, 2, 3000).ok());
  }
  auto store = Open(absl::ZeroDuration());  // startup sweep with no grace
  ASSERT_TRUE(WriteRank(store.get(), 9, 1, 2, 3000).ok());
  absl::Status s = store->Commit(Manifest(9, 2, 3000)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("ranks 0 "));
  ASSERT_TRUE(store->Sweep().ok());
  s = store->Commit(Manifest(9, 2, 3000)).status();
  EXPECT_THAT(s.message(), HasSubstr("ranks 0, 1 "));
  // Committed data is never swept.
  auto list = store->List("j");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].step(), 8);
}

TEST_F(StoreTest, OneStreamPerRankAndAbandonedStreamsLeaveNothing) {
  auto store = Open(absl::Hours(1), absl::Milliseconds(50));
  auto first = store->BeginShard(Header(2, 0, 1, 3000));
  ASSERT_TRUE(first.ok());
  const absl::Time asked = absl::Now();
  auto second = store->BeginShard(Header(2, 0, 1, 3000));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(second.status().message(), HasSubstr("rank 0 is still open after 50ms"));
  EXPECT_GE(absl::Now() - asked, absl::Milliseconds(50)) << "it must wait before refusing";
  // A commit while a rank is still writing is refused.
  EXPECT_EQ(store->Commit(Manifest(2, 1, 3000)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*first)->AddChunk(Chunk(0, 1000)).ok());
  first->reset();  // the stream broke off
  EXPECT_EQ(store->Commit(Manifest(2, 1, 3000)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(WriteRank(store.get(), 2, 0, 1, 3000).ok());
  EXPECT_TRUE(store->Commit(Manifest(2, 1, 3000)).ok());
}

// A client that lost its connection mid-stream sends again before the daemon has seen the
// first stream die: the second stream waits for the first to end, then replaces what it left.
TEST_F(StoreTest, ARanksSecondStreamWaitsForItsFirstToEnd) {
  auto store = Open();
  auto first = store->BeginShard(Header(3, 0, 1, 3000));
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE((*first)->AddChunk(Chunk(0, 1000)).ok());
  std::atomic<bool> written{false};
  absl::Status again = absl::UnknownError("not run");
  std::thread resend([&] {
    again = WriteRank(store.get(), 3, 0, 1, 3000);
    written = true;
  });
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_FALSE(written.load()) << "the second stream must wait while the first is open";
  first->reset();  // the daemon sees the first stream die
  resend.join();
  EXPECT_TRUE(again.ok()) << again;
  EXPECT_TRUE(store->Commit(Manifest(3, 1, 3000)).ok());
}

TEST_F(StoreTest, UnreadableManifestCannotBePinnedButCanBeDeleted) {
  {
    auto store = Open();
    ASSERT_TRUE(WriteRank(store.get(), 6, 0, 1, 3000).ok());
    ASSERT_TRUE(store->Commit(Manifest(6, 1, 3000)).ok());
  }
  const std::string key = absl::StrFormat("manifest/j/%020d", 6);
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), dir_.path() + "/db", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    // Not a CheckpointManifest: a truncated varint.
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), key, std::string(1, '\x80')).ok());
  }
  auto store = Open();
  const absl::Status pin = store->SetPinned("j", 6, true);
  EXPECT_EQ(pin.code(), absl::StatusCode::kDataLoss) << pin;
  EXPECT_THAT(pin.message(), HasSubstr("checkpoint j step 6"));
  EXPECT_THAT(pin.message(), HasSubstr("manifest is unreadable"));
  // Refusing the pin changed nothing.
  EXPECT_EQ(store->GetManifest("j", 6).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store->GetManifest("j", 0).status().code(), absl::StatusCode::kDataLoss);
  // Delete is the way out: the checkpoint can never be restored, and while its manifest stays
  // unreadable every List of the job fails.
  ASSERT_TRUE(store->Delete("j", 6).ok());
  EXPECT_EQ(store->GetManifest("j", 6).status().code(), absl::StatusCode::kNotFound);
  auto listed = store->List("j");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->empty());
  v1::ReadRangeRequest request;
  request.set_job_id("j");
  request.set_step(6);
  request.set_tensor("t");
  request.set_end(10);
  EXPECT_NE(store->ReadRange(request, [](const v1::ShardChunk&) { return true; }).code(),
            absl::StatusCode::kOk);
}

TEST_F(StoreTest, RetentionDeletesEveryKeyOfTheVictimStep) {
  auto store = Open();
  auto commit = [&](int64_t step) {
    ASSERT_TRUE(WriteRank(store.get(), step, 0, 1, 3000).ok());
    auto m = Manifest(step, 1, 3000);
    m.mutable_spec()->mutable_checkpoint()->set_keep_last(1);
    ASSERT_TRUE(store->Commit(m).ok());
  };
  ASSERT_NO_FATAL_FAILURE(commit(1));
  ASSERT_NO_FATAL_FAILURE(commit(2));
  store.reset();
  rocksdb::DB* raw = nullptr;
  ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), dir_.path() + "/db", &raw).ok());
  std::unique_ptr<rocksdb::DB> db(raw);
  std::unique_ptr<rocksdb::Iterator> it(db->NewIterator(rocksdb::ReadOptions()));
  std::vector<std::string> left;
  const std::string step1 = absl::StrFormat("/j/%020d", 1);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (it->key().ToString().find(step1) != std::string::npos) left.push_back(it->key().ToString());
  }
  EXPECT_THAT(left, ::testing::IsEmpty());
}

}  // namespace
}  // namespace weft::checkpointd
