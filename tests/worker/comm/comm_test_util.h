// Helpers for the worker/comm tests: ranks as threads of one process, sharing a MemoryStore
// for the rendezvous, each with a real Gloo communicator over TCP loopback.
#ifndef WEFT_TESTS_WORKER_COMM_COMM_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_COMM_COMM_TEST_UTIL_H_

#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/store.h"
#include "gtest/gtest.h"
#include "worker/comm/communicator.h"

namespace weft::comm::testing {

// Runs fn(rank) on `world` threads and joins them.
inline void OnRanks(int world, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int r = 0; r < world; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// Creates the communicators of ranks [0, world) concurrently, rank r's by create(r) (creation
// blocks until all ranks have connected). Fails the test (and returns an empty vector) if any
// creation fails.
template <typename Comm, typename Create>
std::vector<std::unique_ptr<Comm>> CreateRanks(int world, Create create) {
  std::vector<absl::StatusOr<std::unique_ptr<Comm>>> results(world);
  OnRanks(world, [&](int r) { results[r] = create(r); });
  std::vector<std::unique_ptr<Comm>> comms;
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].status();
    if (!results[r].ok()) return {};
    comms.push_back(std::move(results[r]).value());
  }
  return comms;
}

// A Gloo group of `world` ranks (CreateRanks).
inline std::vector<std::unique_ptr<Communicator>> CreateGroup(Store* store, int world,
                                                              const GlooOptions& options = {}) {
  return CreateRanks<Communicator>(
      world, [&](int r) { return CreateGlooCommunicator(store, r, world, options); });
}

inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace weft::comm::testing

#endif  // WEFT_TESTS_WORKER_COMM_COMM_TEST_UTIL_H_
