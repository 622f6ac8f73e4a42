// The coordinator's durable state in an embedded RocksDB: every job (spec + status + events),
// the job-id sequence, and the stores of running generations. Workers are not stored: after a
// restart they re-register.
//
// Keys: "job/<job_id>" -> weft.v1.Job; "meta/next_job_seq" -> decimal int64;
// "store/<job_id>/<generation>/<key>" -> a generation store's value.
// Job writes are synced, so a job acknowledged to a client survives SIGKILL and power loss.
// Store writes are not (a store's keys are written as often as ranks set them): they survive
// the coordinator process's death, not the machine's, which loses the generation anyway.
//
// Thread-safe: job writes come under the coordinator's lock, store writes from the threads
// of the Store calls.
#ifndef WEFT_COORDINATOR_STATE_DB_H_
#define WEFT_COORDINATOR_STATE_DB_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "weft/v1/job.pb.h"

namespace weft::coordinator {

class StateDb {
 public:
  // Opens (creating if missing) the database in `dir`. FAILED_PRECONDITION naming the
  // directory if it cannot (e.g. another coordinator holds its lock).
  static absl::StatusOr<std::unique_ptr<StateDb>> Open(const std::string& dir);

  // Every stored job, in no particular order. DATA_LOSS naming the key of an unreadable one.
  absl::StatusOr<std::vector<weft::v1::Job>> LoadJobs();
  // The next job sequence number to hand out (1 for a new database).
  absl::StatusOr<int64_t> LoadNextJobSeq();

  // Writes `job`; with next_job_seq > 0, also the sequence, in the same atomic batch.
  // UNAVAILABLE "state database write failed: <RocksDB's reason>" when it is not stored (e.g.
  // "No space left on device"); the next call tries again, resuming the database first.
  absl::Status PutJob(const weft::v1::Job& job, int64_t next_job_seq = 0);

  // A generation store's change (MemoryStore::Journal): the key's new value, or its deletion
  // when `value` is null. Not synced; UNAVAILABLE when not written.
  absl::Status PutStoreKey(const std::string& job_id, int64_t generation,
                           const std::string& key, const std::string* value);
  // The stored keys of generation `generation` of `job_id`.
  absl::StatusOr<absl::flat_hash_map<std::string, std::string>> LoadStore(
      const std::string& job_id, int64_t generation);
  // Removes the stored keys of every generation of `job_id` (its generation ended).
  absl::Status DropStores(const std::string& job_id);
  // Removes every stored key of a generation whose job is not in `keep` (left by a
  // generation the previous process had not cleaned up).
  absl::Status DropStoresExcept(const absl::flat_hash_set<std::string>& keep);

 private:
  StateDb(std::string dir, std::unique_ptr<rocksdb::DB> db)
      : dir_(std::move(dir)), db_(std::move(db)) {}
  // After a failed write: resumes the database, or else closes and reopens it. UNAVAILABLE
  // when neither works yet (db_ may then be null until a later call reopens it).
  absl::Status Recover() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string dir_;
  absl::Mutex mu_;  // Recover may replace db_ while another thread writes a store key
  std::unique_ptr<rocksdb::DB> db_ ABSL_GUARDED_BY(mu_);
  // The last write failed (or so did the recovery since).
  bool write_failed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_STATE_DB_H_
