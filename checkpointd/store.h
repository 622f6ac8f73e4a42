// The checkpoint store: sharded tensor data and manifests in one RocksDB (tensor data in blob
// files). A checkpoint is visible only once its manifest is written; everything else is
// uncommitted and collected.
//
// Keys (numbers zero-padded so lexicographic order is numeric order):
//   ckpt/<job>/<step:020d>/<rank:06d>/<tensor>/<offset:020d>  chunk: crc32c (4 bytes LE) + data
//   shard/<job>/<step:020d>/<rank:06d>    "shard complete" marker: the rank's ShardHeader
//   open/<job>/<step:020d>/<rank:06d>     a WriteShard stream in progress (crash evidence)
//   pending/<job>/<step:020d>             first write time of an uncommitted step (unix micros)
//   manifest/<job>/<step:020d>            CheckpointManifest: the commit point
// Job ids and tensor names contain no '/' so every prefix scan is exact.
#ifndef WEFT_CHECKPOINTD_STORE_H_
#define WEFT_CHECKPOINTD_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "checkpointd/decisions.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "rocksdb/db.h"
#include "weft/v1/checkpoint.pb.h"

namespace weft::checkpointd {

struct StoreOptions {
  std::string data_dir = "weft-checkpointd-data";
  // Uncommitted steps whose first write is older than this are collected by Sweep().
  absl::Duration gc_grace = absl::Hours(1);
  // How long a WriteShard stream waits for an earlier stream of the same rank to end before it
  // is refused. The earlier one is usually the same client's, lost with its connection: the
  // client sends again as soon as it has reconnected, a little before this daemon has seen the
  // first stream die.
  absl::Duration open_stream_wait = absl::Seconds(10);
  // Free space on the data directory's disk that shard data never uses: RocksDB's own files
  // (WAL, MANIFEST, compaction output) need it, and so do commits and deletes. A shard whose
  // data would leave less is refused with RESOURCE_EXHAUSTED; a commit may use half of it.
  // A quarter of it is held as a ballast file in the data directory, removed when the disk is
  // found full (at startup, before a delete), so that a disk filled by something else still
  // lets the store open and delete checkpoints to free space; it comes back once there is
  // room again. 0: no reserve and no ballast.
  int64_t disk_reserve_bytes = int64_t{256} << 20;
};

class CheckpointStore;

// One WriteShard stream. Begin with CheckpointStore::BeginShard, then AddChunk per chunk and
// Finish at stream end. Destroying a writer that did not Finish successfully removes all of
// its data (nothing of a failed stream is kept). Not thread-safe (one stream, one thread).
class ShardWriter {
 public:
  ~ShardWriter();
  // Checks `chunk` (CRC32C, tensor/offset continue the header's ranges in order, whole
  // elements, <= 4 MiB) and queues it for an unsynced write. DATA_LOSS on a checksum
  // mismatch, INVALID_ARGUMENT on anything else; after an error the writer is dead.
  absl::Status AddChunk(const weft::v1::ShardChunk& chunk);
  // Checks every range was covered, then writes the shard marker with one synced write.
  // Returns the tensor bytes stored.
  absl::StatusOr<int64_t> Finish();

 private:
  friend class CheckpointStore;
  ShardWriter(CheckpointStore* store, weft::v1::ShardHeader header, std::vector<int> elem_sizes,
              absl::Time start);
  absl::Status FlushBatch();

  CheckpointStore* store_;
  weft::v1::ShardHeader header_;
  std::vector<int> elem_sizes_;  // per range
  absl::Time start_;
  size_t range_index_ = 0;
  int64_t next_offset_ = 0;
  int64_t bytes_ = 0;
  // The shard's data bytes, counted as promised disk space until the stream ends.
  int64_t promised_bytes_ = 0;
  std::unique_ptr<class rocksdb::WriteBatch> batch_;
  bool done_ = false;
  bool failed_ = false;
};

class CheckpointStore {
 public:
  // Opens (creating) the database in options.data_dir and removes what crashed streams left.
  // Metrics are registered in `registry`.
  static absl::StatusOr<std::unique_ptr<CheckpointStore>> Open(
      const StoreOptions& options, std::shared_ptr<prometheus::Registry> registry);
  ~CheckpointStore();  // flushes the memtable so a clean stop leaves data in blob/SST files

  // Validates `header` and starts a stream for its rank: replaces any earlier uncommitted
  // data of that rank. FAILED_PRECONDITION if the step is committed, ABORTED if a stream for
  // the same rank is still open after options.open_stream_wait, RESOURCE_EXHAUSTED (naming
  // the free and needed bytes) if the shard's data would leave less than
  // options.disk_reserve_bytes free.
  absl::StatusOr<std::unique_ptr<ShardWriter>> BeginShard(const weft::v1::ShardHeader& header);

  // The commit point (see checkpoint.proto); also applies keep-last retention and compacts
  // what it deleted, so that the space comes back. RESOURCE_EXHAUSTED if the disk has less
  // than half of options.disk_reserve_bytes free.
  absl::StatusOr<weft::v1::CheckpointManifest> Commit(weft::v1::CheckpointManifest manifest);
  // Committed manifests of `job_id`, newest first.
  absl::StatusOr<std::vector<weft::v1::CheckpointManifest>> List(const std::string& job_id);
  // Committed manifest; step 0 = latest. NOT_FOUND if none.
  absl::StatusOr<weft::v1::CheckpointManifest> GetManifest(const std::string& job_id,
                                                           int64_t step);
  // Calls `emit` with consecutive pieces of [begin, end) of `tensor`, each <= 4 MiB, every
  // stored chunk CRC-verified first (DATA_LOSS naming tensor and step otherwise). Stops and
  // returns CANCELLED if emit returns false.
  absl::Status ReadRange(const weft::v1::ReadRangeRequest& request,
                         absl::FunctionRef<bool(const weft::v1::ShardChunk&)> emit);
  // Sets the pinned flag of the committed checkpoint at exactly `step`. NOT_FOUND if none,
  // DATA_LOSS naming the step if its manifest is unreadable.
  absl::Status SetPinned(const std::string& job_id, int64_t step, bool pinned);
  // Removes a committed checkpoint (manifest and data in one synced batch) and compacts its
  // key range, so that its blob files are deleted before this returns. Works on a full disk
  // (the ballast makes room for the write). NOT_FOUND if none, FAILED_PRECONDITION if pinned. A checkpoint whose manifest is unreadable is deleted
  // too (with a warning): it can never be restored, and while it stays every List of the job
  // fails, so this is how it is cleared.
  absl::Status Delete(const std::string& job_id, int64_t step);

  // Collects uncommitted steps older than the grace period (and with no open stream).
  absl::Status Sweep();

 private:
  friend class ShardWriter;
  CheckpointStore(std::unique_ptr<rocksdb::DB> db, StoreOptions options,
                  std::shared_ptr<prometheus::Registry> registry);
  absl::Status RecoverCrashedStreams();
  absl::Status DropRank(const std::string& job, int64_t step, int rank);
  absl::Status EndStream(const ShardWriter& writer, bool ok, int64_t bytes);
  absl::Status WriteMarker(const ShardWriter& writer);
  absl::StatusOr<bool> IsCommitted(const std::string& job, int64_t step);
  // Step 0: the latest. NOT_FOUND if none; DATA_LOSS naming the step if unreadable.
  absl::StatusOr<weft::v1::CheckpointManifest> ReadManifest(const std::string& job, int64_t step,
                                                            const rocksdb::ReadOptions& ro);
  // Exactly `step` (0 is step 0, not the latest); errors as ReadManifest's.
  absl::StatusOr<weft::v1::CheckpointManifest> ReadManifestAt(const std::string& job, int64_t step,
                                                              const rocksdb::ReadOptions& ro);
  // Under mu_: each rank's shard marker of (job, step), and the ranks that have none.
  absl::Status ReadShardMarkers(const std::string& job, int64_t step, int world_size,
                                std::map<int, weft::v1::ShardHeader>* shards,
                                std::vector<int>* missing) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: writes the manifest `m` (the commit point) and applies keep-last retention, in
  // one synced batch.
  absl::Status WriteCommitLocked(const weft::v1::CheckpointManifest& m)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateStoreBytes();
  // Under mu_: the disk as a write finds it (statvfs of the data directory, plus the ballast).
  absl::StatusOr<DiskSpace> DiskSpaceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: removes the ballast when the disk has less free than the ballast holds, so that
  // the metadata write that follows (a delete, a pin, a sweep) finds room.
  void ReleaseBallastIfFullLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: recreates the ballast once the disk has room for it twice over.
  void RestoreBallastLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Compacts the chunk key range of each (job, step) in `steps`: deleted chunks are dropped
  // and blob files left with only garbage are removed, so the disk space comes back now.
  void CompactSteps(const std::string& job, const std::vector<int64_t>& steps);

  std::unique_ptr<rocksdb::DB> db_;
  StoreOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;

  // Serializes metadata changes (markers, commits, deletes, sweeps) so a commit never races a
  // marker write or a sweep of the same step.
  absl::Mutex mu_;
  std::set<std::tuple<std::string, int64_t, int>> open_streams_ ABSL_GUARDED_BY(mu_);
  // Sum of the open streams' ShardWriter::promised_bytes_.
  int64_t promised_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // The ballast file (see StoreOptions::disk_reserve_bytes): its path, size, and whether it
  // is on disk.
  std::string ballast_path_;
  int64_t ballast_bytes_ = 0;
  bool ballast_present_ ABSL_GUARDED_BY(mu_) = false;

  // Metrics (owned by registry_), read only through the registry; ShardWriter, a friend,
  // counts the bytes it writes in bytes_written_.
  prometheus::Counter* bytes_written_;
  prometheus::Counter* bytes_read_;
  prometheus::Histogram* save_seconds_;
  prometheus::Histogram* restore_seconds_;
  prometheus::Counter* committed_;
  prometheus::Counter* failed_;
  prometheus::Gauge* store_bytes_;
};

// Validation shared with tests: job ids and tensor names (1..512 bytes, no '/', no NUL).
absl::Status CheckName(const std::string& name, const char* field);

}  // namespace weft::checkpointd

#endif  // WEFT_CHECKPOINTD_STORE_H_
