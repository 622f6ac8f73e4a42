// Unit tests of worker/comm without network traffic: world size 1 (local copies), argument
// validation, data types, completed Work.
#include "worker/comm/communicator.h"

#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/memory_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::comm {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Communicator> WorldOne(Store* store = nullptr) {
  auto comm = CreateGlooCommunicator(store, 0, 1, GlooOptions{});
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(comm).value() : nullptr;
}

TEST(DataTypeTest, NamesAndSizes) {
  EXPECT_EQ(DataTypeName(DataType::kFloat32), "float32");
  EXPECT_EQ(DataTypeName(DataType::kBFloat16), "bfloat16");
  EXPECT_EQ(DataTypeSize(DataType::kFloat32), 4u);
  EXPECT_EQ(DataTypeSize(DataType::kBFloat16), 2u);
}

TEST(WorkTest, CompletedWork) {
  auto work = MakeCompletedWork(absl::InternalError("x"));
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_EQ(work->Wait().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(work->Wait().code(), absl::StatusCode::kInternal);  // repeatable
}

TEST(CreateTest, RejectsBadArguments) {
  MemoryStore store;
  EXPECT_EQ(CreateGlooCommunicator(&store, 2, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(&store, -1, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(&store, 0, 0, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(nullptr, 0, 2, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
  GlooOptions no_timeout;
  no_timeout.timeout_ms = 0;
  EXPECT_EQ(CreateGlooCommunicator(&store, 0, 1, no_timeout).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WorldOneTest, EveryCollectiveIsALocalCopyOrNoOp) {
  MemoryStore store;
  auto comm = WorldOne(&store);
  ASSERT_NE(comm, nullptr);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->world_size(), 1);
  EXPECT_EQ(store.size(), 0u) << "world 1 must not touch the store";

  for (size_t count : {size_t{1}, size_t{7}, size_t{1000003}}) {
    std::vector<float> send(count), recv(count, -1.f);
    std::iota(send.begin(), send.end(), 0.5f);
    ASSERT_TRUE(comm->AllGather(send.data(), recv.data(), count, DataType::kFloat32)->Wait().ok());
    EXPECT_EQ(recv, send);

    std::fill(recv.begin(), recv.end(), -1.f);
    ASSERT_TRUE(
        comm->ReduceScatter(send.data(), recv.data(), count, DataType::kFloat32)->Wait().ok());
    EXPECT_EQ(recv, send);

    std::vector<float> buf = send;
    ASSERT_TRUE(comm->AllReduce(buf.data(), count, DataType::kFloat32)->Wait().ok());
    EXPECT_EQ(buf, send);
    ASSERT_TRUE(comm->Broadcast(buf.data(), count, DataType::kFloat32, 0)->Wait().ok());
    EXPECT_EQ(buf, send);
    std::fill(recv.begin(), recv.end(), -1.f);
    ASSERT_TRUE(
        comm->Reduce(send.data(), recv.data(), count, DataType::kFloat32, 0)->Wait().ok());
    EXPECT_EQ(recv, send);
  }
  EXPECT_TRUE(comm->Barrier()->Wait().ok());

  // In place all-gather (send is rank 0's block of recv).
  std::vector<float> inplace = {1, 2, 3};
  EXPECT_TRUE(comm->AllGather(inplace.data(), inplace.data(), 3, DataType::kFloat32)->Wait().ok());
  EXPECT_EQ(inplace, (std::vector<float>{1, 2, 3}));
}

TEST(WorldOneTest, QueuedOpsRunInOrder) {
  auto comm = WorldOne();
  ASSERT_NE(comm, nullptr);
  // Each copy reads what the previous one wrote: a -> b -> c -> d.
  std::vector<float> a(100000, 3.f), b(100000, 0.f), c(100000, 0.f), d(100000, 0.f);
  auto w1 = comm->AllGather(a.data(), b.data(), a.size(), DataType::kFloat32);
  auto w2 = comm->ReduceScatter(b.data(), c.data(), b.size(), DataType::kFloat32);
  auto w3 = comm->AllGather(c.data(), d.data(), c.size(), DataType::kFloat32);
  EXPECT_TRUE(w3->Wait().ok());
  EXPECT_TRUE(w1->IsCompleted());
  EXPECT_TRUE(w2->IsCompleted());
  EXPECT_EQ(d, a);
}

// Gloo sums float32 only; the ops that only move data move any type's bytes.
TEST(ValidationTest, SumsOfOtherTypesAreUnimplemented) {
  auto comm = WorldOne();
  ASSERT_NE(comm, nullptr);
  for (DataType type : {DataType::kBFloat16, DataType::kUInt8}) {
    std::vector<uint16_t> buf(8), out(8);
    for (auto work : {comm->ReduceScatter(buf.data(), out.data(), 8, type),
                      comm->AllReduce(buf.data(), 8, type),
                      comm->Reduce(buf.data(), out.data(), 8, type, 0)}) {
      absl::Status status = work->Wait();
      EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
      EXPECT_THAT(status.message(), HasSubstr(std::string(DataTypeName(type))));
      EXPECT_THAT(status.message(), HasSubstr("float32 only"));
    }
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint16_t>(i + 1);
    EXPECT_TRUE(comm->AllGather(buf.data(), out.data(), 8, type)->Wait().ok());
    EXPECT_TRUE(comm->Broadcast(buf.data(), 8, type, 0)->Wait().ok());
    EXPECT_TRUE(comm->AllToAll(buf.data(), out.data(), 8, type)->Wait().ok());
    // Bytes of the type: a uint8 op of 8 moves the first 8 bytes.
    const size_t bytes = 8 * DataTypeSize(type);
    EXPECT_EQ(0, std::memcmp(out.data(), buf.data(), bytes));
  }
  // The communicator stays usable.
  EXPECT_TRUE(comm->Barrier()->Wait().ok());
}

TEST(ValidationTest, BadArgumentsFailTheOpOnly) {
  auto comm = WorldOne();
  ASSERT_NE(comm, nullptr);
  std::vector<float> buf(4);
  EXPECT_EQ(comm->Broadcast(buf.data(), 4, DataType::kFloat32, 1)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->Reduce(buf.data(), buf.data(), 4, DataType::kFloat32, -1)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(comm->AllReduce(nullptr, 4, DataType::kFloat32)->Wait().code(),
            absl::StatusCode::kInvalidArgument);
  // Count 0 is a no-op, even with null buffers.
  EXPECT_TRUE(comm->AllGather(nullptr, nullptr, 0, DataType::kFloat32)->Wait().ok());
  EXPECT_TRUE(comm->AllReduce(buf.data(), 4, DataType::kFloat32)->Wait().ok());
}

TEST(AbortTest, WorldOneAbortFailsLaterOps) {
  auto comm = WorldOne();
  ASSERT_NE(comm, nullptr);
  comm->Abort(absl::AbortedError("generation 3 ended"));
  comm->Abort(absl::InternalError("second reason is ignored"));
  std::vector<float> buf(4);
  absl::Status status = comm->AllReduce(buf.data(), 4, DataType::kFloat32)->Wait();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(status.message(), HasSubstr("generation 3 ended"));
  EXPECT_THAT(status.message(), HasSubstr("AllReduce"));
  EXPECT_EQ(comm->Barrier()->Wait().code(), absl::StatusCode::kAborted);

  // An OK reason still means aborted.
  auto other = WorldOne();
  ASSERT_NE(other, nullptr);
  other->Abort(absl::OkStatus());
  EXPECT_EQ(other->Barrier()->Wait().code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace weft::comm
