// The in-process communicator's hold on its collectives (in_process_cuda_communicator.cc): one
// thread that spins on the GPU's nanosecond timer, so the stream behind it waits on the GPU
// alone (a host function would also involve the driver's callback thread).
#include <cuda_runtime.h>

#include <cstdint>

namespace weft::comm::testing {
namespace {

__global__ void DelayKernel(uint64_t ns) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

}  // namespace

cudaError_t LaunchDelay(int64_t us, cudaStream_t stream) {
  DelayKernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(us) * 1000);
  return cudaGetLastError();
}

}  // namespace weft::comm::testing
