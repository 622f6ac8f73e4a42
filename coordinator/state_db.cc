#include "coordinator/state_db.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rocksdb_log.h"
#include "common/status.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace weft::coordinator {
namespace {

constexpr char kJobPrefix[] = "job/";
constexpr char kSeqKey[] = "meta/next_job_seq";
constexpr char kStorePrefix[] = "store/";

std::string StorePrefix(const std::string& job_id) {
  return absl::StrCat(kStorePrefix, job_id, "/");
}
std::string StorePrefix(const std::string& job_id, int64_t generation) {
  return absl::StrCat(StorePrefix(job_id), generation, "/");
}

absl::StatusOr<std::unique_ptr<rocksdb::DB>> OpenRocks(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.info_log = NewRocksDbLogger("state database");
  // The state is small (jobs, not tensors): keep the footprint small too.
  options.max_background_jobs = 1;
  options.keep_log_file_num = 3;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", dir, ": cannot open the state database: ", s.ToString(),
                     s.IsIOError() && absl::StrContains(s.ToString(), "lock")
                         ? " (is another coordinator using this directory?)"
                         : ""));
  }
  return std::unique_ptr<rocksdb::DB>(db);
}

}  // namespace

absl::StatusOr<std::unique_ptr<StateDb>> StateDb::Open(const std::string& dir) {
  auto db = OpenRocks(dir);
  if (!db.ok()) return db.status();
  return std::unique_ptr<StateDb>(new StateDb(dir, std::move(*db)));
}

absl::Status StateDb::Recover() {
  // A failed log write stops RocksDB: it refuses every write until resumed, even once the disk
  // has room again. Resume() recovers when it can; after a full disk it often cannot (RocksDB
  // waits for a free-space reserve a small disk never has, and answers Busy meanwhile), and
  // reopening the database is what lets the coordinator go on without a restart. A torn record
  // the failed write left at the log's end is dropped by the reopening's recovery: it was never
  // acknowledged.
  if (db_ != nullptr && db_->Resume().ok()) return absl::OkStatus();
  db_.reset();
  auto db = OpenRocks(dir_);
  if (!db.ok()) {
    return absl::UnavailableError(
        absl::StrCat("state database write failed: cannot reopen it: ", db.status().message()));
  }
  db_ = std::move(*db);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<weft::v1::Job>> StateDb::LoadJobs() {
  absl::MutexLock lock(&mu_);
  std::vector<weft::v1::Job> jobs;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(kJobPrefix); it->Valid() && it->key().starts_with(kJobPrefix); it->Next()) {
    weft::v1::Job job;
    if (!job.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(
          absl::StrCat("state database: record ", it->key().ToString(), " is not a weft.v1.Job"));
    }
    jobs.push_back(std::move(job));
  }
  if (!it->status().ok()) {
    return absl::DataLossError(absl::StrCat("state database: ", it->status().ToString()));
  }
  return jobs;
}

absl::StatusOr<int64_t> StateDb::LoadNextJobSeq() {
  absl::MutexLock lock(&mu_);
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), kSeqKey, &value);
  if (s.IsNotFound()) return 1;
  int64_t seq = 0;
  if (!s.ok() || !absl::SimpleAtoi(value, &seq) || seq < 1) {
    return absl::DataLossError(absl::StrCat("state database: bad ", kSeqKey, ": ", s.ToString()));
  }
  return seq;
}

absl::Status StateDb::PutJob(const weft::v1::Job& job, int64_t next_job_seq) {
  absl::MutexLock lock(&mu_);
  if (write_failed_) WEFT_RETURN_IF_ERROR(Recover());
  rocksdb::WriteBatch batch;
  batch.Put(absl::StrCat(kJobPrefix, job.status().job_id()), job.SerializeAsString());
  if (next_job_seq > 0) batch.Put(kSeqKey, absl::StrCat(next_job_seq));
  rocksdb::WriteOptions options;
  options.sync = true;
  rocksdb::Status s = db_->Write(options, &batch);
  write_failed_ = !s.ok();
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("state database write failed: ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status StateDb::PutStoreKey(const std::string& job_id, int64_t generation,
                                  const std::string& key, const std::string* value) {
  absl::MutexLock lock(&mu_);
  if (write_failed_) WEFT_RETURN_IF_ERROR(Recover());
  const std::string db_key = absl::StrCat(StorePrefix(job_id, generation), key);
  rocksdb::WriteOptions options;  // not synced: see the header
  rocksdb::Status s = value != nullptr ? db_->Put(options, db_key, *value)
                                       : db_->Delete(options, db_key);
  write_failed_ = !s.ok();
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("state database write failed: ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::StatusOr<absl::flat_hash_map<std::string, std::string>> StateDb::LoadStore(
    const std::string& job_id, int64_t generation) {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<std::string, std::string> contents;
  const std::string prefix = StorePrefix(job_id, generation);
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    contents[it->key().ToString().substr(prefix.size())] = it->value().ToString();
  }
  if (!it->status().ok()) {
    return absl::DataLossError(absl::StrCat("state database: ", it->status().ToString()));
  }
  return contents;
}

absl::Status StateDb::DropStores(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  if (write_failed_) WEFT_RETURN_IF_ERROR(Recover());
  const std::string begin = StorePrefix(job_id);
  std::string end = begin;
  end.back() = '/' + 1;  // just past every key with the prefix
  rocksdb::Status s = db_->DeleteRange(rocksdb::WriteOptions(), db_->DefaultColumnFamily(),
                                       begin, end);
  write_failed_ = !s.ok();
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("state database write failed: ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status StateDb::DropStoresExcept(const absl::flat_hash_set<std::string>& keep) {
  absl::flat_hash_set<std::string> stale;
  {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
    for (it->Seek(kStorePrefix); it->Valid() && it->key().starts_with(kStorePrefix);
         it->Next()) {
      const std::string rest = it->key().ToString().substr(sizeof(kStorePrefix) - 1);
      const std::string job_id = rest.substr(0, rest.find('/'));
      if (!keep.contains(job_id)) stale.insert(job_id);
    }
  }
  for (const std::string& job_id : stale) WEFT_RETURN_IF_ERROR(DropStores(job_id));
  return absl::OkStatus();
}

}  // namespace weft::coordinator
