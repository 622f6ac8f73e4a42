// Range collectives (worker/comm/range_collectives.h): the parts' arithmetic, and the gather
// and reduce over real Gloo ranks (threads of this process, TCP on loopback) for ranges that
// start and end inside blocks, on block edges, inside one block, and past the last block.
#include "worker/comm/range_collectives.h"

#include <cstddef>
#include <memory>
#include <vector>

#include "coordinator/memory_store.h"
#include "gtest/gtest.h"
#include "tests/worker/comm/comm_test_util.h"

namespace weft::comm {
namespace {

using testing::CreateGroup;
using testing::OnRanks;

TEST(RangePartsTest, IntersectsTheRangeWithEachBlock) {
  // Blocks of 10 over 4 ranks: [0,10) [10,20) [20,30) [30,40).
  EXPECT_EQ(RangeParts(5, 27, 10, 4),
            (std::vector<RangePart>{{0, 0, 5}, {1, 5, 10}, {2, 15, 7}}));
  EXPECT_EQ(RangeParts(10, 20, 10, 4), (std::vector<RangePart>{{1, 0, 10}}));
  EXPECT_EQ(RangeParts(12, 14, 10, 4), (std::vector<RangePart>{{1, 0, 2}}));
  // Past world * block nobody owns anything (padding is never a range's business).
  EXPECT_EQ(RangeParts(35, 50, 10, 4), (std::vector<RangePart>{{3, 0, 5}}));
  EXPECT_TRUE(RangeParts(40, 50, 10, 4).empty());
  EXPECT_TRUE(RangeParts(7, 7, 10, 4).empty());
  EXPECT_EQ(OwnPart(5, 27, 10, 4, 2), (RangePart{2, 15, 7}));
  EXPECT_EQ(OwnPart(5, 27, 10, 4, 3).count, 0u);
}

// Small integers: exact sums in float32.
float Value(int rank, size_t i) { return static_cast<float>((rank * 37 + i * 5) % 257); }

TEST(RangeCollectivesTest, GatherAndReduceEveryShapeOfRange) {
  for (int world : {1, 2, 3, 4}) {
    const size_t block = 13;
    const size_t size = block * world;
    MemoryStore store;
    auto comms = CreateGroup(&store, world);
    ASSERT_EQ(comms.size(), static_cast<size_t>(world));
    struct Range {
      size_t begin, end;
    };
    for (const Range range : {Range{0, size}, Range{3, size - 2}, Range{block, 2 * block},
                              Range{block + 2, block + 5}, Range{size - 1, size}}) {
      if (range.begin >= range.end || range.end > size) continue;  // shapes world 1 lacks
      SCOPED_TRACE(::testing::Message() << "world " << world << " range [" << range.begin
                                        << ", " << range.end << ")");
      const size_t n = range.end - range.begin;
      OnRanks(world, [&](int r) {
        Communicator& comm = *comms[r];
        const RangePart mine = OwnPart(range.begin, range.end, block, world, r);
        // Gather: each rank writes its own part (element e of the array holds e), the rest
        // of its buffer garbage.
        std::vector<float> gathered(n, -1.f);
        for (size_t i = 0; i < mine.count; ++i) {
          gathered[mine.offset + i] = static_cast<float>(range.begin + mine.offset + i);
        }
        absl::Status s = AllGatherRange(comm, gathered.data(), range.begin, range.end, block,
                                        DataType::kFloat32)
                             ->Wait();
        ASSERT_TRUE(s.ok()) << s;
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(gathered[i], static_cast<float>(range.begin + i)) << "rank " << r << " " << i;
        }
        // Reduce: rank q sends Value(q, element); r keeps the sums of its part.
        std::vector<float> send(n);
        for (size_t i = 0; i < n; ++i) send[i] = Value(r, range.begin + i);
        const std::vector<float> sent = send;
        std::vector<float> recv(mine.count + 1, -5.f);
        s = ReduceScatterRange(comm, send.data(), recv.data(), range.begin, range.end, block,
                               DataType::kFloat32)
                ->Wait();
        ASSERT_TRUE(s.ok()) << s;
        EXPECT_EQ(send, sent) << "the reduce modified its input";
        for (size_t i = 0; i < mine.count; ++i) {
          float expected = 0;
          for (int q = 0; q < world; ++q) expected += Value(q, range.begin + mine.offset + i);
          ASSERT_EQ(recv[i], expected) << "rank " << r << " " << i;
        }
        EXPECT_EQ(recv[mine.count], -5.f) << "written past its part";
        // In place: the sum lands in this rank's part of `send`, the rest stays.
        s = ReduceScatterRange(comm, send.data(), send.data() + mine.offset, range.begin,
                               range.end, block, DataType::kFloat32)
                ->Wait();
        ASSERT_TRUE(s.ok()) << s;
        for (size_t i = 0; i < n; ++i) {
          const bool own = i >= mine.offset && i < mine.offset + mine.count;
          const float expected = own ? recv[i - mine.offset] : sent[i];
          ASSERT_EQ(send[i], expected) << "rank " << r << " " << i;
        }
      });
    }
  }
}

}  // namespace
}  // namespace weft::comm
