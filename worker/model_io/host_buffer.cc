#include "worker/model_io/host_buffer.h"

#include <atomic>
#include <cstdlib>

namespace weft::model_io {
namespace {

// In front of every buffer: the function that frees it. 64 bytes keep the data cache-line
// aligned (and page-aligned allocations 64-aligned).
constexpr size_t kHeader = 64;
using ReleaseFn = void (*)(void*);

std::atomic<void* (*)(size_t)> g_allocate{nullptr};
std::atomic<ReleaseFn> g_release{nullptr};

void HeapRelease(void* p) { std::free(p); }

}  // namespace

void SetHostBufferAllocator(HostBufferAllocator allocator) {
  g_release.store(allocator.release);
  g_allocate.store(allocator.allocate);
}

void* AllocateHostBuffer(size_t bytes) {
  void* (*allocate)(size_t) = g_allocate.load();
  ReleaseFn release = g_release.load();
  void* base = allocate != nullptr ? allocate(bytes + kHeader) : nullptr;
  if (base == nullptr) {
    base = std::aligned_alloc(kHeader, (bytes + 2 * kHeader - 1) / kHeader * kHeader);
    release = HeapRelease;
    if (base == nullptr) throw std::bad_alloc();
  }
  *static_cast<ReleaseFn*>(base) = release;
  return static_cast<char*>(base) + kHeader;
}

void ReleaseHostBuffer(void* p) noexcept {
  if (p == nullptr) return;
  void* base = static_cast<char*>(p) - kHeader;
  (*static_cast<ReleaseFn*>(base))(base);
}

}  // namespace weft::model_io
