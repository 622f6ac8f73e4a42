// host_adamw_bench: the host step of optimizer offload (AdamWUpdateParallel: AdamW over the
// host's cores, each new parameter rounded to bf16 for the device's working copy), against the
// two-pass form it replaced (AdamWUpdate, then a second pass reading the parameters back for
// their bf16 patterns), on the same buffers in the same run. The step streams 31 bytes a
// parameter (reads: parameter, gradient, m, v, mask; writes: parameter, m, v, bf16), so it is
// bound by memory bandwidth; the figure to watch is gb_per_s against the machine's.
//
//   BENCH host_adamw params=N threads=T reps=R fused_gparams_per_s=.. two_pass_gparams_per_s=..
//     speedup=.. fused_gb_per_s=..
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "worker/engine/adamw.h"

namespace {

using Clock = std::chrono::steady_clock;

// The rounding as the two-pass form had it, inline in its loop (which GCC vectorized).
inline uint16_t OldBf16Bits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// The two-pass form: AdamWUpdate over `threads` chunks, then the bf16 patterns in a second pass.
void TwoPass(float* p, const float* g, float* m, float* v, const uint8_t* mask, size_t n,
             const weft::engine::AdamWConfig& config, int64_t step, uint16_t* out, int threads) {
  const size_t chunk = ((n + threads - 1) / threads + 15) / 16 * 16;
  std::vector<std::thread> workers;
  for (size_t begin = 0; begin < n; begin += chunk) {
    workers.emplace_back([=] {
      const size_t end = std::min(n, begin + chunk);
      weft::engine::AdamWUpdate(p + begin, g + begin, m + begin, v + begin, mask + begin,
                                end - begin, config, step, 1.0f);
      for (size_t i = begin; i < end; ++i) out[i] = OldBf16Bits(p[i]);
    });
  }
  for (std::thread& t : workers) t.join();
}

}  // namespace

int main(int argc, char** argv) {
  size_t params = size_t{256} << 20;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int reps = 5;
  CLI::App app{"Times the host AdamW step of optimizer offload."};
  app.add_option("--params", params, "parameters stepped (default 256Mi: 4.75 GiB of buffers)");
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  app.add_option("--reps", reps)->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::vector<float> p(params, 0.01f), g(params, 0.001f), m(params, 0.0f), v(params, 0.0f);
  std::vector<uint8_t> mask(params);
  for (size_t i = 0; i < params; ++i) mask[i] = (i / 4096) % 8 != 0;  // runs, as units have
  std::vector<uint16_t> out(params);
  weft::engine::AdamWConfig config;
  config.lr = 1e-4f;

  // Alternating, best of `reps` each, so both see the same machine state.
  double fused = 1e30, two_pass = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    weft::engine::AdamWUpdateParallel(p.data(), g.data(), m.data(), v.data(), mask.data(),
                                      params, config, r + 1, 1.0f, out.data(), threads);
    auto t1 = Clock::now();
    TwoPass(p.data(), g.data(), m.data(), v.data(), mask.data(), params, config, r + 1,
            out.data(), threads);
    auto t2 = Clock::now();
    fused = std::min(fused, std::chrono::duration<double>(t1 - t0).count());
    two_pass = std::min(two_pass, std::chrono::duration<double>(t2 - t1).count());
  }
  const double n = static_cast<double>(params);
  std::printf(
      "BENCH host_adamw params=%zu threads=%d reps=%d fused_gparams_per_s=%.3f "
      "two_pass_gparams_per_s=%.3f speedup=%.3f fused_gb_per_s=%.1f\n",
      params, threads, reps, n / fused / 1e9, n / two_pass / 1e9, two_pass / fused,
      31.0 * n / fused / 1e9);
  return 0;
}
