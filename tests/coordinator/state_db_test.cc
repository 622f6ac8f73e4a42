// Unit tests for StateDb's generation stores (coordinator/state_db.h): what a coordinator
// restart reads back, and what ending a generation removes. Jobs are covered through the
// Coordinator (coordinator_test.cc).
#include "coordinator/state_db.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace weft::coordinator {
namespace {

using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(StateDbStoreTest, KeysSurviveAReopenUntilTheirJobsStoresAreDropped) {
  weft::testing::TempDir dir;
  {
    auto db = StateDb::Open(dir.path());
    ASSERT_TRUE(db.ok()) << db.status();
    const std::string one = "1", two = "2";
    ASSERT_TRUE((*db)->PutStoreKey("a-1-xxxxxx", 3, "k/1", &one).ok());
    ASSERT_TRUE((*db)->PutStoreKey("a-1-xxxxxx", 3, "k/2", &two).ok());
    ASSERT_TRUE((*db)->PutStoreKey("a-1-xxxxxx", 3, "k/2", nullptr).ok());  // deleted
    ASSERT_TRUE((*db)->PutStoreKey("a-1-xxxxxx", 4, "k/1", &two).ok());
    // A job id that extends another's must not be caught by its prefix.
    ASSERT_TRUE((*db)->PutStoreKey("a-1-xxxxxx0", 3, "k/1", &two).ok());
    ASSERT_TRUE((*db)->PutStoreKey("b-2-yyyyyy", 1, "k", &one).ok());
  }
  auto db = StateDb::Open(dir.path());
  ASSERT_TRUE(db.ok()) << db.status();
  auto three = (*db)->LoadStore("a-1-xxxxxx", 3);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_THAT(*three, UnorderedElementsAre(Pair("k/1", "1")));
  EXPECT_THAT(*(*db)->LoadStore("a-1-xxxxxx", 4), UnorderedElementsAre(Pair("k/1", "2")));
  EXPECT_THAT(*(*db)->LoadStore("a-1-xxxxxx", 5), IsEmpty());

  ASSERT_TRUE((*db)->DropStores("a-1-xxxxxx").ok());
  EXPECT_THAT(*(*db)->LoadStore("a-1-xxxxxx", 3), IsEmpty());
  EXPECT_THAT(*(*db)->LoadStore("a-1-xxxxxx", 4), IsEmpty());
  EXPECT_THAT(*(*db)->LoadStore("a-1-xxxxxx0", 3), UnorderedElementsAre(Pair("k/1", "2")));

  ASSERT_TRUE((*db)->DropStoresExcept({"b-2-yyyyyy"}).ok());
  EXPECT_THAT(*(*db)->LoadStore("a-1-xxxxxx0", 3), IsEmpty());
  EXPECT_THAT(*(*db)->LoadStore("b-2-yyyyyy", 1), UnorderedElementsAre(Pair("k", "1")));
  // Jobs are untouched by the store keys around them.
  auto jobs = (*db)->LoadJobs();
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_THAT(*jobs, IsEmpty());
}

}  // namespace
}  // namespace weft::coordinator
