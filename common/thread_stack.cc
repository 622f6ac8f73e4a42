// Gives every thread a library creates with a fixed stack size at least kMinThreadStack.
//
// Why: glibc carves a thread's static TLS (the thread-local storage of every library loaded at
// startup) out of the stack a thread is created with. civetweb (under prometheus-cpp's metrics
// endpoint) creates its threads with a small fixed stack, about 100 KiB; OpenBLAS alone has
// 60 KiB of static TLS, and the worker's CUDA runtime and NCCL add 16 KiB more, which left
// civetweb's master thread so little stack that it overflowed into its own thread descriptor
// and the worker crashed (SIGSEGV in poll) on the first Prometheus scrape.
//
// How: the executables define pthread_attr_setstacksize themselves (this object is linked into
// each daemon, and the symbol is exported so shared libraries bind to it) and forward to
// glibc's with the size raised to the floor. Larger requests pass through unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {

constexpr size_t kMinThreadStack = size_t{1} << 20;  // 1 MiB

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize Glibc() {
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) {
  return Glibc()(attr, stacksize < kMinThreadStack ? kMinThreadStack : stacksize);
}
