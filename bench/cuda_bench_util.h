// What the CUDA benches (cuda_ops_bench.cc, fp8_bench.cc) share: exiting checks (a bench is a
// short-lived process: a failure names the program and what failed, and exits 1), device
// buffers that live until exit, random bf16 inputs, and a CUDA-event timer of back-to-back runs.
#ifndef WEFT_BENCH_CUDA_BENCH_UTIL_H_
#define WEFT_BENCH_CUDA_BENCH_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"

namespace weft::bench {

using bf16 = __nv_bfloat16;

inline void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
                 std::string(s.message()).c_str());
    std::exit(1);
  }
}

inline void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what,
                 cudaGetErrorString(e));
    std::exit(1);
  }
}

// Device buffers, freed at exit (the process is short-lived).
template <typename T>
T* Alloc(size_t n) {
  void* p = nullptr;
  CheckCuda(cudaMalloc(&p, n * sizeof(T) + 256), "cudaMalloc");
  return static_cast<T*>(p);
}

// Random bf16 in [-scale, scale), generated on the host once and copied.
inline bf16* RandomBf16(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<bf16> host(n);
  for (auto& x : host) x = __float2bfloat16(u(rng));
  bf16* d = Alloc<bf16>(n);
  CheckCuda(cudaMemcpy(d, host.data(), n * sizeof(bf16), cudaMemcpyHostToDevice), "copy");
  return d;
}

inline float* ZeroFloats(size_t n) {
  float* d = Alloc<float>(n);
  CheckCuda(cudaMemset(d, 0, n * sizeof(float)), "memset");
  return d;
}

struct Timer {
  cudaStream_t stream;
  int iters;
  cudaEvent_t begin, end;
  double block_forward_ms = 0, block_backward_ms = 0;

  // Median-free mean over `iters` back-to-back runs (launch overhead amortised the way the
  // engine's back-to-back enqueueing does).
  double Time(const std::function<absl::Status()>& op, const char* name) {
    Check(op(), name);
    CheckCuda(cudaStreamSynchronize(stream), name);
    CheckCuda(cudaEventRecord(begin, stream), "event");
    for (int i = 0; i < iters; ++i) Check(op(), name);
    CheckCuda(cudaEventRecord(end, stream), "event");
    CheckCuda(cudaEventSynchronize(end), name);
    float ms = 0;
    CheckCuda(cudaEventElapsedTime(&ms, begin, end), "elapsed");
    return ms / iters;
  }

  enum Phase { kForward, kBackward, kNone };
  void Flops(const char* name, Phase phase, double flops, const std::function<absl::Status()>& op) {
    const double ms = Time(op, name);
    Add(phase, ms);
    std::printf("BENCH cuda_op op=%s ms=%.3f tflops=%.1f\n", name, ms, flops / ms / 1e9);
  }
  void Bytes(const char* name, Phase phase, double bytes, const std::function<absl::Status()>& op) {
    const double ms = Time(op, name);
    Add(phase, ms);
    std::printf("BENCH cuda_op op=%s ms=%.3f gbps=%.0f\n", name, ms, bytes / ms / 1e6);
  }
  void Add(Phase phase, double ms) {
    if (phase == kForward) block_forward_ms += ms;
    if (phase == kBackward) block_backward_ms += ms;
  }
};

// A Timer on a stream of its own, `iters` timed runs an op.
inline Timer MakeTimer(int iters) {
  Timer timer{nullptr, iters, nullptr, nullptr};
  CheckCuda(cudaStreamCreate(&timer.stream), "stream");
  CheckCuda(cudaEventCreate(&timer.begin), "event");
  CheckCuda(cudaEventCreate(&timer.end), "event");
  return timer;
}

// The Llama block's shape and the timed runs, as the benches take them on the command line
// (defaults: Llama-8B's block at micro-batch 2, sequence 4096).
struct BlockOptions {
  int b = 2, t = 4096, c = 4096, nh = 32, nkv = 8, inter = 14336, iters = 20;
};
inline void AddBlockOptions(CLI::App& app, BlockOptions* o) {
  app.add_option("--batch", o->b);
  app.add_option("--seq", o->t);
  app.add_option("--width", o->c);
  app.add_option("--heads", o->nh);
  app.add_option("--kv-heads", o->nkv);
  app.add_option("--intermediate", o->inter);
  app.add_option("--iters", o->iters, "timed runs of each op");
}

}  // namespace weft::bench

#endif  // WEFT_BENCH_CUDA_BENCH_UTIL_H_
