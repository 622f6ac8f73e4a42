#include "worker/engine/model_arch.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/engine/gpt2/gpt2_arch.h"
#include "worker/engine/llama/llama_arch.h"

namespace weft::engine {
namespace {

// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Uniform in (0, 1]: never 0, so log() in Box-Muller stays finite.
double ToUnit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53; }

constexpr double kInitStd = 0.02;
// Elements per thread below which another thread costs more than it saves (about a
// millisecond of noise).
constexpr size_t kMinInitChunk = size_t{1} << 16;

// Floats the tensors tile (they are contiguous from 0).
size_t TiledSize(const std::vector<TensorInfo>& tensors) {
  return tensors.empty() ? 0 : tensors.back().offset + tensors.back().size;
}

// A range outside the unit is a caller's bug: abort with the figures rather than write past
// the buffer.
void CheckRange(const std::vector<TensorInfo>& tensors, size_t begin, size_t end) {
  if (begin <= end && end <= TiledSize(tensors)) return;
  std::fprintf(stderr, "weft::engine: range [%zu, %zu) outside a unit of %zu floats\n", begin,
               end, TiledSize(tensors));
  std::abort();
}

// Elements [begin, end) of the unit into out[0, end - begin), on the calling thread.
void InitTensorChunk(const std::vector<TensorInfo>& tensors, uint64_t key, double residual_std,
                     size_t begin, size_t end, float* out) {
  for (const TensorInfo& info : tensors) {
    const size_t lo = std::max(begin, info.offset);
    const size_t hi = std::min(end, info.offset + info.size);
    if (lo >= hi) continue;
    // Past live_size (vocabulary padding) every init is 0.
    const size_t live_end = std::max(lo, std::min(hi, info.offset + info.live_size));
    float* const live_out = out + (lo - begin);  // element lo
    float* const live_stop = out + (live_end - begin);
    switch (info.init) {
      case TensorInit::kNormal:
      case TensorInit::kResidualNormal: {
        const double stddev = info.init == TensorInit::kNormal ? kInitStd : residual_std;
        for (size_t i = lo; i < live_end; ++i) {
          out[i - begin] = static_cast<float>(stddev * StandardNormalAt(key, i));
        }
        break;
      }
      case TensorInit::kOnes:
        std::fill(live_out, live_stop, 1.0f);
        break;
      case TensorInit::kZeros:
        std::fill(live_out, live_stop, 0.0f);
        break;
    }
    std::fill(live_stop, out + (hi - begin), 0.0f);
  }
}

}  // namespace

void AppendTensor(std::vector<TensorInfo>* tensors, std::string name, std::vector<int64_t> shape,
                  bool decay, TensorInit init) {
  TensorInfo info;
  info.name = std::move(name);
  info.offset = tensors->empty() ? 0 : tensors->back().offset + tensors->back().size;
  info.size = 1;
  for (int64_t d : shape) info.size *= static_cast<size_t>(d);
  info.shape = std::move(shape);
  info.decay = decay;
  info.init = init;
  info.live_size = info.size;
  tensors->push_back(std::move(info));
}

void FillDecayMask(const std::vector<TensorInfo>& tensors, uint8_t* mask) {
  FillDecayMaskRange(tensors, 0, TiledSize(tensors), mask);
}

void FillDecayMaskRange(const std::vector<TensorInfo>& tensors, size_t begin, size_t end,
                        uint8_t* mask) {
  CheckRange(tensors, begin, end);
  for (const TensorInfo& info : tensors) {
    const size_t lo = std::max(begin, info.offset);
    const size_t hi = std::min(end, info.offset + info.size);
    if (lo < hi) std::fill(mask + (lo - begin), mask + (hi - begin), info.decay ? 1 : 0);
  }
}

uint64_t InitStreamKey(uint64_t seed, int unit) {
  return Mix(seed ^ Mix(0x5745465400000000ULL + static_cast<uint64_t>(unit)));
}

// Box-Muller, cosine branch only; any element can be recomputed on its own.
double StandardNormalAt(uint64_t key, uint64_t index) {
  const double u1 = ToUnit(Mix(key ^ Mix(2 * index)));
  const double u2 = ToUnit(Mix(key ^ Mix(2 * index + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

void InitTensors(const std::vector<TensorInfo>& tensors, uint64_t key, int num_layers,
                 float* params) {
  InitTensorRange(tensors, key, num_layers, 0, TiledSize(tensors), params);
}

void InitTensorRange(const std::vector<TensorInfo>& tensors, uint64_t key, int num_layers,
                     size_t begin, size_t end, float* out, int threads) {
  CheckRange(tensors, begin, end);
  const double residual_std = kInitStd / std::sqrt(2.0 * num_layers);
  const size_t n = end - begin;
  size_t chunks = static_cast<size_t>(threads);
  if (threads <= 0) {
    const size_t hardware = std::max(1u, std::thread::hardware_concurrency());
    chunks = std::min(hardware, std::max<size_t>(1, n / kMinInitChunk));
  }
  chunks = std::max<size_t>(1, std::min(chunks, n));
  const size_t per = (n + chunks - 1) / chunks;
  auto run = [&](size_t c) {
    const size_t b = begin + std::min(n, c * per);
    const size_t e = begin + std::min(n, (c + 1) * per);
    InitTensorChunk(tensors, key, residual_std, b, e, out + (b - begin));
  };
  std::vector<std::thread> pool;
  size_t c = 1;
  try {
    for (; c < chunks; ++c) pool.emplace_back(run, c);
  } catch (const std::system_error&) {
    // No thread to be had (a process at its limits): the caller does the rest itself, which
    // gives the same values.
    for (size_t rest = c; rest < chunks; ++rest) run(rest);
  }
  run(0);
  for (std::thread& t : pool) t.join();
}

void ModelArch::InitUnitRange(int unit, uint64_t seed, size_t begin, size_t end, float* out,
                              int threads) const {
  InitTensorRange(UnitTensors(unit), InitStreamKey(seed, unit), num_layers(), begin, end, out,
                  threads);
}

size_t ModelArch::ParameterCount() const {
  size_t total = 0;
  for (int u = 0; u < NumUnits(); ++u) total += UnitSize(u);
  return total;
}

absl::StatusOr<std::unique_ptr<const ModelArch>> MakeModelArch(const weft::v1::ModelSpec& spec) {
  if (LlamaFamilyOf(spec.architecture()).has_value()) {
    const LlamaConfig config = LlamaConfigFromSpec(spec);
    const std::vector<std::string> problems = LlamaConfigProblems(config);
    if (!problems.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: not a ", weft::v1::Architecture_Name(spec.architecture()),
                       " shape: ", absl::StrJoin(problems, "; ")));
    }
    return std::make_unique<const LlamaArch>(config);
  }
  if (spec.architecture() != weft::v1::GPT2 &&
      spec.architecture() != weft::v1::ARCHITECTURE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("model.architecture: unknown value ", spec.architecture()));
  }
  const GptConfig config = ConfigFromSpec(spec);
  if (config.num_layers < 1 || config.hidden_size < 1 || config.num_heads < 1 ||
      config.hidden_size % config.num_heads != 0 || config.vocab_size < 1 ||
      config.padded_vocab_size < config.vocab_size || config.context_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: not a GPT-2 shape (num_layers ", config.num_layers, ", hidden_size ",
                     config.hidden_size, ", num_heads ", config.num_heads, ", vocab_size ",
                     config.vocab_size, ", padded_vocab_size ", config.padded_vocab_size,
                     ", context_length ", config.context_length, ")"));
  }
  return std::make_unique<const Gpt2Arch>(config);
}

}  // namespace weft::engine
