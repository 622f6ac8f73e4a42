// Gloo collectives with ranks as threads of one process: real TCP over loopback, rendezvous
// through a shared MemoryStore.
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/comm/comm_test_util.h"
#include "worker/comm/communicator.h"

namespace weft::comm {
namespace {

using testing::CreateGroup;
using ::testing::HasSubstr;
using testing::OnRanks;

constexpr DataType kF32 = DataType::kFloat32;

// Small integers: every sum is exact in float32, whatever the reduction order.
float Value(int rank, size_t block, size_t i) {
  return static_cast<float>((rank * 131 + block * 17 + i * 7) % 1021);
}

// Checks every collective for one world size and count; returns nothing, fails the test.
void CheckAllCollectives(std::vector<std::unique_ptr<Communicator>>& comms, size_t count) {
  const int world = static_cast<int>(comms.size());
  SCOPED_TRACE(::testing::Message() << "world " << world << " count " << count);
  OnRanks(world, [&](int r) {
    Communicator& comm = *comms[r];
    // AllGather.
    std::vector<float> send(count), gathered(count * world, -1.f);
    for (size_t i = 0; i < count; ++i) send[i] = Value(r, 0, i);
    absl::Status s = comm.AllGather(send.data(), gathered.data(), count, kF32)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    for (int q = 0; q < world && s.ok(); ++q) {
      for (size_t i = 0; i < count; ++i) {
        if (gathered[q * count + i] != Value(q, 0, i)) {
          ADD_FAILURE() << "AllGather rank " << r << " block " << q << " [" << i << "]";
          break;
        }
      }
    }

    // ReduceScatter: rank r gets sum over q of q's block r.
    std::vector<float> rs_send(count * world), rs_recv(count, -1.f);
    for (int b = 0; b < world; ++b) {
      for (size_t i = 0; i < count; ++i) rs_send[b * count + i] = Value(r, b, i);
    }
    const std::vector<float> rs_send_copy = rs_send;
    s = comm.ReduceScatter(rs_send.data(), rs_recv.data(), count, kF32)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(rs_send, rs_send_copy) << "ReduceScatter modified its input";
    for (size_t i = 0; i < count && s.ok(); ++i) {
      float expected = 0;
      for (int q = 0; q < world; ++q) expected += Value(q, r, i);
      if (rs_recv[i] != expected) {
        ADD_FAILURE() << "ReduceScatter rank " << r << " [" << i << "] = " << rs_recv[i]
                      << ", expected " << expected;
        break;
      }
    }

    // ReduceScatter in place: recv is this rank's block of send.
    rs_send = rs_send_copy;
    s = comm.ReduceScatter(rs_send.data(), rs_send.data() + r * count, count, kF32)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < count && s.ok(); ++i) {
      float expected = 0;
      for (int q = 0; q < world; ++q) expected += Value(q, r, i);
      if (rs_send[r * count + i] != expected) {
        ADD_FAILURE() << "in-place ReduceScatter rank " << r << " [" << i << "]";
        break;
      }
    }

    // AllReduce.
    std::vector<float> buf(count);
    for (size_t i = 0; i < count; ++i) buf[i] = Value(r, 5, i);
    s = comm.AllReduce(buf.data(), count, kF32)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < count && s.ok(); ++i) {
      float expected = 0;
      for (int q = 0; q < world; ++q) expected += Value(q, 5, i);
      if (buf[i] != expected) {
        ADD_FAILURE() << "AllReduce rank " << r << " [" << i << "]";
        break;
      }
    }

    // Broadcast from the last rank.
    const int root = world - 1;
    for (size_t i = 0; i < count; ++i) buf[i] = r == root ? Value(root, 9, i) : -7.f;
    s = comm.Broadcast(buf.data(), count, kF32, root)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < count && s.ok(); ++i) {
      if (buf[i] != Value(root, 9, i)) {
        ADD_FAILURE() << "Broadcast rank " << r << " [" << i << "]";
        break;
      }
    }

    // Reduce to the middle rank, from a `send` it leaves alone; the others' recv is null.
    const int reduce_root = world / 2;
    for (size_t i = 0; i < count; ++i) buf[i] = Value(r, 11, i);
    const std::vector<float> reduce_send = buf;
    std::vector<float> reduced(count, -1.f);
    s = comm.Reduce(buf.data(), r == reduce_root ? reduced.data() : nullptr, count, kF32,
                    reduce_root)
            ->Wait();
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_EQ(buf, reduce_send) << "Reduce modified its input on rank " << r;
    for (size_t i = 0; i < count && s.ok() && r == reduce_root; ++i) {
      float expected = 0;
      for (int q = 0; q < world; ++q) expected += Value(q, 11, i);
      if (reduced[i] != expected) {
        ADD_FAILURE() << "Reduce [" << i << "] = " << reduced[i] << ", expected " << expected;
        break;
      }
    }
    // In place on the root.
    for (size_t i = 0; i < count; ++i) buf[i] = Value(r, 12, i);
    s = comm.Reduce(buf.data(), buf.data(), count, kF32, 0)->Wait();
    EXPECT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < count && s.ok(); ++i) {
      float expected = 0;
      for (int q = 0; q < world; ++q) expected += Value(q, 12, i);
      if (buf[i] != (r == 0 ? expected : Value(r, 12, i))) {
        ADD_FAILURE() << "in-place Reduce rank " << r << " [" << i << "] = " << buf[i];
        break;
      }
    }

    s = comm.Barrier()->Wait();
    EXPECT_TRUE(s.ok()) << s;
  });
}

class WorldTest : public ::testing::TestWithParam<int> {};

TEST_P(WorldTest, EveryCollectiveWithOddCounts) {
  const int world = GetParam();
  MemoryStore store;
  auto comms = CreateGroup(&store, world);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  for (size_t count : {size_t{1}, size_t{7}, size_t{1000003}}) {
    CheckAllCollectives(comms, count);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, WorldTest, ::testing::Values(1, 2, 3, 4));

// Non-power-of-two layouts of ReduceScatterHalvingDoubling (binary blocks of 4+2+1, ...) with
// counts smaller than the world.
TEST(LargerWorldTest, SmallCountsUpToEightRanks) {
  for (int world : {5, 6, 7, 8}) {
    MemoryStore store;
    auto comms = CreateGroup(&store, world);
    ASSERT_EQ(comms.size(), static_cast<size_t>(world));
    for (size_t count : {size_t{1}, size_t{2}, size_t{3}, size_t{13}}) {
      CheckAllCollectives(comms, count);
    }
  }
}

// ReduceScatter followed by AllGather gives the AllReduce of the whole buffer.
TEST(RoundTripTest, ReduceScatterThenAllGatherEqualsAllReduce) {
  for (int world : {2, 3, 4}) {
    const size_t count = 4099;
    MemoryStore store;
    auto comms = CreateGroup(&store, world);
    ASSERT_EQ(comms.size(), static_cast<size_t>(world));
    OnRanks(world, [&](int r) {
      std::vector<float> full(count * world);
      for (size_t i = 0; i < full.size(); ++i) full[i] = Value(r, 1, i);
      std::vector<float> reduced = full;
      ASSERT_TRUE(comms[r]->AllReduce(reduced.data(), reduced.size(), kF32)->Wait().ok());
      std::vector<float> shard(count), round_trip(count * world);
      ASSERT_TRUE(comms[r]->ReduceScatter(full.data(), shard.data(), count, kF32)->Wait().ok());
      ASSERT_TRUE(comms[r]->AllGather(shard.data(), round_trip.data(), count, kF32)->Wait().ok());
      EXPECT_EQ(0, std::memcmp(round_trip.data(), reduced.data(), reduced.size() * 4))
          << "world " << world << " rank " << r;
    });
  }
}

// Random (non-integer) inputs: two separate communicator groups give bit-identical results.
TEST(DeterminismTest, SameInputsGiveBitIdenticalOutputs) {
  for (int world : {3, 4}) {
    const size_t count = 100003;
    auto run = [&](std::vector<std::vector<float>>* rs_out,
                   std::vector<std::vector<float>>* ar_out) {
      MemoryStore store;
      auto comms = CreateGroup(&store, world);
      ASSERT_EQ(comms.size(), static_cast<size_t>(world));
      rs_out->assign(world, {});
      ar_out->assign(world, {});
      OnRanks(world, [&](int r) {
        std::mt19937 rng(1234 + r);
        std::normal_distribution<float> normal(0.f, 1.f);
        std::vector<float> input(count * world);
        for (float& x : input) x = normal(rng);
        (*rs_out)[r].resize(count);
        ASSERT_TRUE(
            comms[r]->ReduceScatter(input.data(), (*rs_out)[r].data(), count, kF32)->Wait().ok());
        (*ar_out)[r] = input;
        ASSERT_TRUE(comms[r]->AllReduce((*ar_out)[r].data(), input.size(), kF32)->Wait().ok());
      });
    };
    std::vector<std::vector<float>> rs1, ar1, rs2, ar2;
    run(&rs1, &ar1);
    run(&rs2, &ar2);
    for (int r = 0; r < world; ++r) {
      ASSERT_EQ(rs1[r].size(), rs2[r].size());
      EXPECT_EQ(0, std::memcmp(rs1[r].data(), rs2[r].data(), rs1[r].size() * 4))
          << "ReduceScatter world " << world << " rank " << r;
      EXPECT_EQ(0, std::memcmp(ar1[r].data(), ar2[r].data(), ar1[r].size() * 4))
          << "AllReduce world " << world << " rank " << r;
      // All ranks hold the same AllReduce result.
      EXPECT_EQ(0, std::memcmp(ar1[r].data(), ar1[0].data(), ar1[r].size() * 4));
    }
  }
}

// Ops enqueued without waiting run one at a time, in call order: each one reads what the
// previous one wrote, and completions come in order.
TEST(OrderingTest, QueuedAsyncOpsRunInCallOrder) {
  const int world = 3;
  const size_t count = 50001;
  const int rounds = 8;
  MemoryStore store;
  auto comms = CreateGroup(&store, world);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  OnRanks(world, [&](int r) {
    Communicator& comm = *comms[r];
    std::vector<float> buf(count, 1.f);
    std::vector<std::vector<float>> snapshots(rounds, std::vector<float>(count * world));
    std::vector<std::vector<float>> shards(rounds, std::vector<float>(count));
    std::vector<std::shared_ptr<Work>> works;
    for (int k = 0; k < rounds; ++k) {
      // buf *= world, then a snapshot of every rank's buf, then a reduce-scatter of it.
      works.push_back(comm.AllReduce(buf.data(), count, kF32));
      works.push_back(comm.AllGather(buf.data(), snapshots[k].data(), count, kF32));
      works.push_back(comm.ReduceScatter(snapshots[k].data(), shards[k].data(), count, kF32));
      works.push_back(comm.Barrier());
    }
    // Completion order: when a later op is complete, all earlier ones are.
    for (size_t i = works.size(); i-- > 0;) {
      ASSERT_TRUE(works[i]->Wait().ok()) << "op " << i;
      for (size_t j = 0; j < i; ++j) ASSERT_TRUE(works[j]->IsCompleted()) << j << " < " << i;
    }
    float expected = 1.f;
    for (int k = 0; k < rounds; ++k) {
      expected *= world;
      for (size_t i = 0; i < count * world; i += 997) {
        ASSERT_EQ(snapshots[k][i], expected) << "round " << k << " [" << i << "]";
      }
      for (size_t i = 0; i < count; i += 101) {
        ASSERT_EQ(shards[k][i], expected * world) << "round " << k << " [" << i << "]";
      }
    }
    EXPECT_EQ(buf[0], expected);
  });
}

// ReduceScatter and AllReduce in pieces (tiny chunk_bytes) give the exact results too.
TEST(ChunkingTest, PiecesGiveExactResults) {
  const int world = 3;
  const size_t count = 10007;
  GlooOptions options;
  options.chunk_bytes = 4096;  // 1024 floats: 341 per rank per ReduceScatter piece
  MemoryStore store;
  auto comms = CreateGroup(&store, world, options);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  OnRanks(world, [&](int r) {
    std::vector<float> send(count * world), recv(count);
    for (int b = 0; b < world; ++b) {
      for (size_t i = 0; i < count; ++i) send[b * count + i] = Value(r, b, i);
    }
    std::vector<float> buf = send;
    ASSERT_TRUE(comms[r]->ReduceScatter(send.data(), recv.data(), count, kF32)->Wait().ok());
    ASSERT_TRUE(comms[r]->AllReduce(buf.data(), buf.size(), kF32)->Wait().ok());
    for (size_t i = 0; i < count; ++i) {
      float expected = 0;
      for (int q = 0; q < world; ++q) expected += Value(q, r, i);
      ASSERT_EQ(recv[i], expected) << "ReduceScatter rank " << r << " [" << i << "]";
    }
    for (int b = 0; b < world; ++b) {
      for (size_t i = 0; i < count; ++i) {
        float expected = 0;
        for (int q = 0; q < world; ++q) expected += Value(q, b, i);
        ASSERT_EQ(buf[b * count + i], expected) << "AllReduce rank " << r << " [" << i << "]";
      }
    }
  });
}

// bf16 moves through the ops that only move data; its sums are refused without traffic.
TEST(ValidationTest, BFloat16MovesButDoesNotSum) {
  const int world = 2;
  MemoryStore store;
  auto comms = CreateGroup(&store, world);
  ASSERT_EQ(comms.size(), static_cast<size_t>(world));
  OnRanks(world, [&](int r) {
    std::vector<uint16_t> buf(16, static_cast<uint16_t>(0x3f80 + r)), out(32);
    absl::Status s = comms[r]->AllGather(buf.data(), out.data(), 16, DataType::kBFloat16)->Wait();
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(out[0], 0x3f80);
    EXPECT_EQ(out[31], 0x3f81);
    s = comms[r]->ReduceScatter(out.data(), buf.data(), 16, DataType::kBFloat16)->Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(s.message(), HasSubstr("bfloat16"));
    // Still usable afterwards.
    std::vector<float> f(5, 1.f);
    EXPECT_TRUE(comms[r]->AllReduce(f.data(), 5, kF32)->Wait().ok());
    EXPECT_EQ(f[4], 2.f);
  });
}

// Two communicators on one store with different prefixes.
TEST(RendezvousTest, PrefixesSeparateCommunicatorsOnOneStore) {
  const int world = 2;
  MemoryStore store;
  GlooOptions a, b;
  a.store_prefix = "gloo/a";
  b.store_prefix = "gloo/b";
  std::vector<std::unique_ptr<Communicator>> ga, gb;
  OnRanks(2, [&](int which) {
    if (which == 0)
      ga = CreateGroup(&store, world, a);
    else
      gb = CreateGroup(&store, world, b);
  });
  ASSERT_EQ(ga.size(), 2u);
  ASSERT_EQ(gb.size(), 2u);
  OnRanks(world, [&](int r) {
    float x = 1.f + r, y = 10.f * (1 + r);
    auto wa = ga[r]->AllReduce(&x, 1, kF32);
    auto wb = gb[r]->AllReduce(&y, 1, kF32);
    EXPECT_TRUE(wa->Wait().ok());
    EXPECT_TRUE(wb->Wait().ok());
    EXPECT_EQ(x, 3.f);
    EXPECT_EQ(y, 30.f);
  });
}

}  // namespace
}  // namespace weft::comm
