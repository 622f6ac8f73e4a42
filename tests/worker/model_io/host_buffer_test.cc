// HostFloats take their memory from the installed allocator and give every buffer back to the
// allocator that made it, whatever is installed by then.
#include "worker/model_io/host_buffer.h"

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "gtest/gtest.h"

namespace weft::model_io {
namespace {

int g_allocated = 0;
int g_released = 0;
bool g_refuse = false;

void* CountingAllocate(size_t bytes) {
  if (g_refuse) return nullptr;
  ++g_allocated;
  return std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);  // page-aligned, as pinned

}

void CountingRelease(void* p) {
  ++g_released;
  std::free(p);
}

class HostBufferTest : public ::testing::Test {
 protected:
  void SetUp() override { g_allocated = g_released = 0, g_refuse = false; }
  void TearDown() override { SetHostBufferAllocator({}); }
};

TEST_F(HostBufferTest, InstalledAllocatorMakesAndFreesTheBuffers) {
  SetHostBufferAllocator({CountingAllocate, CountingRelease});
  {
    HostFloats a(1000, 1.5f);
    EXPECT_EQ(a[999], 1.5f);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 64, 0u);
    EXPECT_EQ(g_allocated, 1);
    // A buffer outliving the allocator's replacement still goes back to it.
    SetHostBufferAllocator({});
    HostFloats heap(10);
    EXPECT_EQ(g_allocated, 1);
  }
  EXPECT_EQ(g_released, 1);
}

TEST_F(HostBufferTest, RefusalFallsBackToTheHeap) {
  SetHostBufferAllocator({CountingAllocate, CountingRelease});
  g_refuse = true;
  {
    HostFloats a(4096, 2.0f);
    EXPECT_EQ(a.front() + a.back(), 4.0f);
  }
  EXPECT_EQ(g_allocated, 0);
  EXPECT_EQ(g_released, 0);  // freed by the heap, not by the refusing allocator
}

}  // namespace
}  // namespace weft::model_io
