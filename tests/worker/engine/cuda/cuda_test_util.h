// Helpers shared by the CUDA op tests: device buffers that copy host vectors in and out,
// bf16 bit conversions done on the host exactly as the kernels round (nearest even), and
// random / filled host vectors, and a fixture with a stream that skips without a GPU.
#ifndef WEFT_TESTS_WORKER_ENGINE_CUDA_CUDA_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_ENGINE_CUDA_CUDA_TEST_UTIL_H_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/engine/cuda/cuda_check.h"

namespace weft::engine::cuda::test_util {

// bf16 bits of about 10.1: the prefill of outputs that must be written (=), not accumulated.
inline constexpr uint16_t kGarbageBits = 0x4321;

// A device copy of a host vector; freed on scope exit.
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n_, 1) * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { CUDA_CHECK(cudaFree(ptr_)); }

  T* get() { return ptr_; }
  // The buffer of bf16 bits as the kernels' bf16 (a DeviceBuffer<uint16_t>).
  __nv_bfloat16* bf16() { return reinterpret_cast<__nv_bfloat16*>(ptr_); }
  std::vector<T> ToHost() const {
    std::vector<T> host(n_);
    CUDA_CHECK(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  // Read back on `stream`, waiting for nothing but that stream: what work ordered behind it
  // sees (the legacy default stream, by contrast, waits for every blocking stream).
  std::vector<T> ToHostOn(cudaStream_t stream) const {
    std::vector<T> host(n_);
    CUDA_CHECK(
        cudaMemcpyAsync(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return host;
  }
  // Overwrites the buffer with `host` (its size) in `stream`'s order: after what was enqueued
  // there, before what follows.
  void CopyFromHostOn(const std::vector<T>& host, cudaStream_t stream) {
    if (host.size() != n_) {
      std::fprintf(stderr, "CopyFromHostOn: %zu elements into a buffer of %zu\n", host.size(), n_);
      std::abort();
    }
    CUDA_CHECK(cudaMemcpyAsync(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }

 private:
  T* ptr_ = nullptr;
  size_t n_;
};

// Round to nearest even, the rounding __float2bfloat16 and the kernels use (finite inputs).
inline uint16_t ToBf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float FromBf16Bits(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

inline std::vector<float> Random(std::mt19937_64& rng, size_t n, float mean = 0.0f,
                                 float stddev = 1.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// Random bf16 bits of values ~ N(mean, sigma): the values a host reference uses are exactly
// these.
inline std::vector<uint16_t> RandomBf16Bits(size_t n, float sigma, std::mt19937& rng,
                                            float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, sigma);
  std::vector<uint16_t> out(n);
  for (auto& x : out) x = ToBf16Bits(dist(rng));
  return out;
}

// n copies of `value` (a function, not a type, so `DeviceBuffer<float> d(Filled(n))` is not
// parsed as a function declaration).
inline std::vector<float> Filled(size_t n, float value = 0.0f) {
  return std::vector<float>(n, value);
}

// A fixture with a CUDA stream; its tests skip where there is no CUDA device.
class CudaStreamTest : public ::testing::Test {
 protected:
  // `unchecked`: what goes unchecked when the tests skip, for the skip message.
  explicit CudaStreamTest(const char* unchecked) : unchecked_(unchecked) {}
  void SetUp() override {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA device (" << cudaGetErrorName(err) << ", count " << count
                   << "): " << unchecked_ << " not checked";
    }
    CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) CUDA_CHECK(cudaStreamDestroy(stream_));
  }
  void Sync() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  cudaStream_t stream_ = nullptr;

 private:
  const char* unchecked_;
};

}  // namespace weft::engine::cuda::test_util

#endif  // WEFT_TESTS_WORKER_ENGINE_CUDA_CUDA_TEST_UTIL_H_
