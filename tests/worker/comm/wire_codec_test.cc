// The compressed all-reduce (worker/comm/wire_codec.h): the encodings' sizes and error bounds,
// non-finite values surviving quantization, summing over one of the inputs, AllToAll and the
// sent-bytes count of the Gloo backend, and WireAllReduce over real Gloo ranks (threads of
// this process, TCP on loopback): every rank ends with the same values, within the stated
// bound of the exact sum, and nothing past n is touched.
#include "worker/comm/wire_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "coordinator/memory_store.h"
#include "gtest/gtest.h"
#include "tests/worker/comm/comm_test_util.h"
#include "worker/comm/work.h"

namespace weft::comm {
namespace {

using testing::CreateGroup;
using testing::OnRanks;

std::vector<float> RandomValues(size_t n, uint32_t seed, float scale) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> out(n);
  for (float& x : out) x = dist(gen);
  return out;
}

std::vector<float> RoundTrip(WireFormat format, const std::vector<float>& values) {
  const size_t c = WireChunkValues(values.size(), 1);
  std::vector<uint8_t> encoded(WireChunkBytes(format, c));
  EncodeWireChunk(format, values.data(), values.size(), c, encoded.data());
  std::vector<float> out(values.size());
  DecodeWireChunk(format, encoded.data(), c, values.size(), out.data());
  return out;
}

TEST(WireCodecTest, ChunksAreWholeBlocksAndSizesFollowTheFormat) {
  EXPECT_EQ(WireChunkValues(1000, 3), 512u);  // ceil(1000 / 3) = 334 -> two blocks
  EXPECT_EQ(WireChunkValues(1, 4), kWireBlock);
  EXPECT_EQ(WireChunkValues(0, 2), kWireBlock);
  EXPECT_EQ(WireChunkBytes(WireFormat::kFp32, 512), 2048u);
  EXPECT_EQ(WireChunkBytes(WireFormat::kBf16, 512), 1024u);
  EXPECT_EQ(WireChunkBytes(WireFormat::kInt8, 512), 512u + 2 * 4);
  EXPECT_EQ(WireBufferBytes(WireFormat::kInt8, 1000, 3), 3u * 520);
}

TEST(WireCodecTest, Bf16RoundsToNearestEven) {
  const float tie_down = 1.0f + std::ldexp(1.0f, -8);              // halfway, even is 1
  const float tie_up = 1.0f + 3 * std::ldexp(1.0f, -8);            // halfway, even is up
  const std::vector<float> out = RoundTrip(WireFormat::kBf16, {1.0f, -2.5f, tie_down, tie_up});
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.5f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[3], 1.0f + std::ldexp(1.0f, -6));
  const std::vector<float> x = RandomValues(4096, 1, 3.0f);
  const std::vector<float> y = RoundTrip(WireFormat::kBf16, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_LE(std::fabs(y[i] - x[i]), std::fabs(x[i]) * std::ldexp(1.0f, -8)) << i;
  }
}

TEST(WireCodecTest, Int8ErrorIsAtMostHalfTheBlocksScale) {
  std::vector<float> x = RandomValues(3 * kWireBlock + 17, 2, 0.01f);
  x[5] = 0.5f;  // block 0 has a large value: a coarse scale there, fine ones elsewhere
  const std::vector<float> y = RoundTrip(WireFormat::kInt8, x);
  for (size_t b = 0; b * kWireBlock < x.size(); ++b) {
    float amax = 0;
    const size_t end = std::min(x.size(), (b + 1) * kWireBlock);
    for (size_t i = b * kWireBlock; i < end; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float scale = amax / 127.0f;
    for (size_t i = b * kWireBlock; i < end; ++i) {
      ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * scale * 1.0001f) << "block " << b << " " << i;
    }
  }
  // The largest value of a block is exact up to its scale's rounding.
  EXPECT_NEAR(y[5], 0.5f, 1e-7f);
  // Integers up to 127 in a block whose max is 127 come back exactly.
  std::vector<float> ints(kWireBlock);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<float>(int(i % 255) - 127);
  EXPECT_EQ(RoundTrip(WireFormat::kInt8, ints), ints);
  EXPECT_EQ(RoundTrip(WireFormat::kInt8, std::vector<float>(300, 0.0f)),
            std::vector<float>(300, 0.0f));
}

TEST(WireCodecTest, NonFiniteValuesStayNonFinite) {
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(),
                          std::numeric_limits<float>::infinity()}) {
    std::vector<float> x(2 * kWireBlock, 0.25f);
    x[kWireBlock + 3] = bad;
    const std::vector<float> q = RoundTrip(WireFormat::kInt8, x);
    EXPECT_EQ(q[0], 0.25f) << "the other block is untouched";
    for (size_t i = kWireBlock; i < x.size(); ++i) ASSERT_TRUE(std::isnan(q[i])) << i;
    const std::vector<float> h = RoundTrip(WireFormat::kBf16, x);
    EXPECT_FALSE(std::isfinite(h[kWireBlock + 3]));
    EXPECT_EQ(std::isnan(bad), std::isnan(h[kWireBlock + 3]));
  }
}

TEST(WireCodecTest, SummingOverOneOfTheInputsEqualsSummingElsewhere) {
  for (WireFormat format : {WireFormat::kBf16, WireFormat::kInt8}) {
    const int ranks = 3;
    const size_t c = 2 * kWireBlock;
    const size_t cb = WireChunkBytes(format, c);
    std::vector<uint8_t> chunks(ranks * cb);
    for (int r = 0; r < ranks; ++r) {
      const std::vector<float> x = RandomValues(c, 10 + r, 1.0f);
      EncodeWireChunk(format, x.data(), c, c, chunks.data() + r * cb);
    }
    std::vector<uint8_t> apart(cb);
    SumWireChunks(format, chunks.data(), ranks, c, apart.data());
    SumWireChunks(format, chunks.data(), ranks, c, chunks.data() + cb);  // over rank 1's
    EXPECT_EQ(0, std::memcmp(apart.data(), chunks.data() + cb, cb)) << WireFormatName(format);
  }
}

TEST(WireCodecTest, AllToAllSwapsBlocksAndCountsWhatItSends) {
  for (int world : {1, 2, 3}) {
    MemoryStore store;
    auto comms = CreateGroup(&store, world);
    ASSERT_EQ(comms.size(), static_cast<size_t>(world));
    const size_t count = 5;
    OnRanks(world, [&](int r) {
      Communicator& comm = *comms[r];
      std::vector<uint8_t> send(world * count), recv(world * count, 0);
      for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<uint8_t>(r * 50 + i);
      const int64_t before = comm.sent_bytes();
      absl::Status s = comm.AllToAll(send.data(), recv.data(), count, DataType::kUInt8)->Wait();
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(comm.sent_bytes() - before, static_cast<int64_t>((world - 1) * count));
      for (int q = 0; q < world; ++q) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(recv[q * count + i], static_cast<uint8_t>(q * 50 + r * count + i))
              << "rank " << r << " block " << q;
        }
      }
      // Overlapping buffers and summed bytes are refused without breaking the communicator.
      EXPECT_EQ(comm.AllToAll(send.data(), send.data() + 1, count, DataType::kUInt8)
                    ->Wait()
                    .code(),
                absl::StatusCode::kInvalidArgument);
      EXPECT_EQ(comm.AllReduce(send.data(), count, DataType::kUInt8)->Wait().code(),
                absl::StatusCode::kUnimplemented);
      EXPECT_TRUE(comm.Barrier()->Wait().ok());
    });
  }
}

TEST(WireCodecTest, RingSentBytesCountsWhatARingSends) {
  EXPECT_EQ(RingSentBytes(OpKind::kAllGather, 10, 4, 4), 3 * 40);
  EXPECT_EQ(RingSentBytes(OpKind::kReduceScatter, 10, 2, 3), 2 * 20);
  EXPECT_EQ(RingSentBytes(OpKind::kAllReduce, 100, 4, 4), 2 * 400 * 3 / 4);
  EXPECT_EQ(RingSentBytes(OpKind::kAllToAll, 7, 1, 2), 7);
  EXPECT_EQ(RingSentBytes(OpKind::kAllReduce, 100, 4, 1), 0);
}

TEST(WireCodecTest, AllReduceAgreesOnEveryRankWithinTheBound) {
  for (WireFormat format : {WireFormat::kBf16, WireFormat::kInt8}) {
    for (int world : {1, 2, 3, 4}) {
      SCOPED_TRACE(::testing::Message() << WireFormatName(format) << " world " << world);
      MemoryStore store;
      auto comms = CreateGroup(&store, world);
      ASSERT_EQ(comms.size(), static_cast<size_t>(world));
      const size_t n = 1000;  // not a multiple of the chunks: the last chunk is padded
      std::vector<std::vector<float>> inputs, results(world);
      for (int r = 0; r < world; ++r) inputs.push_back(RandomValues(n, 100 + r, 0.1f));
      std::vector<int64_t> sent(world);
      OnRanks(world, [&](int r) {
        std::vector<float> values = inputs[r];
        values.push_back(42.0f);  // past n: must stay
        std::vector<uint8_t> send, recv;
        const int64_t before = comms[r]->sent_bytes();
        const absl::Status s = WireAllReduce(*comms[r], format, values.data(), n, &send, &recv);
        ASSERT_TRUE(s.ok()) << s;
        sent[r] = comms[r]->sent_bytes() - before;
        EXPECT_EQ(values.back(), 42.0f);
        values.pop_back();
        results[r] = values;
      });
      const int64_t chunk_bytes = WireChunkBytes(format, WireChunkValues(n, world));
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(sent[r], 2 * (world - 1) * chunk_bytes);
        ASSERT_EQ(0, std::memcmp(results[r].data(), results[0].data(), n * sizeof(float)))
            << "rank " << r << " differs from rank 0";
      }
      if (world == 1) {
        EXPECT_EQ(results[0], inputs[0]) << "one rank: nothing to reduce, nothing changes";
        continue;
      }
      // Two roundings: every input's, then the sum's. bf16: 2^-8 of a value's magnitude each;
      // int8: half a scale each, the scale of the value's block (its largest |x| / 127) in
      // every rank's input and in the sum (1% slack: the sum's scale is that of the decoded
      // inputs' sum).
      const size_t c = WireChunkValues(n, world);
      for (size_t i = 0; i < n; ++i) {
        const size_t begin = i / kWireBlock * kWireBlock;
        const size_t end = std::min<size_t>({n, begin + kWireBlock, (i / c + 1) * c});
        double exact = 0, magnitude = 0, bound = 0, sum_max = 0;
        for (int r = 0; r < world; ++r) {
          exact += inputs[r][i];
          magnitude += std::fabs(inputs[r][i]);
          double block_max = 0;
          for (size_t j = begin; j < end; ++j) {
            block_max = std::max(block_max, std::fabs(double{inputs[r][j]}));
          }
          bound += block_max / 254;
        }
        for (size_t j = begin; j < end; ++j) {
          double sum = 0;
          for (int r = 0; r < world; ++r) sum += inputs[r][j];
          sum_max = std::max(sum_max, std::fabs(sum));
        }
        bound = format == WireFormat::kBf16 ? 2 * std::ldexp(1.0, -8) * magnitude
                                            : 1.01 * (bound + sum_max / 254);
        ASSERT_LE(std::fabs(results[0][i] - exact), bound) << "value " << i;
      }
      // Relative to the whole vector, int8 is far better than its per-value worst case.
      double err = 0, norm = 0;
      for (size_t i = 0; i < n; ++i) {
        double exact = 0;
        for (int r = 0; r < world; ++r) exact += inputs[r][i];
        err += (results[0][i] - exact) * (results[0][i] - exact);
        norm += exact * exact;
      }
      EXPECT_LE(std::sqrt(err / norm), format == WireFormat::kBf16 ? 0.005 : 0.03);
    }
  }
}

// The reduce-scatter is the all-reduce's first half: each rank's own chunk ends with the
// all-reduce's bits, the rest of its vector as it was, for (R - 1) / R of the encoded bytes.
TEST(WireCodecTest, ReduceScatterLeavesEachRankItsChunkOfTheAllReduce) {
  for (WireFormat format : {WireFormat::kBf16, WireFormat::kInt8}) {
    for (int world : {2, 3}) {
      SCOPED_TRACE(::testing::Message() << WireFormatName(format) << " world " << world);
      MemoryStore store;
      auto comms = CreateGroup(&store, world);
      ASSERT_EQ(comms.size(), static_cast<size_t>(world));
      const size_t n = 1000;
      std::vector<std::vector<float>> inputs, reduced(world), scattered(world);
      for (int r = 0; r < world; ++r) inputs.push_back(RandomValues(n, 300 + r, 0.1f));
      std::vector<int64_t> sent(world);
      OnRanks(world, [&](int r) {
        std::vector<uint8_t> send, recv;
        reduced[r] = inputs[r];
        ASSERT_TRUE(WireAllReduce(*comms[r], format, reduced[r].data(), n, &send, &recv).ok());
        scattered[r] = inputs[r];
        const int64_t before = comms[r]->sent_bytes();
        ASSERT_TRUE(
            WireReduceScatter(*comms[r], format, scattered[r].data(), n, &send, &recv).ok());
        sent[r] = comms[r]->sent_bytes() - before;
      });
      const size_t c = WireChunkValues(n, world);
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(sent[r], (world - 1) * static_cast<int64_t>(WireChunkBytes(format, c)));
        const size_t begin = static_cast<size_t>(r) * c, end = std::min(n, begin + c);
        for (size_t i = 0; i < n; ++i) {
          const bool mine = i >= begin && i < end;
          ASSERT_EQ(scattered[r][i], mine ? reduced[r][i] : inputs[r][i])
              << "rank " << r << " value " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace weft::comm
