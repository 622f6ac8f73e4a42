// Unit tests of LogRelay, the spdlog sink that carries a worker's log lines to the coordinator:
// what it keeps (only during a run, info and above), its bound and the note for what it let
// go, the heartbeat batches and what a failed heartbeat gives back.
#include "worker/log_relay.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"

namespace weft::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LogRelayTest : public ::testing::Test {
 protected:
  void Use(LogRelay::Options options) {
    relay_ = std::make_shared<LogRelay>(options);
    logger_ = std::make_shared<spdlog::logger>("test", relay_);
    logger_->set_level(spdlog::level::trace);
  }

  // The texts of the next heartbeat's lines, delivered or not as `delivered` says.
  std::vector<std::string> Send(bool delivered = true) {
    weft::v1::HeartbeatRequest request;
    relay_->FillHeartbeat(&request);
    relay_->HeartbeatDone(delivered);
    last_ = request;
    std::vector<std::string> texts;
    for (const auto& line : request.log_lines()) texts.push_back(line.text());
    return texts;
  }

  std::shared_ptr<LogRelay> relay_;
  std::shared_ptr<spdlog::logger> logger_;
  weft::v1::HeartbeatRequest last_;
};

TEST_F(LogRelayTest, KeepsInfoAndAboveOnlyWhileARunIsSet) {
  Use({});
  logger_->info("before the run");
  relay_->SetRun("job-1", 3, 1);
  logger_->debug("debug is left out");
  logger_->info("joining job-1 as rank {}", 1);
  logger_->warn("slow step");
  relay_->ClearRun();
  logger_->error("after the run");

  EXPECT_THAT(Send(), ElementsAre("joining job-1 as rank 1", "slow step"));
  ASSERT_EQ(last_.log_lines_size(), 2);
  const weft::v1::WorkerLogLine& line = last_.log_lines(1);
  EXPECT_EQ(line.job_id(), "job-1");
  EXPECT_EQ(line.generation(), 3);
  EXPECT_EQ(line.rank(), 1);
  EXPECT_EQ(line.level(), "warning");
  EXPECT_GT(line.time().seconds(), 1'600'000'000);
  EXPECT_THAT(Send(), ElementsAre());  // delivered: gone
}

TEST_F(LogRelayTest, PastItsBoundTheOldestLinesGoAndANoteSaysHowMany) {
  Use({.max_lines = 4});
  relay_->SetRun("j", 1, 0);
  for (int i = 1; i <= 10; ++i) logger_->info("line {}", i);
  EXPECT_EQ(relay_->pending(), 4u);
  std::vector<std::string> sent = Send();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_THAT(sent[0], HasSubstr("... 7 lines dropped"));
  EXPECT_EQ(last_.log_lines(0).level(), "warning");
  EXPECT_EQ(last_.log_lines(0).job_id(), "j");
  EXPECT_EQ(sent[1], "line 8");
  EXPECT_EQ(sent[3], "line 10");
}

TEST_F(LogRelayTest, AHeartbeatCarriesABoundedBatch) {
  Use({.batch_lines = 2, .batch_bytes = 1000});
  relay_->SetRun("j", 1, 0);
  for (int i = 1; i <= 5; ++i) logger_->info("line {}", i);
  EXPECT_THAT(Send(), ElementsAre("line 1", "line 2"));
  EXPECT_THAT(Send(), ElementsAre("line 3", "line 4"));
  EXPECT_THAT(Send(), ElementsAre("line 5"));
  // By bytes: lines of 600 bytes go one by one, however long each is.
  logger_->info(std::string(600, 'a'));
  logger_->info(std::string(600, 'b'));
  EXPECT_EQ(Send().size(), 1u);
  EXPECT_EQ(Send().size(), 1u);
}

TEST_F(LogRelayTest, AFailedHeartbeatsLinesGoBackInFront) {
  Use({.max_lines = 4});
  relay_->SetRun("j", 1, 0);
  logger_->info("a");
  logger_->info("b");
  weft::v1::HeartbeatRequest request;
  relay_->FillHeartbeat(&request);
  ASSERT_EQ(request.log_lines_size(), 2);
  logger_->info("c");  // logged while the heartbeat is out
  relay_->HeartbeatDone(false);
  EXPECT_THAT(Send(), ElementsAre("a", "b", "c"));

  // Put back into a ring that filled meanwhile: the oldest go, counted.
  logger_->info("d");
  logger_->info("e");
  request.Clear();
  relay_->FillHeartbeat(&request);
  for (const char* text : {"f", "g", "h"}) logger_->info(text);
  relay_->HeartbeatDone(false);
  std::vector<std::string> sent = Send();
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_THAT(sent[0], HasSubstr("... 2 lines dropped"));
  EXPECT_THAT(std::vector<std::string>(sent.begin() + 1, sent.end()), ElementsAre("f", "g", "h"));
}

TEST_F(LogRelayTest, LinesAreValidUtf8AndCut) {
  Use({.max_line_bytes = 16});
  relay_->SetRun("j", 1, 0);
  logger_->info("bad \xFF byte");
  logger_->info("0123456789abcdefghij");
  EXPECT_THAT(Send(), ElementsAre("bad \xEF\xBF\xBD byte", "0123456789abc\xE2\x80\xA6"));
}

}  // namespace
}  // namespace weft::worker
