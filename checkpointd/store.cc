#include "checkpointd/store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "checkpointd/chunk_codec.h"
#include "checkpointd/decisions.h"
#include "common/crc32c.h"
#include "common/metrics.h"
#include "common/rocksdb_log.h"
#include "common/status.h"
#include "rocksdb/env.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "spdlog/spdlog.h"

namespace weft::checkpointd {
namespace {

using weft::v1::CheckpointManifest;
using weft::v1::ShardChunk;
using weft::v1::ShardHeader;
using weft::v1::TensorLayout;

constexpr size_t kMaxChunkBytes = 4 << 20;
// Unsynced chunk writes are grouped up to this size: fewer WAL appends, bounded memory.
constexpr size_t kBatchBytes = 16 << 20;
constexpr int64_t kMaxElements = int64_t{1} << 50;
constexpr int kMaxWorldSize = 1000000;  // the key format has 6 rank digits
// In the data directory; RocksDB leaves files whose names it does not know alone.
constexpr char kBallastFile[] = "weft-disk-ballast";

std::string StepPrefix(const char* kind, const std::string& job, int64_t step) {
  return absl::StrFormat("%s/%s/%020d/", kind, job, step);
}
std::string RankKey(const char* kind, const std::string& job, int64_t step, int rank) {
  return absl::StrFormat("%s/%s/%020d/%06d", kind, job, step, rank);
}
std::string ChunkPrefix(const std::string& job, int64_t step, int rank, const std::string& t) {
  return absl::StrCat(RankKey("ckpt", job, step, rank), "/", t, "/");
}
std::string ManifestKey(const std::string& job, int64_t step) {
  return absl::StrFormat("manifest/%s/%020d", job, step);
}
// First key after every key starting with `prefix` (which ends in '/').
std::string PrefixEnd(std::string prefix) {
  prefix.back() = static_cast<char>(prefix.back() + 1);
  return prefix;
}

int ElementSize(weft::v1::DType dtype) {
  switch (dtype) {
    case weft::v1::DTYPE_F32: return 4;
    case weft::v1::DTYPE_BF16: return 2;
    case weft::v1::DTYPE_U8: return 1;
    default: return 0;
  }
}

absl::Status CheckLayout(const TensorLayout& t, int64_t* numel) {
  WEFT_RETURN_IF_ERROR(CheckName(t.name(), "tensor name"));
  if (ElementSize(t.dtype()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name(), ": dtype unspecified"));
  }
  int64_t n = 1;
  for (int64_t d : t.shape()) {
    if (d < 1 || d > kMaxElements || n > kMaxElements / d) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name(), ": shape dimensions must be >= 1, product <= 2^50"));
    }
    n *= d;
  }
  *numel = n;
  return absl::OkStatus();
}

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsCorruption()) return absl::DataLossError(absl::StrCat(what, ": ", s.ToString()));
  // The space checks keep this rare: something else filled the disk meanwhile.
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(absl::StrCat(what, ": ", s.ToString()));
  return absl::UnavailableError(absl::StrCat(what, ": ", s.ToString()));
}

// Bytes an unprivileged writer may still use on the disk of `dir`.
absl::StatusOr<int64_t> AvailableBytes(const std::string& dir) {
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) != 0) {
    return absl::UnavailableError(
        absl::StrCat("statvfs of ", dir, ": ", std::strerror(errno)));
  }
  return static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize);
}

// Allocates `bytes` for real (posix_fallocate) in a new file at `path`; removes it on failure.
absl::Status WriteBallast(const std::string& path, int64_t bytes) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat(path, ": ", std::strerror(errno)));
  int err = posix_fallocate(fd, 0, bytes);
  if (err == 0 && fsync(fd) != 0) err = errno;
  close(fd);
  if (err != 0) {
    unlink(path.c_str());
    return absl::ResourceExhaustedError(absl::StrCat(path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

rocksdb::WriteOptions Synced() {
  rocksdb::WriteOptions o;
  o.sync = true;
  return o;
}

// "<kind>/<job>/<step>" or with more components: job and step of a key.
bool ParseJobStep(const rocksdb::Slice& key, std::string* job, int64_t* step) {
  std::string k = key.ToString();
  const size_t a = k.find('/');
  if (a == std::string::npos) return false;
  const size_t b = k.find('/', a + 1);
  if (b == std::string::npos) return false;
  *job = k.substr(a + 1, b - a - 1);
  return absl::SimpleAtoi(k.substr(b + 1, 20), step);
}

// What a manifest says of itself, checked before anything is read.
struct ManifestSizes {
  std::map<std::string, int64_t> numels;  // tensor name -> elements
  int64_t total_bytes = 0;
  std::map<int, weft::v1::RankState> ranks;  // the request's entries, by rank
};

absl::StatusOr<ManifestSizes> ValidateManifest(const CheckpointManifest& m) {
  WEFT_RETURN_IF_ERROR(CheckName(m.job_id(), "manifest.job_id"));
  if (m.step() < 0) return absl::InvalidArgumentError("manifest.step: must be >= 0");
  // AdamW updates the state has had: never more than the steps taken (a skipped step is none).
  if (m.optimizer_step() < 0 || m.optimizer_step() > m.step()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest.optimizer_step: must be in [0, step ",
                                                   m.step(), "], got ", m.optimizer_step()));
  }
  if (m.world_size() < 1 || m.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError("manifest.world_size: must be in [1, 1000000]");
  }
  ManifestSizes sizes;
  for (const TensorLayout& t : m.tensors()) {
    int64_t numel = 0;
    WEFT_RETURN_IF_ERROR(CheckLayout(t, &numel));
    if (!sizes.numels.emplace(t.name(), numel).second) {
      return absl::InvalidArgumentError(absl::StrCat("manifest.tensors: ", t.name(), " twice"));
    }
    sizes.total_bytes += numel * ElementSize(t.dtype());
  }
  for (const auto& r : m.ranks()) {
    if (r.rank() < 0 || r.rank() >= m.world_size() || !sizes.ranks.emplace(r.rank(), r).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest.ranks: rank ", r.rank(), " out of range or given twice"));
    }
  }
  return sizes;
}

// Adds to `batch` the removal of one rank's chunks, shard marker and open-stream marker.
void DeleteRank(const std::string& job, int64_t step, int rank, rocksdb::WriteBatch* batch) {
  const std::string prefix = RankKey("ckpt", job, step, rank) + "/";
  batch->DeleteRange(prefix, PrefixEnd(prefix));
  batch->Delete(RankKey("shard", job, step, rank));
  batch->Delete(RankKey("open", job, step, rank));
}

// Adds to `batch` the removal of everything stored for one step of a job: its manifest and
// pending record, and its ranks' chunks, shard markers and open-stream markers. Callers hold
// the store's lock and have checked that no stream of the step is open.
void DeleteStep(const std::string& job, int64_t step, rocksdb::WriteBatch* batch) {
  batch->Delete(ManifestKey(job, step));
  batch->Delete(StepPrefix("pending", job, step));
  for (const char* kind : {"ckpt", "shard", "open"}) {
    const std::string p = StepPrefix(kind, job, step);
    batch->DeleteRange(p, PrefixEnd(p));
  }
}

absl::StatusOr<CheckpointManifest> ParseManifest(std::string_view value, const std::string& job,
                                                 int64_t step) {
  CheckpointManifest m;
  if (!m.ParseFromArray(value.data(), static_cast<int>(value.size()))) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", job, " step ", step, ": its manifest is unreadable"));
  }
  return m;
}

}  // namespace

absl::Status CheckName(const std::string& name, const char* field) {
  if (name.empty() || name.size() > 512) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": must be 1 to 512 bytes"));
  }
  if (name.find('/') != std::string::npos || name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", name, "\": must contain no '/' and no NUL"));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// ShardWriter

ShardWriter::ShardWriter(CheckpointStore* store, ShardHeader header, std::vector<int> elem_sizes,
                         absl::Time start)
    : store_(store),
      header_(std::move(header)),
      elem_sizes_(std::move(elem_sizes)),
      start_(start),
      batch_(std::make_unique<rocksdb::WriteBatch>()) {
  if (!header_.ranges().empty()) next_offset_ = header_.ranges(0).begin();
}

ShardWriter::~ShardWriter() {
  if (!done_) {
    if (absl::Status s = store_->EndStream(*this, false, 0); !s.ok()) {
      spdlog::warn("dropping failed shard {}/{}/{}: {}", header_.job_id(), header_.step(),
                   header_.rank(), std::string(s.message()));
    }
  }
}

absl::Status ShardWriter::AddChunk(const ShardChunk& chunk) {
  if (failed_ || done_) return absl::FailedPreconditionError("shard stream already ended");
  auto fail = [this](absl::Status s) {
    failed_ = true;
    return s;
  };
  if (range_index_ >= static_cast<size_t>(header_.ranges_size())) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "chunk of tensor ", chunk.tensor(), " at ", chunk.offset_elements(),
        ": every range of the header is already covered")));
  }
  const auto& range = header_.ranges(range_index_);
  const int es = elem_sizes_[range_index_];
  if (chunk.tensor() != range.tensor() || chunk.offset_elements() != next_offset_) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "chunk of tensor ", chunk.tensor(), " at element ", chunk.offset_elements(),
        ": expected tensor ", range.tensor(), " at element ", next_offset_,
        " (chunks must cover the header's ranges in order)")));
  }
  const size_t n = chunk.data().size();
  if (n == 0 || n > kMaxChunkBytes || n % es != 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "chunk of tensor ", chunk.tensor(), " at ", chunk.offset_elements(), ": ", n,
        " bytes; must be 1 to 4 MiB of whole ", es, "-byte elements")));
  }
  const int64_t elems = static_cast<int64_t>(n / es);
  if (elems > range.end() - next_offset_) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        "chunk of tensor ", chunk.tensor(), " at ", chunk.offset_elements(), ": runs past the",
        " range end ", range.end())));
  }
  const uint32_t crc = Crc32c(chunk.data().data(), n);
  if (crc != chunk.crc32c()) {
    return fail(absl::DataLossError(absl::StrFormat(
        "chunk of tensor %s at element %d: CRC32C mismatch (sent %08x, data has %08x)",
        chunk.tensor(), chunk.offset_elements(), chunk.crc32c(), crc)));
  }
  const std::string value = EncodeChunkValue(chunk.data(), crc);
  const std::string key =
      absl::StrCat(ChunkPrefix(header_.job_id(), header_.step(), header_.rank(), chunk.tensor()),
                   absl::StrFormat("%020d", chunk.offset_elements()));
  batch_->Put(key, value);
  bytes_ += static_cast<int64_t>(n);
  next_offset_ += elems;
  if (next_offset_ == range.end()) {
    ++range_index_;
    if (range_index_ < static_cast<size_t>(header_.ranges_size())) {
      next_offset_ = header_.ranges(range_index_).begin();
    }
  }
  if (batch_->GetDataSize() >= kBatchBytes) {
    if (absl::Status s = FlushBatch(); !s.ok()) return fail(s);
  }
  return absl::OkStatus();
}

absl::Status ShardWriter::FlushBatch() {
  if (batch_->Count() == 0) return absl::OkStatus();
  // Tensor data skips the WAL (it would be written twice: WAL, then blob file). It becomes
  // durable when EndStream flushes the memtable to synced blob files, before the marker; a
  // crash before that loses only data that no marker vouches for.
  rocksdb::WriteOptions no_wal;
  no_wal.disableWAL = true;
  rocksdb::Status s = store_->db_->Write(no_wal, batch_.get());
  store_->bytes_written_->Increment(static_cast<double>(batch_->GetDataSize()));
  batch_->Clear();
  return FromRocks(s, "checkpoint store write");
}

absl::StatusOr<int64_t> ShardWriter::Finish() {
  if (failed_ || done_) return absl::FailedPreconditionError("shard stream already ended");
  if (range_index_ != static_cast<size_t>(header_.ranges_size())) {
    failed_ = true;
    const auto& r = header_.ranges(range_index_);
    return absl::InvalidArgumentError(absl::StrCat(
        "stream ended before covering tensor ", r.tensor(), " [", next_offset_, ", ", r.end(),
        ")"));
  }
  if (absl::Status s = FlushBatch(); !s.ok()) {
    failed_ = true;
    return s;
  }
  // EndStream settles the stream either way (on failure it already dropped the data).
  done_ = true;
  if (absl::Status s = store_->EndStream(*this, true, bytes_); !s.ok()) {
    failed_ = true;
    return s;
  }
  return bytes_;
}

// ---------------------------------------------------------------------------------------------
// CheckpointStore

CheckpointStore::CheckpointStore(std::unique_ptr<rocksdb::DB> db, StoreOptions options,
                                 std::shared_ptr<prometheus::Registry> registry)
    : db_(std::move(db)), options_(std::move(options)), registry_(std::move(registry)) {
  auto& r = *registry_;
  bytes_written_ = &AddCounter(r, "weft_checkpointd_bytes_written_total",
                               "Bytes of tensor chunks (with keys) written to the store");
  bytes_read_ = &AddCounter(r, "weft_checkpointd_bytes_read_total",
                            "Bytes of tensor data streamed to ReadRange callers");
  save_seconds_ = &AddHistogram(r, "weft_checkpointd_save_seconds",
                                "WriteShard duration, stream open to synced shard marker",
                                ExponentialBuckets(0.001, 2, 20));
  restore_seconds_ = &AddHistogram(r, "weft_checkpointd_restore_seconds", "ReadRange duration",
                                   ExponentialBuckets(0.001, 2, 20));
  committed_ =
      &AddCounter(r, "weft_checkpointd_checkpoints_committed_total", "Checkpoints committed");
  failed_ = &AddCounter(r, "weft_checkpointd_checkpoints_failed_total",
                        "Shard streams and commits refused or broken off");
  store_bytes_ =
      &AddGauge(r, "weft_checkpointd_store_bytes", "Bytes in the store's SST and blob files");
}

CheckpointStore::~CheckpointStore() {
  if (db_) db_->Flush(rocksdb::FlushOptions());
}

absl::StatusOr<std::unique_ptr<CheckpointStore>> CheckpointStore::Open(
    const StoreOptions& options, std::shared_ptr<prometheus::Registry> registry) {
  if (options.disk_reserve_bytes < 0) {
    return absl::InvalidArgumentError("--disk-reserve-bytes: must be >= 0");
  }
  const std::string ballast_path = absl::StrCat(options.data_dir, "/", kBallastFile);
  const int64_t ballast_bytes = options.disk_reserve_bytes / 4;
  bool ballast_present = false;
  if (struct stat st; stat(ballast_path.c_str(), &st) == 0) {
    // Before RocksDB writes anything (a new MANIFEST, WAL and OPTIONS file at every open): on
    // a disk filled while this daemon was down, the ballast's room is what lets it start.
    const absl::StatusOr<int64_t> free = AvailableBytes(options.data_dir);
    ballast_present = st.st_size == ballast_bytes && free.ok() && *free >= ballast_bytes;
    if (!ballast_present) {
      if (st.st_size == ballast_bytes) {
        spdlog::warn("disk of {} is full: removing the {}-byte ballast to make room",
                     options.data_dir, ballast_bytes);
      }
      unlink(ballast_path.c_str());
    }
  }
  rocksdb::Options db_options;
  db_options.create_if_missing = true;
  db_options.info_log = NewRocksDbLogger("checkpoint store");
  // Preallocation would hold space the free-space checks cannot see (a WAL reserves 1.1
  // memtables, 140 MiB here) and makes a small disk fail early.
  db_options.allow_fallocate = false;
  // Every byte of a checkpoint passes through a memtable flush (to blob files): with RocksDB's
  // derived default of one flush thread, saves ran at a third of the disk's rate on a 16-core
  // host, one rank streaming or two. Flushes get a quarter of the cores (at least 2), so
  // several ranks' memtables are written at once.
  const int cores = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  db_options.max_background_flushes = std::max(2, cores / 4);
  db_options.max_background_jobs = db_options.max_background_flushes + 2;
  db_options.keep_log_file_num = 3;
  // Tensor chunks (tens of KiB to 4 MiB) go to blob files: compactions then move only keys.
  // Tensor data hardly compresses, so blobs are stored raw.
  db_options.enable_blob_files = true;
  db_options.min_blob_size = 64 << 10;
  db_options.blob_compression_type = rocksdb::kNoCompression;
  db_options.enable_blob_garbage_collection = true;
  // Checkpoints arrive in bursts of hundreds of MiB: larger memtables mean fewer, larger
  // flushes and no write stalls while a burst lands.
  db_options.write_buffer_size = 128 << 20;
  // Up to 1 GiB of memtables, so writers keep going while several flushes run.
  db_options.max_write_buffer_number = 8;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(db_options, options.data_dir, &db);
  if (s.IsNoSpace()) {
    // Opening writes a new MANIFEST and WAL: a few KiB, which the ballast normally gives.
    return absl::ResourceExhaustedError(
        absl::StrCat("--data-dir ", options.data_dir, ": cannot open the checkpoint store: ",
                     s.ToString(), " (free some space on its disk; it needs a few KiB)"));
  }
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--data-dir ", options.data_dir, ": cannot open the checkpoint store: ",
                     s.ToString(),
                     s.IsIOError() ? " (is another checkpointd using this directory?)" : ""));
  }
  std::unique_ptr<CheckpointStore> store(
      new CheckpointStore(std::unique_ptr<rocksdb::DB>(db), options, std::move(registry)));
  store->ballast_path_ = ballast_path;
  store->ballast_bytes_ = ballast_bytes;
  {
    absl::MutexLock lock(&store->mu_);
    store->ballast_present_ = ballast_present;
    store->ReleaseBallastIfFullLocked();
  }
  WEFT_RETURN_IF_ERROR(store->RecoverCrashedStreams());
  WEFT_RETURN_IF_ERROR(store->Sweep());
  store->UpdateStoreBytes();
  {
    absl::MutexLock lock(&store->mu_);
    store->RestoreBallastLocked();
  }
  return store;
}

absl::Status CheckpointStore::RecoverCrashedStreams() {
  // Every open/ key left at startup belongs to a stream the previous process never finished.
  std::vector<std::tuple<std::string, int64_t, int>> crashed;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("open/"); it->Valid() && it->key().starts_with("open/"); it->Next()) {
    std::string job;
    int64_t step = 0;
    int rank = 0;
    const std::string key = it->key().ToString();
    if (!ParseJobStep(it->key(), &job, &step) ||
        !absl::SimpleAtoi(key.substr(key.rfind('/') + 1), &rank)) {
      return absl::DataLossError(absl::StrCat("checkpoint store: bad key ", key));
    }
    crashed.emplace_back(job, step, rank);
  }
  WEFT_RETURN_IF_ERROR(FromRocks(it->status(), "checkpoint store scan"));
  for (const auto& [job, step, rank] : crashed) {
    spdlog::info("removing shard {}/{}/{} left by an interrupted write", job, step, rank);
    WEFT_RETURN_IF_ERROR(DropRank(job, step, rank));
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::DropRank(const std::string& job, int64_t step, int rank) {
  rocksdb::WriteBatch batch;
  DeleteRank(job, step, rank, &batch);
  // Unsynced: if this is lost, the open/ key survives and startup drops the rank again.
  return FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "checkpoint store delete");
}

absl::StatusOr<bool> CheckpointStore::IsCommitted(const std::string& job, int64_t step) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), ManifestKey(job, step), &value);
  if (s.IsNotFound()) return false;
  WEFT_RETURN_IF_ERROR(FromRocks(s, "checkpoint store read"));
  return true;
}

absl::StatusOr<std::unique_ptr<ShardWriter>> CheckpointStore::BeginShard(
    const ShardHeader& header) {
  WEFT_RETURN_IF_ERROR(CheckName(header.job_id(), "header.job_id"));
  if (header.step() < 0) return absl::InvalidArgumentError("header.step: must be >= 0");
  if (header.world_size() < 1 || header.world_size() > kMaxWorldSize) {
    return absl::InvalidArgumentError("header.world_size: must be in [1, 1000000]");
  }
  if (header.rank() < 0 || header.rank() >= header.world_size()) {
    return absl::InvalidArgumentError(absl::StrCat("header.rank ", header.rank(),
                                                   ": must be in [0, ", header.world_size(), ")"));
  }
  std::map<std::string, std::pair<int, int64_t>> layouts;  // name -> element size, numel
  for (const TensorLayout& t : header.tensors()) {
    int64_t numel = 0;
    WEFT_RETURN_IF_ERROR(CheckLayout(t, &numel));
    if (!layouts.emplace(t.name(), std::make_pair(ElementSize(t.dtype()), numel)).second) {
      return absl::InvalidArgumentError(absl::StrCat("header.tensors: ", t.name(), " twice"));
    }
  }
  std::vector<int> elem_sizes;
  int64_t shard_bytes = 0;  // each range is within its tensor: <= 2^50 elements of <= 4 bytes
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> by_tensor;
  for (const auto& r : header.ranges()) {
    auto layout = layouts.find(r.tensor());
    if (layout == layouts.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("header.ranges: tensor ", r.tensor(), " has no entry in header.tensors"));
    }
    if (r.begin() < 0 || r.begin() >= r.end() || r.end() > layout->second.second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "header.ranges: ", r.tensor(), " [", r.begin(), ", ", r.end(),
          "): must be non-empty and within [0, ", layout->second.second, ")"));
    }
    elem_sizes.push_back(layout->second.first);
    // Capped (far above any disk) so that many huge ranges cannot overflow the sum.
    shard_bytes = std::min(shard_bytes + (r.end() - r.begin()) * layout->second.first,
                           int64_t{1} << 60);
    by_tensor[r.tensor()].emplace_back(r.begin(), r.end());
  }
  for (auto& [name, ranges] : by_tensor) {
    std::sort(ranges.begin(), ranges.end());
    for (size_t i = 1; i < ranges.size(); ++i) {
      if (ranges[i].first < ranges[i - 1].second) {
        return absl::InvalidArgumentError(
            absl::StrCat("header.ranges: ranges of tensor ", name, " overlap"));
      }
    }
  }
  const std::string& job = header.job_id();
  const auto id = std::make_tuple(job, header.step(), header.rank());
  {
    absl::MutexLock lock(&mu_);
    const auto ended = [this, &id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return open_streams_.count(id) == 0;
    };
    // Waited for before the commit check: the step may be committed meanwhile.
    if (!mu_.AwaitWithTimeout(absl::Condition(&ended), options_.open_stream_wait)) {
      return absl::AbortedError(absl::StrCat(
          "a WriteShard stream for ", job, " step ", header.step(), " rank ", header.rank(),
          " is still open after ", absl::FormatDuration(options_.open_stream_wait)));
    }
    WEFT_ASSIGN_OR_RETURN(bool committed, IsCommitted(job, header.step()));
    if (committed) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint ", job, " step ", header.step(), " is already committed"));
    }
    WEFT_ASSIGN_OR_RETURN(const DiskSpace disk, DiskSpaceLocked());
    const Verdict room = CheckDiskSpace(
        absl::StrCat("rank ", header.rank(), "'s shard of ", job, " step ", header.step()),
        shard_bytes, options_.disk_reserve_bytes, disk);
    if (!room.ok) {
      failed_->Increment();
      return absl::ResourceExhaustedError(
          absl::StrCat(room.reason, " (--data-dir ", options_.data_dir, ")"));
    }
    open_streams_.insert(id);
    promised_bytes_ += shard_bytes;
    // A rewrite replaces whatever an earlier stream of this rank left.
    rocksdb::WriteBatch batch;
    DeleteRank(job, header.step(), header.rank(), &batch);
    batch.Put(RankKey("open", job, header.step(), header.rank()), "");
    const std::string pending = StepPrefix("pending", job, header.step());
    std::string unused;
    if (db_->Get(rocksdb::ReadOptions(), pending, &unused).IsNotFound()) {
      batch.Put(pending, absl::StrCat(absl::ToUnixMicros(absl::Now())));
    }
    if (absl::Status s = FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "write");
        !s.ok()) {
      open_streams_.erase(id);
      promised_bytes_ -= shard_bytes;
      return s;
    }
  }
  std::unique_ptr<ShardWriter> writer(
      new ShardWriter(this, header, std::move(elem_sizes), absl::Now()));
  writer->promised_bytes_ = shard_bytes;
  return writer;
}

absl::Status CheckpointStore::EndStream(const ShardWriter& writer, bool ok, int64_t bytes) {
  const ShardHeader& h = writer.header_;
  absl::MutexLock lock(&mu_);
  absl::Status status;
  if (ok) {
    WEFT_ASSIGN_OR_RETURN(bool committed, IsCommitted(h.job_id(), h.step()));
    if (committed) {
      status = absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", h.job_id(), " step ", h.step(), " was committed during the stream"));
    } else {
      // The chunks bypassed the WAL: make them durable first (flush writes and syncs the
      // memtable's blob and table files), then the marker vouches for them.
      rocksdb::FlushOptions flush;
      flush.wait = true;
      status = FromRocks(db_->Flush(flush), "checkpoint store flush");
      if (status.ok()) {
        rocksdb::WriteBatch batch;
        batch.Put(RankKey("shard", h.job_id(), h.step(), h.rank()), h.SerializeAsString());
        batch.Delete(RankKey("open", h.job_id(), h.step(), h.rank()));
        status = FromRocks(db_->Write(Synced(), &batch), "checkpoint store marker write");
      }
    }
  }
  if (!ok || !status.ok()) {
    failed_->Increment();
    if (!ok) status = DropRank(h.job_id(), h.step(), h.rank());
    else DropRank(h.job_id(), h.step(), h.rank()).IgnoreError();
  } else {
    save_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - writer.start_));
  }
  open_streams_.erase(std::make_tuple(h.job_id(), h.step(), h.rank()));
  promised_bytes_ -= writer.promised_bytes_;
  return status;
}

absl::StatusOr<CheckpointManifest> CheckpointStore::Commit(CheckpointManifest m) {
  auto refuse = [this](absl::Status s) {
    failed_->Increment();
    return s;
  };
  absl::StatusOr<ManifestSizes> sizes = ValidateManifest(m);
  if (!sizes.ok()) return refuse(sizes.status());
  const std::string job = m.job_id();

  absl::MutexLock lock(&mu_);
  WEFT_ASSIGN_OR_RETURN(bool committed, IsCommitted(job, m.step()));
  if (committed) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", job, " step ", m.step(), " is already committed"));
  }
  for (const auto& [j, step, rank] : open_streams_) {
    if (j == job && step == m.step()) {
      return refuse(absl::FailedPreconditionError(
          absl::StrCat("rank ", rank, " is still writing its shard of ", job, " step ", step)));
    }
  }
  std::map<int, ShardHeader> shards;
  std::vector<int> missing;
  WEFT_RETURN_IF_ERROR(ReadShardMarkers(job, m.step(), m.world_size(), &shards, &missing));
  for (const auto& [rank, shard] : shards) {
    if (Verdict v = CheckShardAgainstManifest(m, shard, rank); !v.ok) {
      return refuse(absl::FailedPreconditionError(v.reason));
    }
  }
  if (!missing.empty()) {
    return refuse(absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", job, " step ", m.step(), ": ranks ",
                     absl::StrJoin(missing, ", "), " have not written their shards")));
  }
  // Each rank's entry keeps what the request said of it, with the ranges its shard declared.
  std::map<int, weft::v1::RankState>& ranks = sizes->ranks;
  for (const auto& [rank, shard] : shards) {
    ranks[rank].set_rank(rank);
    ranks[rank].mutable_ranges()->CopyFrom(shard.ranges());
  }
  m.clear_ranks();
  for (auto& [rank, state] : ranks) *m.add_ranks() = std::move(state);
  const Verdict coverage = CheckCoverage(
      sizes->numels, std::vector<weft::v1::RankState>(m.ranks().begin(), m.ranks().end()));
  if (!coverage.ok) return refuse(absl::FailedPreconditionError(coverage.reason));

  WEFT_ASSIGN_OR_RETURN(const DiskSpace disk, DiskSpaceLocked());
  // The shards were accepted with the whole reserve left free: a commit fails for space only
  // when something else has filled the disk since.
  const Verdict room =
      CheckDiskSpace(absl::StrCat("the commit of ", job, " step ", m.step()),
                     static_cast<int64_t>(m.ByteSizeLong()), options_.disk_reserve_bytes / 2,
                     disk);
  if (!room.ok) {
    return refuse(absl::ResourceExhaustedError(
        absl::StrCat(room.reason, " (--data-dir ", options_.data_dir, ")")));
  }
  m.set_total_bytes(sizes->total_bytes);
  m.set_pinned(false);
  const absl::Time now = absl::Now();
  m.mutable_commit_time()->set_seconds(absl::ToUnixSeconds(now));
  m.mutable_commit_time()->set_nanos(static_cast<int32_t>(absl::ToUnixNanos(now) % 1000000000));
  WEFT_RETURN_IF_ERROR(WriteCommitLocked(m));
  committed_->Increment();
  UpdateStoreBytes();
  return m;
}

absl::Status CheckpointStore::ReadShardMarkers(const std::string& job, int64_t step, int world_size,
                                               std::map<int, ShardHeader>* shards,
                                               std::vector<int>* missing) {
  for (int rank = 0; rank < world_size; ++rank) {
    std::string value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), RankKey("shard", job, step, rank), &value);
    if (s.IsNotFound()) {
      missing->push_back(rank);
      continue;
    }
    WEFT_RETURN_IF_ERROR(FromRocks(s, "checkpoint store read"));
    if (!(*shards)[rank].ParseFromString(value)) {
      return absl::DataLossError(absl::StrCat("shard marker of rank ", rank, " is unreadable"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointStore::WriteCommitLocked(const CheckpointManifest& m) {
  const std::string& job = m.job_id();
  rocksdb::WriteBatch batch;
  batch.Put(ManifestKey(job, m.step()), m.SerializeAsString());
  batch.Delete(StepPrefix("pending", job, m.step()));
  const int keep = m.spec().checkpoint().keep_last();
  std::vector<int64_t> victims;
  if (keep >= 1) {
    WEFT_ASSIGN_OR_RETURN(auto existing, List(job));  // newest first, without this one
    std::vector<StoredCheckpoint> stored;
    for (const auto& old : existing) stored.push_back({old.step(), old.pinned()});
    RetentionDecision retention = DecideRetention(m.step(), keep, stored);
    if (!retention.victims.empty()) {
      spdlog::info("retention of checkpoints of {}: {}", job, retention.reason);
    }
    for (int64_t victim : retention.victims) DeleteStep(job, victim, &batch);
    victims = std::move(retention.victims);
  }
  WEFT_RETURN_IF_ERROR(FromRocks(db_->Write(Synced(), &batch), "checkpoint commit"));
  CompactSteps(job, victims);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointManifest>> CheckpointStore::List(const std::string& job) {
  WEFT_RETURN_IF_ERROR(CheckName(job, "job_id"));
  const std::string prefix = absl::StrCat("manifest/", job, "/");
  std::vector<CheckpointManifest> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekForPrev(PrefixEnd(prefix)); it->Valid() && it->key().starts_with(prefix);
       it->Prev()) {
    CheckpointManifest m;
    if (!m.ParseFromArray(it->value().data(), static_cast<int>(it->value().size()))) {
      return absl::DataLossError(absl::StrCat("manifest ", it->key().ToString(), " unreadable"));
    }
    out.push_back(std::move(m));
  }
  WEFT_RETURN_IF_ERROR(FromRocks(it->status(), "checkpoint store scan"));
  return out;
}

absl::StatusOr<CheckpointManifest> CheckpointStore::GetManifest(const std::string& job,
                                                                int64_t step) {
  return ReadManifest(job, step, rocksdb::ReadOptions());
}

absl::StatusOr<CheckpointManifest> CheckpointStore::ReadManifest(const std::string& job,
                                                                 int64_t step,
                                                                 const rocksdb::ReadOptions& ro) {
  WEFT_RETURN_IF_ERROR(CheckName(job, "job_id"));
  if (step < 0) return absl::InvalidArgumentError("step: must be >= 0 (0: latest)");
  if (step != 0) return ReadManifestAt(job, step, ro);
  const std::string prefix = absl::StrCat("manifest/", job, "/");
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  it->SeekForPrev(PrefixEnd(prefix));
  WEFT_RETURN_IF_ERROR(FromRocks(it->status(), "checkpoint store scan"));
  if (!it->Valid() || !it->key().starts_with(prefix)) {
    return absl::NotFoundError(absl::StrCat("job ", job, " has no committed checkpoint"));
  }
  std::string unused_job;
  int64_t latest = 0;
  ParseJobStep(it->key(), &unused_job, &latest);
  return ParseManifest(std::string_view(it->value().data(), it->value().size()), job, latest);
}

absl::StatusOr<CheckpointManifest> CheckpointStore::ReadManifestAt(const std::string& job,
                                                                   int64_t step,
                                                                   const rocksdb::ReadOptions& ro) {
  std::string value;
  rocksdb::Status s = db_->Get(ro, ManifestKey(job, step), &value);
  if (s.IsNotFound()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job, " has no committed checkpoint at step ", step));
  }
  WEFT_RETURN_IF_ERROR(FromRocks(s, "checkpoint store read"));
  return ParseManifest(value, job, step);
}

absl::Status CheckpointStore::ReadRange(const weft::v1::ReadRangeRequest& req,
                                        absl::FunctionRef<bool(const ShardChunk&)> emit) {
  const absl::Time start = absl::Now();
  WEFT_RETURN_IF_ERROR(CheckName(req.tensor(), "tensor"));
  if (req.step() < 0) return absl::InvalidArgumentError("step: must be >= 0");
  // One snapshot for manifest and data: a concurrent delete cannot tear the read.
  const rocksdb::Snapshot* snapshot = db_->GetSnapshot();
  struct Release {
    rocksdb::DB* db;
    const rocksdb::Snapshot* s;
    ~Release() { db->ReleaseSnapshot(s); }
  } release{db_.get(), snapshot};
  rocksdb::ReadOptions ro;
  ro.snapshot = snapshot;
  ro.verify_checksums = true;
  WEFT_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifest(req.job_id(), req.step(), ro));
  const TensorLayout* layout = nullptr;
  for (const auto& t : m.tensors()) {
    if (t.name() == req.tensor()) layout = &t;
  }
  if (layout == nullptr) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", req.job_id(), " step ", m.step(),
                                            " has no tensor ", req.tensor()));
  }
  int64_t numel = 0;
  WEFT_RETURN_IF_ERROR(CheckLayout(*layout, &numel));
  const int es = ElementSize(layout->dtype());
  if (req.begin() < 0 || req.begin() > req.end() || req.end() > numel) {
    return absl::OutOfRangeError(absl::StrCat("range [", req.begin(), ", ", req.end(),
                                              ") of tensor ", req.tensor(), ": must be within [0, ",
                                              numel, "]"));
  }
  struct Piece {
    int64_t begin, end;
    int rank;
  };
  std::vector<Piece> pieces;
  for (const auto& rs : m.ranks()) {
    for (const auto& r : rs.ranges()) {
      if (r.tensor() == req.tensor() && r.end() > req.begin() && r.begin() < req.end()) {
        pieces.push_back({r.begin(), r.end(), rs.rank()});
      }
    }
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
  auto loss = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("tensor ", req.tensor(), " of checkpoint ",
                                            req.job_id(), " step ", m.step(), ": ", why));
  };
  int64_t pos = req.begin();
  ShardChunk out;
  out.set_tensor(req.tensor());
  for (const Piece& piece : pieces) {
    const std::string prefix = ChunkPrefix(m.job_id(), m.step(), piece.rank, req.tensor());
    const int64_t stop = std::min(piece.end, req.end());
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
    // The chunk holding `pos` is the last one starting at or before it.
    it->SeekForPrev(absl::StrCat(prefix, absl::StrFormat("%020d", pos)));
    while (pos < stop) {
      if (!it->status().ok()) return loss(it->status().ToString());
      if (!it->Valid() || !it->key().starts_with(prefix)) {
        return loss(absl::StrCat("no stored chunk holds element ", pos));
      }
      int64_t offset = 0;
      if (!absl::SimpleAtoi(it->key().ToString().substr(prefix.size()), &offset)) {
        return loss(absl::StrCat("bad key ", it->key().ToString()));
      }
      const rocksdb::Slice v = it->value();
      if (!it->status().ok()) return loss(it->status().ToString());
      const absl::StatusOr<std::string_view> data =
          DecodeChunkValue(std::string_view(v.data(), v.size()), es, offset);
      if (!data.ok()) return loss(std::string(data.status().message()));
      const int64_t chunk_end = offset + static_cast<int64_t>(data->size() / es);
      if (offset > pos || chunk_end <= pos) {
        return loss(absl::StrCat("no stored chunk holds element ", pos));
      }
      const int64_t take_end = std::min(chunk_end, stop);
      out.set_offset_elements(pos);
      out.set_data(data->data() + (pos - offset) * es, (take_end - pos) * es);
      out.set_crc32c(Crc32c(out.data().data(), out.data().size()));
      if (!emit(out)) return absl::CancelledError("reader went away");
      bytes_read_->Increment(static_cast<double>(out.data().size()));
      pos = take_end;
      it->Next();
    }
  }
  if (pos != req.end()) {
    return loss(absl::StrCat("the manifest's ranges leave element ", pos, " uncovered"));
  }
  restore_seconds_->Observe(absl::ToDoubleSeconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status CheckpointStore::SetPinned(const std::string& job, int64_t step, bool pinned) {
  WEFT_RETURN_IF_ERROR(CheckName(job, "job_id"));
  absl::MutexLock lock(&mu_);
  // An exact step: "0 = latest" is GetManifest's convenience only.
  WEFT_ASSIGN_OR_RETURN(CheckpointManifest m, ReadManifestAt(job, step, rocksdb::ReadOptions()));
  m.set_pinned(pinned);
  ReleaseBallastIfFullLocked();
  return FromRocks(db_->Put(Synced(), ManifestKey(job, step), m.SerializeAsString()),
                   "checkpoint store write");
}

absl::Status CheckpointStore::Delete(const std::string& job, int64_t step) {
  WEFT_RETURN_IF_ERROR(CheckName(job, "job_id"));
  absl::MutexLock lock(&mu_);
  // Both read the manifest the same way. An unreadable one (DATA_LOSS) cannot be pinned, but it
  // can be deleted: the checkpoint can never be restored, and while it stays every List of the
  // job fails, so deleting it is how an operator clears it.
  absl::StatusOr<CheckpointManifest> m = ReadManifestAt(job, step, rocksdb::ReadOptions());
  if (!m.ok() && m.status().code() != absl::StatusCode::kDataLoss) return m.status();
  if (!m.ok()) {
    spdlog::warn("deleting checkpoint {} step {} whose manifest is unreadable: {}", job, step,
                 std::string(m.status().message()));
  } else if (m->pinned()) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", job, " step ", step, " is pinned; unpin it first"));
  }
  ReleaseBallastIfFullLocked();
  rocksdb::WriteBatch batch;
  DeleteStep(job, step, &batch);
  WEFT_RETURN_IF_ERROR(FromRocks(db_->Write(Synced(), &batch), "checkpoint delete"));
  CompactSteps(job, {step});
  UpdateStoreBytes();
  RestoreBallastLocked();
  return absl::OkStatus();
}

absl::Status CheckpointStore::Sweep() {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  rocksdb::WriteBatch batch;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek("pending/"); it->Valid() && it->key().starts_with("pending/"); it->Next()) {
    std::string job;
    int64_t step = 0, micros = 0;
    if (!ParseJobStep(it->key(), &job, &step) ||
        !absl::SimpleAtoi(it->value().ToString(), &micros)) {
      batch.Delete(it->key());
      continue;
    }
    WEFT_ASSIGN_OR_RETURN(bool committed, IsCommitted(job, step));
    if (committed) {
      batch.Delete(it->key());
      continue;
    }
    if (now - absl::FromUnixMicros(micros) < options_.gc_grace) continue;
    bool open = false;
    for (const auto& [j, s, r] : open_streams_) open |= (j == job && s == step);
    if (open) continue;
    spdlog::info("collecting uncommitted checkpoint {} step {}", job, step);
    DeleteStep(job, step, &batch);
  }
  WEFT_RETURN_IF_ERROR(FromRocks(it->status(), "checkpoint store scan"));
  if (batch.Count() > 0) {
    ReleaseBallastIfFullLocked();
    WEFT_RETURN_IF_ERROR(FromRocks(db_->Write(rocksdb::WriteOptions(), &batch), "sweep"));
  }
  UpdateStoreBytes();
  return absl::OkStatus();
}

void CheckpointStore::UpdateStoreBytes() {
  uint64_t sst = 0, blob = 0;
  db_->GetIntProperty("rocksdb.total-sst-files-size", &sst);
  db_->GetIntProperty("rocksdb.total-blob-file-size", &blob);
  store_bytes_->Set(static_cast<double>(sst + blob));
}

absl::StatusOr<DiskSpace> CheckpointStore::DiskSpaceLocked() {
  WEFT_ASSIGN_OR_RETURN(const int64_t available, AvailableBytes(options_.data_dir));
  return DiskSpace{.free_bytes = available + (ballast_present_ ? ballast_bytes_ : 0),
                   .promised_bytes = promised_bytes_};
}

void CheckpointStore::ReleaseBallastIfFullLocked() {
  if (!ballast_present_) return;
  const absl::StatusOr<int64_t> available = AvailableBytes(options_.data_dir);
  if (available.ok() && *available >= ballast_bytes_) return;
  spdlog::warn("disk of {} is full ({} bytes free): removing the {}-byte ballast to make room",
               options_.data_dir, available.ok() ? *available : 0, ballast_bytes_);
  if (unlink(ballast_path_.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("cannot remove {}: {}", ballast_path_, std::strerror(errno));
    return;
  }
  ballast_present_ = false;
}

void CheckpointStore::RestoreBallastLocked() {
  if (ballast_present_ || ballast_bytes_ == 0) return;
  const absl::StatusOr<int64_t> available = AvailableBytes(options_.data_dir);
  if (!available.ok() || *available < 2 * ballast_bytes_) return;
  if (absl::Status s = WriteBallast(ballast_path_, ballast_bytes_); !s.ok()) {
    spdlog::warn("cannot write the disk ballast: {}", std::string(s.message()));
    return;
  }
  ballast_present_ = true;
}

void CheckpointStore::CompactSteps(const std::string& job, const std::vector<int64_t>& steps) {
  rocksdb::CompactRangeOptions options;
  // Automatic compactions go on meanwhile: this is a small range of keys (the data is in
  // blob files, which a compaction only marks as garbage).
  options.exclusive_manual_compaction = false;
  // Garbage collection would rewrite the live blobs of older checkpoints here, which needs
  // room the disk may not have when a delete is meant to free it.
  options.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kDisable;
  for (int64_t step : steps) {
    const std::string begin = StepPrefix("ckpt", job, step);
    const std::string end = PrefixEnd(begin);
    const rocksdb::Slice b(begin), e(end);
    if (rocksdb::Status s = db_->CompactRange(options, &b, &e); !s.ok()) {
      // The deletion stands; its space comes back with a later compaction.
      spdlog::warn("compacting deleted checkpoint {} step {}: {}", job, step, s.ToString());
    }
  }
}

}  // namespace weft::checkpointd
