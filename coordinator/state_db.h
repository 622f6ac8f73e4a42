// The coordinator's durable state in an embedded RocksDB: every job (spec + status + events)
// and the job-id sequence. Workers are not stored: after a restart they re-register.
//
// Keys: "job/<job_id>" -> weft.v1.Job; "meta/next_job_seq" -> decimal int64.
// Every write is synced, so a job acknowledged to a client survives SIGKILL and power loss.
#ifndef WEFT_COORDINATOR_STATE_DB_H_
#define WEFT_COORDINATOR_STATE_DB_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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

 private:
  StateDb(std::string dir, std::unique_ptr<rocksdb::DB> db)
      : dir_(std::move(dir)), db_(std::move(db)) {}
  // After a failed write: resumes the database, or else closes and reopens it. UNAVAILABLE
  // when neither works yet (db_ may then be null until a later call reopens it).
  absl::Status Recover();

  const std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
  bool write_failed_ = false;  // the last write failed (or so did the recovery since)
};

}  // namespace weft::coordinator

#endif  // WEFT_COORDINATOR_STATE_DB_H_
