// The checkpoint store's decisions as pure functions: whether a rank's shard agrees with the
// manifest being committed, whether the ranks' ranges cover every tensor exactly once, which
// older checkpoints retention deletes, and whether the disk has room for a write. Each result carries a reason a person can read
// (the commit's refusal message, the retention log line). No I/O, no clocks, no locks: the
// CheckpointStore reads what these need from the database and applies the results.
#ifndef WEFT_CHECKPOINTD_DECISIONS_H_
#define WEFT_CHECKPOINTD_DECISIONS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "weft/v1/checkpoint.pb.h"

namespace weft::checkpointd {

// A yes/no answer; `reason` says what is wrong when `ok` is false (empty otherwise).
struct Verdict {
  bool ok = true;
  std::string reason;
};

// ---- Commit ----------------------------------------------------------------------------------

// Whether the shard marker `shard`, stored by `rank`, agrees with `manifest`: the same world
// size, the same dtype and shape for every tensor both list, and no range of a tensor the
// manifest does not list.
Verdict CheckShardAgainstManifest(const weft::v1::CheckpointManifest& manifest,
                                  const weft::v1::ShardHeader& shard, int rank);

// Whether the ranks' ranges cover [0, numel) of every tensor in `numels` (name -> elements)
// exactly once: no gap, no overlap, no range past the end and no range of an unlisted tensor.
// Ranges are [begin, end) element ranges as the ranks' shard headers declared them; the
// reason names the tensor and the first offending element or range.
Verdict CheckCoverage(const std::map<std::string, int64_t>& numels,
                      const std::vector<weft::v1::RankState>& ranks);

// ---- Retention -------------------------------------------------------------------------------

struct StoredCheckpoint {
  int64_t step = 0;
  bool pinned = false;
};

struct RetentionDecision {
  // Steps to delete, newest first.
  std::vector<int64_t> victims;
  // What is kept and why, e.g. "keep last 2: keeping 40, 30; pinned: 10; deleting 20".
  std::string reason;
};

// Which of `existing` (committed checkpoints of one job, newest first, without the one being
// committed) to delete once `committed_step` is committed with keep-last `keep_last`: the
// newest `keep_last` checkpoints (the new one counted, and any newer than it always kept)
// survive, and so does every pinned one. keep_last < 1 keeps everything.
RetentionDecision DecideRetention(int64_t committed_step, int keep_last,
                                  const std::vector<StoredCheckpoint>& existing);

// ---- Disk space ------------------------------------------------------------------------------

// The store's disk as a write finds it.
struct DiskSpace {
  // Available to the store: statvfs's f_bavail * f_frsize of the data directory, plus the
  // ballast file the store would remove to make room (see StoreOptions::disk_reserve_bytes).
  int64_t free_bytes = 0;
  // Shard data accepted by streams still open, not necessarily on disk yet.
  int64_t promised_bytes = 0;
};

// Whether `what` (e.g. "rank 0's shard of job-a step 5"), writing `write_bytes`, may start
// while leaving `keep_free_bytes` free after it and after every open stream's promised data.
// The reason, when refused, names the free and the needed bytes and how they add up.
Verdict CheckDiskSpace(const std::string& what, int64_t write_bytes, int64_t keep_free_bytes,
                       const DiskSpace& disk);

}  // namespace weft::checkpointd

#endif  // WEFT_CHECKPOINTD_DECISIONS_H_
