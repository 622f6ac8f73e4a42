// Checkpoint save/restore throughput against a real weft-checkpointd, compared with what the
// disk gives a plain sequential write of the same bytes in the same directory.
//
// --ranks ranks (threads, each its own CheckpointClient and so its own TCP connection; 2 by
// default) write equal parts of four f32 tensors of random data (--bytes in all), the
// checkpoint is committed, then as many readers read everything back and check CRC32C against
// the source: how checkpointd's throughput grows with the ranks streaming into it. The baseline
// writes the same bytes to one file in 4 MiB writes and fdatasyncs it. Save and baseline both
// end on durable storage (the daemon syncs each shard and the commit), so save_vs_raw is the
// fraction of the disk's sequential bandwidth the checkpoint path achieves.
//
// Prints exactly one line on stdout:
//   BENCH checkpoint ranks=N bytes=B save_gbps=X restore_gbps=Y raw_write_gbps=Z save_vs_raw=R
// (GB/s = 1e9 bytes/s). Progress and errors go to stderr; exit status 1 on any failure.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/checkpoint_client.h"
#include "common/crc32c.h"
#include "tests/testing/subprocess.h"

namespace weft {
namespace {

constexpr int kTensors = 4;
constexpr char kJob[] = "bench";
constexpr int64_t kStep = 1;
// Read-back piece: bounds the reader's buffer whatever --bytes is.
constexpr int64_t kReadPieceElements = int64_t{16} << 20;  // 64 MiB of f32

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "checkpoint_bench: %s\n", std::string(status.message()).c_str());
  return 1;
}

// The directory this executable lives in: weft-checkpointd is built next to it.
std::string ExeDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// Rank `rank` of `ranks`'s part [begin, end) of a tensor of `n` elements.
std::pair<int64_t, int64_t> Split(int64_t n, int rank, int ranks) {
  return {n * rank / ranks, n * (rank + 1) / ranks};
}

// One rank's part of every tensor, random, with the CRC32C of each part.
struct RankData {
  std::vector<std::vector<float>> parts;  // per tensor
  std::vector<uint32_t> crcs;
};

RankData MakeRankData(int64_t tensor_elems, int rank, int ranks) {
  RankData d;
  std::mt19937_64 rng(0x5eed + rank);
  for (int t = 0; t < kTensors; ++t) {
    auto [b, e] = Split(tensor_elems, rank, ranks);
    std::vector<float> part(e - b);
    // Random bits (not random floats): what is stored is bytes, and compressible data would
    // flatter the store.
    auto* words = reinterpret_cast<uint32_t*>(part.data());
    for (size_t i = 0; i < part.size(); ++i) words[i] = static_cast<uint32_t>(rng());
    d.crcs.push_back(Crc32c(part.data(), part.size() * sizeof(float)));
    d.parts.push_back(std::move(part));
  }
  return d;
}

std::string TensorName(int t) { return absl::StrCat("bench.t", t); }

// Sequential write of `parts` to `path` in 4 MiB writes, then fdatasync: the disk's number.
absl::StatusOr<absl::Duration> RawWrite(const std::string& path,
                                        const std::vector<RankData>& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return absl::InternalError(absl::StrCat("open ", path, ": ", std::strerror(errno)));
  const absl::Time start = absl::Now();
  for (const RankData& d : data) {
    for (const auto& part : d.parts) {
      const char* p = reinterpret_cast<const char*>(part.data());
      size_t left = part.size() * sizeof(float);
      while (left > 0) {
        const ssize_t n = ::write(fd, p, std::min<size_t>(left, kMaxCheckpointChunkBytes));
        if (n < 0) {
          if (errno == EINTR) continue;
          ::close(fd);
          return absl::InternalError(absl::StrCat("write ", path, ": ", std::strerror(errno)));
        }
        p += n;
        left -= static_cast<size_t>(n);
      }
    }
  }
  if (::fdatasync(fd) != 0) {
    ::close(fd);
    return absl::InternalError(absl::StrCat("fdatasync ", path, ": ", std::strerror(errno)));
  }
  const absl::Duration took = absl::Now() - start;
  ::close(fd);
  return took;
}

int Main(int argc, char** argv) {
  CLI::App app{"Checkpoint save/restore throughput vs raw sequential write"};
  int64_t bytes = int64_t{1} << 30;
  int ranks = 2;
  std::string dir;
  app.add_option("--bytes", bytes, "Tensor bytes to checkpoint (split over the ranks, 4 tensors)")
      ->check(CLI::Range(int64_t{1} << 20, int64_t{8} << 30))
      ->capture_default_str();
  app.add_option("--ranks", ranks, "Ranks writing (and then reading) concurrently, each over "
                 "its own connection")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--dir", dir,
                 "Parent directory for the daemon's data and the baseline file (default: "
                 "$TEST_TMPDIR or /tmp)");
  CLI11_PARSE(app, argc, argv);
  if (!dir.empty()) ::setenv("TEST_TMPDIR", dir.c_str(), 1);

  const int64_t tensor_elems = bytes / (kTensors * static_cast<int64_t>(sizeof(float)));
  const int64_t total = tensor_elems * kTensors * static_cast<int64_t>(sizeof(float));

  testing::TempDir tmp;
  std::fprintf(stderr, "checkpoint_bench: %lld bytes in %s\n", static_cast<long long>(total),
               tmp.path().c_str());
  std::vector<RankData> data(ranks);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] { data[r] = MakeRankData(tensor_elems, r, ranks); });
    }
    for (auto& t : threads) t.join();
  }

  auto daemon = testing::CheckpointdProcess::Start(tmp.path(), ExeDir());
  if (!daemon.ok()) return Fail(daemon.status());
  const std::string address = (*daemon)->address();
  const absl::Duration timeout = absl::Minutes(10);

  // Save: every rank streams concurrently; the commit is part of the save.
  std::vector<absl::Status> results(ranks);
  const absl::Time save_start = absl::Now();
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        CheckpointClient client(address, timeout);
        std::vector<ShardTensor> shard;
        for (int t = 0; t < kTensors; ++t) {
          auto [b, e] = Split(tensor_elems, r, ranks);
          shard.push_back({TensorName(t), v1::DTYPE_F32, {tensor_elems}, b, e,
                           data[r].parts[t].data()});
        }
        auto written = client.WriteShard(kJob, kStep, r, ranks, shard);
        results[r] = written.ok() ? absl::OkStatus() : written.status();
      });
    }
    for (auto& t : threads) t.join();
  }
  for (const absl::Status& s : results) {
    if (!s.ok()) return Fail(s);
  }
  CheckpointClient client(address, timeout);
  v1::CheckpointManifest manifest;
  manifest.set_job_id(kJob);
  manifest.set_step(kStep);
  manifest.set_world_size(ranks);
  for (int t = 0; t < kTensors; ++t) {
    auto* layout = manifest.add_tensors();
    layout->set_name(TensorName(t));
    layout->set_dtype(v1::DTYPE_F32);
    layout->add_shape(tensor_elems);
  }
  if (absl::Status s = client.Commit(manifest); !s.ok()) return Fail(s);
  const absl::Duration save = absl::Now() - save_start;

  // Restore: one reader per rank, each the same part as a writer so CRCs compare part by part.
  const absl::Time restore_start = absl::Now();
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&, r] {
        CheckpointClient reader(address, timeout);
        std::vector<float> buffer(static_cast<size_t>(kReadPieceElements));
        for (int t = 0; t < kTensors && results[r].ok(); ++t) {
          auto [b, e] = Split(tensor_elems, r, ranks);
          uint32_t crc = 0;
          for (int64_t p = b; p < e; p += kReadPieceElements) {
            const int64_t q = std::min(e, p + kReadPieceElements);
            results[r] = reader.ReadRange(kJob, kStep, TensorName(t), p, q, buffer.data());
            if (!results[r].ok()) break;
            crc = Crc32c(buffer.data(), (q - p) * sizeof(float), crc);
          }
          if (results[r].ok() && crc != data[r].crcs[t]) {
            results[r] = absl::DataLossError(absl::StrCat(
                "read-back of ", TensorName(t), " rank ", r, " differs from what was written"));
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  const absl::Duration restore = absl::Now() - restore_start;
  for (const absl::Status& s : results) {
    if (!s.ok()) return Fail(s);
  }

  (*daemon)->process().Signal(SIGTERM);
  (void)(*daemon)->process().Wait(absl::Seconds(60));

  // Baseline on the same disk, with the daemon's data still there (same free space).
  auto raw = RawWrite(tmp.File("raw.bin"), data);
  if (!raw.ok()) return Fail(raw.status());
  std::remove(tmp.File("raw.bin").c_str());

  auto gbps = [&](absl::Duration d) { return total / absl::ToDoubleSeconds(d) / 1e9; };
  std::printf("BENCH checkpoint ranks=%d bytes=%lld save_gbps=%.3f restore_gbps=%.3f "
              "raw_write_gbps=%.3f save_vs_raw=%.3f\n",
              ranks, static_cast<long long>(total), gbps(save), gbps(restore), gbps(*raw),
              gbps(save) / gbps(*raw));
  return 0;
}

}  // namespace
}  // namespace weft

int main(int argc, char** argv) { return weft::Main(argc, argv); }
