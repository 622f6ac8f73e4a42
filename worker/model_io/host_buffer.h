// Host memory for copies of device state (checkpoint snapshots): HostFloats is a vector whose
// memory comes from a process-wide allocator a device engine may replace. The CUDA engine
// installs pinned (page-locked) memory, so its device-to-host copies run at the bus's speed
// instead of through the driver's pageable staging (measured on an H200 host: 18.7 GB in
// 2.0 s pageable); without a device the buffers are plain heap memory.
//
// Every allocation records the free function of the allocator that made it, so buffers made
// before an allocator is installed (or by a fallback) are released correctly.
#ifndef WEFT_WORKER_MODEL_IO_HOST_BUFFER_H_
#define WEFT_WORKER_MODEL_IO_HOST_BUFFER_H_

#include <cstddef>
#include <new>
#include <vector>

namespace weft::model_io {

struct HostBufferAllocator {
  // Returns `bytes` of memory, or null when it cannot (the caller then uses the heap).
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* p) = nullptr;
};

// Replaces the allocator of HostFloats made from now on (thread-safe). A null allocate
// restores the heap.
void SetHostBufferAllocator(HostBufferAllocator allocator);

// Raw allocation through the current allocator (heap fallback); throws std::bad_alloc when
// even the heap refuses. Freed with ReleaseHostBuffer.
void* AllocateHostBuffer(size_t bytes);
void ReleaseHostBuffer(void* p) noexcept;

template <typename T>
struct HostBufferAllocation {
  using value_type = T;
  HostBufferAllocation() = default;
  template <typename U>
  HostBufferAllocation(const HostBufferAllocation<U>&) {}  // NOLINT(runtime/explicit)
  T* allocate(size_t n) { return static_cast<T*>(AllocateHostBuffer(n * sizeof(T))); }
  void deallocate(T* p, size_t) noexcept { ReleaseHostBuffer(p); }
  template <typename U>
  bool operator==(const HostBufferAllocation<U>&) const { return true; }
};

using HostFloats = std::vector<float, HostBufferAllocation<float>>;

}  // namespace weft::model_io

#endif  // WEFT_WORKER_MODEL_IO_HOST_BUFFER_H_
