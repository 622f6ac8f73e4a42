// Unit tests of JobLogs: numbering, filters, paging, the per-job and global bounds and what
// `dropped` says about them.
#include "coordinator/job_logs.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace weft::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using weft::v1::GetJobLogsRequest;
using weft::v1::GetJobLogsResponse;
using weft::v1::HeartbeatRequest;

bool AnyJob(const std::string&) { return true; }

void AddLine(HeartbeatRequest* request, const std::string& job_id, int32_t rank,
             const std::string& text) {
  weft::v1::WorkerLogLine* line = request->add_log_lines();
  line->set_job_id(job_id);
  line->set_generation(1);
  line->set_rank(rank);
  line->set_level("info");
  line->set_text(text);
}

// A heartbeat of `worker` carrying `texts` as rank `rank`'s lines of `job_id`.
HeartbeatRequest Beat(const std::string& worker, const std::string& job_id, int32_t rank,
                      const std::vector<std::string>& texts) {
  HeartbeatRequest request;
  request.set_worker_id(worker);
  request.set_job_id(job_id);
  for (const std::string& text : texts) AddLine(&request, job_id, rank, text);
  return request;
}

GetJobLogsResponse Read(const JobLogs& logs, const std::string& job_id, int64_t after_seq = 0,
                        int32_t max_lines = 0, int rank = -1) {
  GetJobLogsRequest request;
  request.set_job_id(job_id);
  request.set_after_seq(after_seq);
  request.set_max_lines(max_lines);
  if (rank >= 0) request.set_rank(rank);
  absl::StatusOr<GetJobLogsResponse> response = logs.Read(request);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? *response : GetJobLogsResponse();
}

std::vector<std::string> Texts(const GetJobLogsResponse& response) {
  std::vector<std::string> out;
  for (const auto& line : response.lines()) out.push_back(line.text());
  return out;
}
std::vector<int64_t> Seqs(const GetJobLogsResponse& response) {
  std::vector<int64_t> out;
  for (const auto& line : response.lines()) out.push_back(line.seq());
  return out;
}

TEST(JobLogsTest, LinesAreNumberedInArrivalOrderAcrossRanksAndFilteredByRank) {
  JobLogs logs({.first_seq = 100});
  logs.Append(Beat("node/cpu0", "j", 0, {"a0", "b0"}), AnyJob);
  logs.Append(Beat("node/cpu1", "j", 1, {"a1"}), AnyJob);
  logs.Append(Beat("node/cpu0", "j", 0, {"c0"}), AnyJob);

  GetJobLogsResponse all = Read(logs, "j");
  EXPECT_THAT(Texts(all), ElementsAre("a0", "b0", "a1", "c0"));
  EXPECT_THAT(Seqs(all), ElementsAre(100, 101, 102, 103));
  EXPECT_EQ(all.next_seq(), 103);
  EXPECT_EQ(all.dropped(), 0);
  EXPECT_EQ(all.lines(2).worker_id(), "node/cpu1");
  EXPECT_EQ(all.lines(2).rank(), 1);

  // After a seq: only newer lines; nothing new leaves next_seq where it was.
  EXPECT_THAT(Texts(Read(logs, "j", 101)), ElementsAre("a1", "c0"));
  GetJobLogsResponse none = Read(logs, "j", 103);
  EXPECT_EQ(none.lines_size(), 0);
  EXPECT_EQ(none.next_seq(), 103);

  // One rank: next_seq covers the other ranks' lines looked past, so a follower does not scan
  // them again.
  GetJobLogsResponse rank1 = Read(logs, "j", 0, 0, 1);
  EXPECT_THAT(Texts(rank1), ElementsAre("a1"));
  EXPECT_EQ(rank1.next_seq(), 103);
  EXPECT_EQ(Read(logs, "j", rank1.next_seq(), 0, 1).lines_size(), 0);

  // Pages of max_lines, each going on where the last ended.
  GetJobLogsResponse page = Read(logs, "j", 0, 3);
  EXPECT_THAT(Texts(page), ElementsAre("a0", "b0", "a1"));
  EXPECT_THAT(Texts(Read(logs, "j", page.next_seq(), 3)), ElementsAre("c0"));
  page = Read(logs, "j", 0, 1, 0);
  EXPECT_THAT(Texts(page), ElementsAre("a0"));
  EXPECT_THAT(Texts(Read(logs, "j", page.next_seq(), 5, 0)), ElementsAre("b0", "c0"));

  // A job without lines answers empty.
  GetJobLogsResponse other = Read(logs, "other", 7);
  EXPECT_EQ(other.lines_size(), 0);
  EXPECT_EQ(other.next_seq(), 7);
}

TEST(JobLogsTest, LinesGoToTheJobTheyNameIfItExists) {
  JobLogs logs({.first_seq = 1});
  // An idle worker's heartbeat carries its last lines of job j; a line of a job the
  // coordinator does not know is dropped.
  HeartbeatRequest request;
  request.set_worker_id("node/cpu0");
  AddLine(&request, "j", 0, "last words");
  AddLine(&request, "gone", 0, "of a job deleted since");
  AddLine(&request, "", 0, "of no job");
  logs.Append(request, [](const std::string& job_id) { return job_id == "j"; });
  EXPECT_THAT(Texts(Read(logs, "j")), ElementsAre("last words"));
  EXPECT_EQ(Read(logs, "gone").lines_size(), 0);
  EXPECT_EQ(logs.active_jobs(), 1u);
}

TEST(JobLogsTest, AJobKeepsItsNewestLinesAndCountsTheRestAsDropped) {
  JobLogs logs({.max_lines_per_job = 3, .first_seq = 1});
  logs.Append(Beat("w", "j", 0, {"1", "2", "3", "4", "5"}), AnyJob);
  GetJobLogsResponse all = Read(logs, "j");
  EXPECT_THAT(Texts(all), ElementsAre("3", "4", "5"));
  EXPECT_EQ(all.dropped(), 2);
  // A reader that had line 1 missed only line 2; one that had line 2 missed nothing.
  EXPECT_EQ(Read(logs, "j", 1).dropped(), 1);
  EXPECT_EQ(Read(logs, "j", 2).dropped(), 0);
  EXPECT_EQ(Read(logs, "j", 4).dropped(), 0);

  // The byte bound too: a line of 1000 bytes leaves room for few.
  JobLogs small({.max_bytes_per_job = 2500, .first_seq = 1});
  small.Append(Beat("w", "j", 0, {std::string(1000, 'a'), std::string(1000, 'b'),
                                  std::string(1000, 'c')}),
               AnyJob);
  GetJobLogsResponse kept = Read(small, "j");
  EXPECT_EQ(kept.lines_size(), 2);
  EXPECT_EQ(kept.dropped(), 1);
  EXPECT_EQ(kept.lines(0).text()[0], 'b');
}

TEST(JobLogsTest, OnlyTheMostRecentlyActiveJobsKeepLines) {
  JobLogs logs({.max_active_jobs = 2, .first_seq = 1});
  logs.Append(Beat("w", "a", 0, {"a1", "a2"}), AnyJob);
  logs.Append(Beat("w", "b", 0, {"b1"}), AnyJob);
  logs.Append(Beat("w", "a", 0, {"a3"}), AnyJob);  // a is now more recent than b
  logs.Append(Beat("w", "c", 0, {"c1"}), AnyJob);  // b, the least recent, goes
  EXPECT_EQ(logs.active_jobs(), 2u);
  EXPECT_THAT(Texts(Read(logs, "a")), ElementsAre("a1", "a2", "a3"));
  EXPECT_THAT(Texts(Read(logs, "c")), ElementsAre("c1"));
  GetJobLogsResponse b = Read(logs, "b");
  EXPECT_EQ(b.lines_size(), 0);
  EXPECT_EQ(b.dropped(), 1);

  // A job that logs again starts where its numbering was, and takes another job's place.
  logs.Append(Beat("w", "b", 0, {"b2"}), AnyJob);
  b = Read(logs, "b");
  EXPECT_THAT(Texts(b), ElementsAre("b2"));
  EXPECT_THAT(Seqs(b), ElementsAre(2));
  EXPECT_EQ(b.dropped(), 1);
  EXPECT_EQ(Read(logs, "a").lines_size(), 0);
  EXPECT_EQ(Read(logs, "a").dropped(), 3);
  EXPECT_EQ(logs.active_jobs(), 2u);
}

TEST(JobLogsTest, ARestartedCoordinatorNumbersAboveItsPredecessor) {
  JobLogs before;
  before.Append(Beat("w", "j", 0, {"old"}), AnyJob);
  const int64_t follower_at = Read(before, "j").next_seq();
  absl::SleepFor(absl::Milliseconds(1));  // the numbering comes from the clock, in µs
  JobLogs after;  // a restart: every line forgotten
  after.Append(Beat("w", "j", 0, {"new"}), AnyJob);
  GetJobLogsResponse seen = Read(after, "j", follower_at);
  EXPECT_THAT(Texts(seen), ElementsAre("new"));
  EXPECT_GT(seen.next_seq(), follower_at);
  // Lines of the predecessor are not counted as dropped: this coordinator never had them.
  EXPECT_EQ(seen.dropped(), 0);
  EXPECT_EQ(Read(after, "j").dropped(), 0);
}

TEST(JobLogsTest, MaxLinesDefaultsTo1000AndLongLinesAreCut) {
  JobLogs logs({.max_line_bytes = 16, .first_seq = 1});
  logs.Append(Beat("w", "j", 0, std::vector<std::string>(1500, "x")), AnyJob);
  EXPECT_EQ(Read(logs, "j").lines_size(), 1000);
  EXPECT_EQ(Read(logs, "j", 0, 20000).lines_size(), 1500);

  JobLogs cut({.max_line_bytes = 16, .first_seq = 1});
  cut.Append(Beat("w", "j", 0, {"0123456789abcdefghij"}), AnyJob);
  const std::string text = Read(cut, "j").lines(0).text();
  EXPECT_LE(text.size(), 16u);
  EXPECT_EQ(text, "0123456789abc\xE2\x80\xA6");
}

TEST(JobLogsTest, NegativeRankAfterSeqOrMaxLinesIsNamed) {
  JobLogs logs;
  GetJobLogsRequest request;
  request.set_job_id("j");
  request.set_rank(-1);
  absl::StatusOr<GetJobLogsResponse> r = logs.Read(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("rank: -1"));
  request.clear_rank();
  request.set_max_lines(-5);
  request.set_after_seq(-2);
  r = logs.Read(request);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("max_lines: -5"));
  EXPECT_THAT(r.status().message(), HasSubstr("after_seq: -2"));
}

}  // namespace
}  // namespace weft::coordinator
