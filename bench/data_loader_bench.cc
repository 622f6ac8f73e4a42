// data_loader_bench: the CPU cost of the data loader on GPU training shapes. Writes a prepared
// dataset (a manifest and --shards token files of --shard-tokens synthetic tokens each) per
// token width, opens it as a worker does (size, crc32c and vocabulary checked in one pass) and
// times TokenDataset::Batch producing one rank's micro-batch, for RANDOM_WINDOWS and
// SEQUENTIAL. Reports the median over --steps calls and that time as a share of the shape's
// GPU step, so "< 1%" can be read off directly:
//
//   BENCH data_loader shape=gpt2_124m:16x1024 sampling=SEQUENTIAL us_per_step=..
//         pct_of_step=.. gpu_step_ms=..
//
// GPU step times, one H200 per rank:
//  - GPT-2 124M, B 16 x T 1024 per rank: Weft's ~419,844 tokens/s per GPU (docs/performance.md),
//    so one step of 16,384 tokens takes 16384 / 419844 = 39.0 ms.
//  - Llama-1B, B 8 x T 2048 per rank: no Weft figure is recorded yet; the peer framework's
//    59,275 tokens/s on one H200 gives 16384 / 59275 = 276 ms.
// The shards are freshly written, so they are in the page cache, as a dataset read every epoch
// is; a first read from a cold disk costs the disk's latency on top (the worker does not
// prefetch).
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "worker/data/manifest.h"
#include "worker/data/random.h"
#include "worker/data/token_dataset.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace data = weft::data;

struct Shape {
  const char* name;
  int batch;
  int seq_len;
  int vocab;
  weft::v1::DataFormat format;
  double gpu_tokens_per_s;  // one rank's, from docs/performance.md
};

double Median(std::vector<double> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

// One llm.c token file of `tokens` random ids below `vocab`, its manifest entry filled in.
data::ManifestShard WriteShard(const std::string& dir, int index, int64_t tokens, int vocab,
                               int width, uint64_t* rng) {
  std::string bytes(1024 + tokens * width, '\0');
  const int32_t header[3] = {width == 2 ? 20240520 : 20240801, width == 2 ? 1 : 7,
                             static_cast<int32_t>(tokens)};
  std::memcpy(bytes.data(), header, sizeof(header));
  for (int64_t i = 0; i < tokens; ++i) {
    const auto id = static_cast<uint32_t>(data::SplitMix64Next(rng) % vocab);
    std::memcpy(bytes.data() + 1024 + i * width, &id, width);  // little-endian host
  }
  data::ManifestShard shard{absl::StrCat("train-", index, ".bin"), tokens,
                            static_cast<int64_t>(bytes.size()),
                            weft::Crc32c(bytes.data(), bytes.size())};
  FILE* f = std::fopen((dir + "/" + shard.file).c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return shard;
}

std::string WriteDataset(const std::string& root, const Shape& shape, int shards,
                         int64_t shard_tokens) {
  const std::string dir = absl::StrCat(root, "/", shape.name);
  std::filesystem::create_directories(dir);
  const int width = shape.format == weft::v1::DATA_FORMAT_UINT16_BIN ? 2 : 4;
  data::DatasetManifest m;
  m.token_format = shape.format;
  m.tokenizer = {"sentencepiece", "tokenizer.model", 0, shape.vocab, 1, 2};
  const std::string model = "bench tokenizer";
  FILE* f = std::fopen((dir + "/tokenizer.model").c_str(), "wb");
  std::fwrite(model.data(), 1, model.size(), f);
  std::fclose(f);
  m.tokenizer.crc32c = weft::Crc32c(model.data(), model.size());
  m.document_separator = "eos";
  uint64_t rng = 1;
  for (int k = 0; k < shards; ++k) {
    m.train.push_back(WriteShard(dir, k, shard_tokens, shape.vocab, width, &rng));
  }
  const absl::Status written = data::WriteManifest(m, dir);
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", written.ToString().c_str());
    std::exit(1);
  }
  return dir;
}

void Run(const std::string& dir, const Shape& shape, weft::v1::DataSpec::Sampling sampling,
         int steps) {
  weft::v1::DataSpec spec;
  spec.set_manifest_path(dir);
  spec.set_sampling(sampling);
  const auto open_start = Clock::now();
  auto ds = data::TokenDataset::Open(spec, {shape.vocab, shape.seq_len, 1}, data::Split::kTrain);
  const double open_s = std::chrono::duration<double>(Clock::now() - open_start).count();
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", ds.status().ToString().c_str());
    std::exit(1);
  }
  // Rank 3 of 8, so the indices are not the first ones.
  std::vector<int32_t> in(static_cast<size_t>(shape.batch) * shape.seq_len), out(in.size());
  std::vector<double> us;
  for (int step = -3; step < steps; ++step) {
    const auto start = Clock::now();
    (*ds)->Batch(7, std::max(step, 0) + 1000, 0, 3, 8, shape.batch, in.data(), out.data());
    const double t = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    if (step >= 0) us.push_back(t);
  }
  const double step_ms = 1e3 * shape.batch * shape.seq_len / shape.gpu_tokens_per_s;
  const double median = Median(us);
  const double bytes = static_cast<double>((*ds)->num_tokens()) *
                       (shape.format == weft::v1::DATA_FORMAT_UINT16_BIN ? 2 : 4);
  std::printf(
      "BENCH data_loader shape=%s:%dx%d sampling=%s us_per_step=%.1f pct_of_step=%.4f "
      "gpu_step_ms=%.1f open_gb_per_s=%.2f\n",
      shape.name, shape.batch, shape.seq_len,
      weft::v1::DataSpec::Sampling_Name(sampling).c_str(), median, 100.0 * median / 1e3 / step_ms,
      step_ms, bytes / 1e9 / open_s);
}

}  // namespace

int main(int argc, char** argv) {
  int shards = 8;
  int64_t shard_tokens = 4 << 20;
  int steps = 200;
  std::string root;
  CLI::App app{"Times the data loader producing one rank's batch on GPU training shapes."};
  app.add_option("--shards", shards, "token files in each dataset");
  app.add_option("--shard-tokens", shard_tokens, "tokens a file");
  app.add_option("--steps", steps, "timed batches (the median is reported)");
  app.add_option("--dir", root, "where to write the datasets (default: a fresh temp folder)");
  CLI11_PARSE(app, argc, argv);
  const bool own_root = root.empty();
  if (own_root) {
    std::string pattern = (std::filesystem::temp_directory_path() / "weft-data-bench-XXXXXX");
    if (mkdtemp(pattern.data()) == nullptr) return 1;
    root = pattern;
  }
  const Shape shapes[] = {
      {"gpt2_124m", 16, 1024, 50257, weft::v1::DATA_FORMAT_UINT16_BIN, 419844},
      {"llama_1b", 8, 2048, 128256, weft::v1::DATA_FORMAT_UINT32_BIN, 59275},
  };
  for (const Shape& shape : shapes) {
    const std::string dir = WriteDataset(root, shape, shards, shard_tokens);
    for (auto sampling : {weft::v1::DataSpec::RANDOM_WINDOWS, weft::v1::DataSpec::SEQUENTIAL}) {
      Run(dir, shape, sampling, steps);
    }
  }
  if (own_root) std::filesystem::remove_all(root);
  return 0;
}
