// The GPU encodings of the compressed all-reduce (worker/engine/cuda/wire_codec.h) against the
// CPU side of the same contract (worker/comm/wire_codec.h), bit for bit on finite values:
// encoding every chunk of a vector that ends inside a chunk, summing ranks' chunks (over one
// of them, as the engine does), decoding. A NaN or an infinity makes its block NaN (the bits
// of a NaN differ between the CPU and the GPU, so those are checked as NaN).
#include "worker/engine/cuda/wire_codec.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/engine/cuda/cuda_test_util.h"
#include "worker/comm/wire_codec.h"

namespace weft::engine::cuda {
namespace {

using comm::WireFormat;
using test_util::DeviceBuffer;

class WireCodecCudaTest : public test_util::CudaStreamTest {
 protected:
  WireCodecCudaTest() : CudaStreamTest("the GPU wire codec") {}
};

std::vector<float> Values(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

TEST_F(WireCodecCudaTest, EncodeSumDecodeMatchTheCpuBitForBit) {
  for (WireFormat format : {WireFormat::kBf16, WireFormat::kInt8}) {
    SCOPED_TRACE(std::string(comm::WireFormatName(format)));
    const int ranks = 3;
    const size_t n = 5000;  // chunks of 1792: the last one ends inside a block
    const size_t c = comm::WireChunkValues(n, ranks);
    const size_t cb = comm::WireChunkBytes(format, c);
    std::vector<float> x = Values(n, 7);
    for (size_t i = 1024; i < 1280; ++i) x[i] = 0.0f;  // block 4: zeros
    x[700] = 1.0f;  // block 2: a coarse scale

    // Encode: every chunk, zeros past n.
    std::vector<uint8_t> want(ranks * cb);
    for (int r = 0; r < ranks; ++r) {
      const size_t begin = r * c;
      comm::EncodeWireChunk(format, x.data() + begin, begin < n ? std::min(c, n - begin) : 0, c,
                            want.data() + r * cb);
    }
    DeviceBuffer<float> values(x);
    DeviceBuffer<uint8_t> encoded(std::vector<uint8_t>(ranks * cb, 0xAB));
    ASSERT_TRUE(EncodeWireChunks(format, values.get(), n, ranks, c, cb, encoded.get(), stream_)
                    .ok());
    std::vector<uint8_t> got = encoded.ToHostOn(stream_);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i;

    // Sum the three chunks (as three ranks' versions of one chunk) over the second.
    std::vector<uint8_t> sum(cb);
    comm::SumWireChunks(format, want.data(), ranks, c, sum.data());
    ASSERT_TRUE(SumWireChunks(format, encoded.get(), ranks, c, cb, encoded.get() + cb, stream_)
                    .ok());
    got = encoded.ToHostOn(stream_);
    EXPECT_EQ(0, std::memcmp(got.data() + cb, sum.data(), cb));

    // Decode every chunk into n values; the one past n stays.
    std::vector<float> decoded(n + 1, 3.0f), cpu(n + 1, 3.0f);
    for (int r = 0; r < ranks; ++r) {
      const size_t begin = r * c;
      comm::DecodeWireChunk(format, got.data() + r * cb, c,
                            begin < n ? std::min(c, n - begin) : 0, cpu.data() + begin);
    }
    DeviceBuffer<float> out(decoded);
    ASSERT_TRUE(
        DecodeWireChunks(format, encoded.get(), ranks, c, cb, out.get(), n, stream_).ok());
    decoded = out.ToHostOn(stream_);
    EXPECT_EQ(0, std::memcmp(decoded.data(), cpu.data(), (n + 1) * sizeof(float)));
    EXPECT_EQ(decoded[n], 3.0f);
  }
}

TEST_F(WireCodecCudaTest, NonFiniteBlocksDecodeToNaN) {
  for (WireFormat format : {WireFormat::kBf16, WireFormat::kInt8}) {
    SCOPED_TRACE(std::string(comm::WireFormatName(format)));
    const size_t n = 3 * comm::kWireBlock;
    const size_t c = comm::WireChunkValues(n, 1);
    const size_t cb = comm::WireChunkBytes(format, c);
    std::vector<float> x(n, 0.5f);
    x[10] = std::numeric_limits<float>::quiet_NaN();
    x[comm::kWireBlock + 20] = -std::numeric_limits<float>::infinity();
    DeviceBuffer<float> values(x);
    // Two ranks' copies of the chunk, summed over the first, then decoded.
    DeviceBuffer<uint8_t> encoded{std::vector<uint8_t>(2 * cb)};
    ASSERT_TRUE(EncodeWireChunks(format, values.get(), n, 1, c, cb, encoded.get(), stream_).ok());
    ASSERT_EQ(cudaSuccess, cudaMemcpyAsync(encoded.get() + cb, encoded.get(), cb,
                                           cudaMemcpyDeviceToDevice, stream_));
    ASSERT_TRUE(SumWireChunks(format, encoded.get(), 2, c, cb, encoded.get(), stream_).ok());
    DeviceBuffer<float> out{std::vector<float>(n)};
    ASSERT_TRUE(DecodeWireChunks(format, encoded.get(), 1, c, cb, out.get(), n, stream_).ok());
    const std::vector<float> y = out.ToHostOn(stream_);
    EXPECT_TRUE(std::isnan(y[10]));
    if (format == WireFormat::kInt8) {  // the whole block goes
      for (size_t i = 0; i < 2 * comm::kWireBlock; ++i) ASSERT_TRUE(std::isnan(y[i])) << i;
    } else {
      EXPECT_FALSE(std::isfinite(y[comm::kWireBlock + 20]));
      EXPECT_EQ(y[0], 1.0f);
    }
    EXPECT_NEAR(y[2 * comm::kWireBlock], 1.0f, 1e-6f) << "a finite block sums as ever";
  }
}

TEST_F(WireCodecCudaTest, Fp32IsRefused) {
  DeviceBuffer<float> values{std::vector<float>(256)};
  DeviceBuffer<uint8_t> encoded{std::vector<uint8_t>(1024)};
  EXPECT_EQ(EncodeWireChunks(WireFormat::kFp32, values.get(), 256, 1, 256, 1024, encoded.get(),
                             stream_)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::engine::cuda
