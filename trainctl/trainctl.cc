// trainctl: the user's command line for a Weft cluster. A thin layer over CoordinatorClient:
// every subcommand is one call (watch: one stream) plus formatting.
// The checkpoint subcommands (trainctl_checkpoints.h) talk to weft-checkpointd instead, and the
// data subcommands (trainctl_data.h) to nothing: they prepare text locally. `logs` lives in
// trainctl_logs.h, `sample --chat` in trainctl_chat.h.
//
// Exit status: 0 on success; 1 on any error (message on stderr as "trainctl: <message>"),
// and for `watch`, `events -f` and `logs -f`, 1 when the job ends FAILED or CANCELLED. Usage
// errors exit with CLI11's codes (non-zero). Output is a table or summary for people (-o text,
// the default) or JSON (-o json) by the one rule of trainctl_output.h: one object for a command
// that answers once (the RPC's response message), one compact object per line for one that
// follows a job.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "trainctl/trainctl_chat.h"
#include "trainctl/trainctl_checkpoints.h"
#include "trainctl/trainctl_data.h"
#include "trainctl/trainctl_logs.h"
#include "trainctl/trainctl_model.h"
#include "trainctl/trainctl_output.h"
#include "common/job_spec.h"
#include "common/security_flags.h"
#include "common/status.h"
#include "common/time_util.h"
#include "nlohmann/json.hpp"
#include "worker/model_io/model_file.h"

namespace weft::trainctl {
namespace {

using weft::v1::JobEvent;
using weft::v1::JobState;
using weft::v1::JobStatus;

constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
constexpr char kDefaultCheckpointd[] = "127.0.0.1:7071";
constexpr char kNone[] = "-";

struct GlobalOptions {
  std::string coordinator = kDefaultCoordinator;
  std::string checkpointd = kDefaultCheckpointd;
  std::string output = "text";
  double timeout_s = 10;
  SecurityFlags security;

  bool json() const { return output == "json"; }
};

// ---------------------------------------------------------------------------------------
// Formatting helpers.

std::string FormatTimestamp(const google::protobuf::Timestamp& t) {
  if (!HasTime(t)) return kNone;
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", FromProtoTime(t), absl::LocalTimeZone());
}

// Coarse and short, for table columns: "45s", "12m", "3h", "2d".
std::string FormatAge(absl::Duration d) {
  if (d < absl::ZeroDuration()) d = absl::ZeroDuration();
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m");
  if (s < 86400) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string AgeOf(const google::protobuf::Timestamp& t) {
  if (!HasTime(t)) return kNone;
  return FormatAge(absl::Now() - FromProtoTime(t));
}

// Finer than FormatAge, for an ETA: "1h02m", "4m05s", "12s".
std::string FormatEta(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d + absl::Milliseconds(500)));
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrCat(s, "s");
}

std::string FormatRate(double per_s) {
  if (per_s >= 1e6) return absl::StrFormat("%.2fM", per_s / 1e6);
  if (per_s >= 1e3) return absl::StrFormat("%.1fk", per_s / 1e3);
  return absl::StrFormat("%.0f", per_s);
}

std::string FormatCount(int64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%.2fB", n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%.1fM", n / 1e6);
  if (n >= 1000) return absl::StrFormat("%.1fK", n / 1e3);
  return absl::StrCat(n);
}

// Metrics exist once rank 0 reported a step; before that "loss 0" would be a lie.
bool HasMetrics(const JobStatus& status) {
  return status.has_last_metrics() && status.last_metrics().step() > 0;
}

std::string LossOf(const JobStatus& status) {
  return HasMetrics(status) ? absl::StrFormat("%.4f", status.last_metrics().loss()) : kNone;
}

std::string StepOf(const JobStatus& status) {
  return absl::StrCat(status.step(), "/", status.total_steps());
}

// Events carry milliseconds: recovery is measured in them.
std::string FormatEventTime(const google::protobuf::Timestamp& t) {
  if (t.seconds() == 0 && t.nanos() == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S", FromProtoTime(t), absl::LocalTimeZone());
}

std::string EventLine(const JobEvent& event) {
  std::string line = absl::StrCat(
      FormatEventTime(event.time()), "  ",
      ShortEnumName(weft::v1::JobEventType_Name(event.type()), "JOB_EVENT_TYPE_"));
  if (event.generation() > 0) absl::StrAppend(&line, " gen ", event.generation());
  if (event.type() == weft::v1::STATE_CHANGED) {
    absl::StrAppend(&line, " -> ", StateName(event.state()));
  }
  if (!event.message().empty()) absl::StrAppend(&line, ": ", event.message());
  return line;
}

absl::StatusOr<JobState> ParseJobState(const std::string& text) {
  std::string upper = absl::AsciiStrToUpper(text);
  JobState state;
  if (weft::v1::JobState_Parse(upper, &state) && state != weft::v1::JOB_STATE_UNSPECIFIED) {
    return state;
  }
  std::vector<std::string> names;
  for (int i = weft::v1::JobState_MIN; i <= weft::v1::JobState_MAX; ++i) {
    if (weft::v1::JobState_IsValid(i) && i != weft::v1::JOB_STATE_UNSPECIFIED) {
      names.push_back(weft::v1::JobState_Name(static_cast<JobState>(i)));
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("--state: unknown job state \"", text,
                                                 "\"; one of ", absl::StrJoin(names, ", ")));
}

// ---------------------------------------------------------------------------------------
// Subcommands. Each returns the process exit status.

int Submit(CoordinatorClient& client, const GlobalOptions& global, const std::string& path,
           const std::string& resume_from) {
  absl::StatusOr<v1::JobSpec> spec = ReadJobSpecFile(path);
  if (!spec.ok()) {
    if (spec.status().code() == absl::StatusCode::kInvalidArgument) {
      // Already "file:line:column: message" lines, the shape editors jump to.
      std::cerr << spec.status().message() << "\n";
      return 1;
    }
    return Fail(spec.status());
  }
  if (!resume_from.empty()) spec->set_resume_from_job(resume_from);
  absl::StatusOr<weft::v1::SubmitJobResponse> response = client.SubmitJob(*spec);
  if (!response.ok()) {
    if (response.status().code() == absl::StatusCode::kInvalidArgument) {
      std::cerr << "trainctl: " << path << " rejected: " << response.status().message() << "\n";
      return 1;
    }
    return Fail(response.status());
  }
  if (global.json()) return PrintJsonExit(*response);
  std::cout << response->job_id() << "\n";
  return 0;
}

void PrintSpecSummary(const v1::JobSpec& spec) {
  const auto& m = spec.model();
  const auto& d = spec.data();
  const auto& o = spec.optimizer();
  const auto& lr = spec.lr_schedule();
  const auto& t = spec.training();
  const auto& r = spec.resources();
  const auto& c = spec.checkpoint();
  const auto& f = spec.fault();

  std::string data = absl::StrCat(
      d.train_path(), " (", ShortEnumName(weft::v1::DataFormat_Name(d.format()), "DATA_FORMAT_"),
      ")");
  if (!d.manifest_path().empty()) {
    data = absl::StrCat("dataset ", d.manifest_path(), " (its manifest's splits)");
  } else if (!d.val_path().empty()) {
    absl::StrAppend(&data, ", validation ", d.val_path());
  } else {
    absl::StrAppend(&data, absl::StrFormat(", last %g%% held out", d.val_fraction() * 100));
  }
  if (d.sampling() == weft::v1::DataSpec::SEQUENTIAL) absl::StrAppend(&data, ", sequential epochs");
  std::string checkpoint =
      c.interval_steps() > 0
          ? absl::StrCat("every ", c.interval_steps(), " steps, keep last ", c.keep_last())
          : std::string("disabled");
  std::string validation =
      t.val_interval_steps() > 0
          ? absl::StrCat(", validation every ", t.val_interval_steps(), " steps (",
                         t.val_batches(), " batches)")
          : std::string();

  const std::vector<std::vector<std::string>> rows = {
      {"  model",
       absl::StrFormat("%d layers, hidden %d, %d heads, vocab %d (padded %d), context %d; "
                       "%s parameters",
                       m.num_layers(), m.hidden_size(), m.num_heads(), m.vocab_size(),
                       m.padded_vocab_size(), m.context_length(),
                       FormatCount(ModelParameterCount(m)))},
      {"  data", data},
      {"  optimizer",
       absl::StrFormat("AdamW lr %g, betas %g/%g, eps %g, weight decay %g, clip %g; %s schedule, "
                       "warmup %d, min lr ratio %g",
                       o.learning_rate(), o.beta1(), o.beta2(), o.epsilon(), o.weight_decay(),
                       o.grad_clip_norm(),
                       ShortEnumName(weft::v1::LrSchedule::Kind_Name(lr.kind()), "KIND_"),
                       lr.warmup_steps(), lr.min_lr_ratio())},
      {"  training",
       absl::StrCat(t.total_steps(), " steps, micro-batch ", t.micro_batch_size(), " x ",
                    t.sequence_length(), " tokens, grad accum ", t.grad_accum_steps(), ", seed ",
                    t.seed(), validation,
                    t.device_memory_limit_gib() > 0
                        ? absl::StrFormat(", GPU memory limit %g GiB", t.device_memory_limit_gib())
                        : "")},
      {"  parallelism",
       absl::StrCat("ZeRO-", spec.zero_stage(), ", ",
                    ShortEnumName(weft::v1::Precision_Name(spec.precision()), "PRECISION_"))},
      {"  resources",
       absl::StrCat(ShortEnumName(weft::v1::DeviceKind_Name(r.device_kind()), "DEVICE_KIND_"),
                    " workers ", r.min_workers(),
                    r.max_workers() > r.min_workers() ? absl::StrCat("-", r.max_workers()) : "")},
      {"  checkpoint", checkpoint},
      {"  faults",
       absl::StrCat("heartbeat ", f.heartbeat_interval_ms(), " ms, timeout ",
                    f.heartbeat_timeout_ms(), " ms, stall ", f.stall_timeout_ms(),
                    " ms, max restarts ", f.max_restarts(), ", max skipped steps ",
                    f.max_skipped_steps())},
  };
  PrintTable(rows);
}

// Where a job stands: time since it started (to its end, once ended), the ETA of a running one
// from its last step time, its last committed checkpoint and the saves that failed (among the
// events the coordinator still holds), and where its trained model was written.
std::vector<std::vector<std::string>> ProgressRows(const JobStatus& s, absl::Time now) {
  std::string elapsed = kNone;
  if (HasTime(s.start_time())) {
    const absl::Time end = HasTime(s.end_time()) ? FromProtoTime(s.end_time()) : now;
    elapsed = FormatEta(end - FromProtoTime(s.start_time()));
  }
  std::string eta = kNone;
  if (s.state() == weft::v1::RUNNING && HasMetrics(s) && s.last_metrics().step_ms() > 0 &&
      s.total_steps() > s.step()) {
    eta = absl::StrCat(FormatEta(absl::Milliseconds(s.last_metrics().step_ms() *
                                                    static_cast<double>(s.total_steps() -
                                                                        s.step()))),
                       " (at the last step's time)");
  }
  int failed_saves = 0;
  for (const JobEvent& e : s.events()) failed_saves += e.type() == weft::v1::CHECKPOINT_FAILED;
  std::string checkpoint = s.checkpoint_step() > 0
                               ? absl::StrCat("step ", s.checkpoint_step(), " committed")
                               : std::string("none committed");
  absl::StrAppend(&checkpoint, "; ", failed_saves, " failed save", failed_saves == 1 ? "" : "s",
                  " in the recent events");
  std::string model = kNone;
  if (!s.model_path().empty()) {
    model = s.model_host().empty() ? s.model_path()
                                   : absl::StrCat(s.model_host(), ":", s.model_path());
  }
  return {{"Elapsed", elapsed}, {"ETA", eta}, {"Checkpoint", checkpoint}, {"Model", model}};
}

int Status(CoordinatorClient& client, const GlobalOptions& global, const std::string& job_id) {
  absl::StatusOr<v1::Job> job = client.GetJob(job_id);
  if (!job.ok()) return Fail(job.status());
  if (global.json()) return PrintJsonExit(*job);
  const JobStatus& s = job->status();
  std::vector<std::vector<std::string>> rows = {
      {"Job", s.job_id()},
      {"Name", s.name()},
      {"State", StateName(s.state())},
      {"Generation", absl::StrCat(s.generation(), " (restarts ", s.restarts(), ")")},
      {"Step", StepOf(s)},
      {"Workers", s.worker_ids().empty() ? kNone : absl::StrJoin(s.worker_ids(), ", ")},
      {"Created", absl::StrCat(FormatTimestamp(s.create_time()),
                               HasTime(s.create_time())
                                   ? absl::StrCat(" (", AgeOf(s.create_time()), " ago)")
                                   : "")},
      {"Started", FormatTimestamp(s.start_time())},
      {"Ended", FormatTimestamp(s.end_time())},
  };
  for (std::vector<std::string>& row : ProgressRows(s, absl::Now())) rows.push_back(row);
  if (!s.pending_reason().empty()) rows.push_back({"Waiting", s.pending_reason()});
  if (!s.awaiting_join().empty()) {
    rows.push_back(
        {"Rendezvous", absl::StrCat("waiting for ", absl::StrJoin(s.awaiting_join(), ", "),
                                    " to join (", s.worker_ids_size() - s.awaiting_join_size(),
                                    " of ", s.worker_ids_size(), " joined)")});
  }
  if (!s.error().empty()) rows.push_back({"Error", s.error()});
  PrintTable(rows);

  std::cout << "\nSpec\n";
  PrintSpecSummary(job->spec());

  if (HasMetrics(s)) {
    const auto& m = s.last_metrics();
    std::cout << "\nLast step\n";
    PrintTable({
        {"  step", absl::StrCat(m.step(), " at ", FormatTimestamp(m.time()))},
        {"  loss", absl::StrFormat("%.4f%s", m.loss(),
                                   m.val_loss() > 0
                                       ? absl::StrFormat(" (validation %.4f)", m.val_loss())
                                       : "")},
        {"  learning rate", absl::StrFormat("%g", m.learning_rate())},
        {"  grad norm", absl::StrFormat("%.4f", m.grad_norm())},
        {"  tokens/s", FormatRate(m.tokens_per_s())},
        {"  step time",
         absl::StrFormat("%.1f ms (forward %.1f, backward %.1f, exposed comm %.1f, "
                         "optimizer %.1f)",
                         m.step_ms(), m.forward_ms(), m.backward_ms(), m.exposed_comm_ms(),
                         m.optimizer_ms())},
        {"  state per rank", FormatCount(m.state_bytes()) + "B"},
    });
  }

  std::cout << "\nEvents\n";
  if (s.events().empty()) {
    std::cout << "  (none)\n";
  } else {
    std::vector<std::vector<std::string>> events = {{"  TIME", "TYPE", "GEN", "MESSAGE"}};
    for (const JobEvent& e : s.events()) {
      std::string type = ShortEnumName(weft::v1::JobEventType_Name(e.type()), "JOB_EVENT_TYPE_");
      if (e.type() == weft::v1::STATE_CHANGED) absl::StrAppend(&type, " -> ", StateName(e.state()));
      events.push_back({"  " + FormatTimestamp(e.time()), type,
                        e.generation() > 0 ? absl::StrCat(e.generation()) : kNone, e.message()});
    }
    PrintTable(events);
  }
  return 0;
}

int List(CoordinatorClient& client, const GlobalOptions& global,
         const std::vector<std::string>& state_names, int limit) {
  std::vector<JobState> states;
  for (const std::string& name : state_names) {
    absl::StatusOr<JobState> state = ParseJobState(name);
    if (!state.ok()) return Fail(state.status());
    states.push_back(*state);
  }
  absl::StatusOr<std::vector<JobStatus>> jobs = client.ListJobs(states, limit);
  if (!jobs.ok()) return Fail(jobs.status());
  if (global.json()) {
    return PrintListJson(std::move(*jobs), &weft::v1::ListJobsResponse::mutable_jobs);
  }
  std::vector<std::vector<std::string>> rows = {
      {"JOB ID", "NAME", "STATE", "GEN", "STEP", "LOSS", "AGE"}};
  for (const JobStatus& job : *jobs) {
    rows.push_back({job.job_id(), job.name(), StateName(job.state()),
                    absl::StrCat(job.generation()), StepOf(job), LossOf(job),
                    AgeOf(job.create_time())});
  }
  PrintTable(rows);
  return 0;
}

int Cancel(CoordinatorClient& client, const GlobalOptions& global, const std::string& job_id,
           const std::string& reason) {
  absl::StatusOr<JobStatus> status = client.CancelJob(job_id, reason);
  if (!status.ok()) return Fail(status.status());
  if (global.json()) return PrintJsonExit(*status);
  std::cout << status->job_id() << " " << StateName(status->state()) << "\n";
  return 0;
}

// Renders a watch: one status line per update, or one line redrawn in place on a terminal,
// with job events printed above it as they appear.
class WatchPrinter {
 public:
  explicit WatchPrinter(bool tty) : tty_(tty) {}

  void Update(const JobStatus& status) {
    for (const JobEvent& event : status.events()) {
      // Each update resends the recent events; print each one once.
      if (!printed_events_.insert(event.SerializeAsString()).second) continue;
      ClearLine();
      std::cout << EventLine(event) << "\n";
    }
    const std::string line = StatusLine(status);
    if (tty_) {
      std::cout << "\r" << line << "\033[K";
      line_drawn_ = true;
    } else {
      std::cout << line << "\n";
    }
    std::cout.flush();
  }

  // Ends a redrawn line so that what follows starts on a fresh one.
  void Finish() {
    if (line_drawn_) std::cout << "\n";
    line_drawn_ = false;
    std::cout.flush();
  }

 private:
  void ClearLine() {
    if (line_drawn_) std::cout << "\r\033[K";
    line_drawn_ = false;
  }

  // From the pace observed during this watch, which includes what step_ms leaves out
  // (checkpoints, validation, reporting); step_ms until two steps have been seen.
  std::string Eta(const JobStatus& s) {
    const absl::Time now = absl::Now();
    // A new generation resumes from a checkpoint, possibly behind the last step seen.
    if (s.generation() != pace_generation_ || s.step() < pace_step_) {
      pace_generation_ = s.generation();
      pace_step_ = s.step();
      pace_time_ = now;
    }
    if (s.state() != weft::v1::RUNNING || s.total_steps() <= s.step()) return kNone;
    const int64_t remaining = s.total_steps() - s.step();
    if (s.step() > pace_step_) {
      return FormatEta((now - pace_time_) / static_cast<double>(s.step() - pace_step_) *
                       static_cast<double>(remaining));
    }
    if (HasMetrics(s) && s.last_metrics().step_ms() > 0) {
      return FormatEta(absl::Milliseconds(s.last_metrics().step_ms() * remaining));
    }
    return kNone;
  }

  std::string StatusLine(const JobStatus& s) {
    std::string line = absl::StrCat(s.job_id(), "  ", StateName(s.state()), "  gen ",
                                    s.generation(), "  step ", StepOf(s));
    if (s.total_steps() > 0) {
      absl::StrAppend(&line, absl::StrFormat(" (%d%%)", s.step() * 100 / s.total_steps()));
    }
    absl::StrAppend(&line, "  loss ", LossOf(s));
    const auto& m = s.last_metrics();
    absl::StrAppend(&line, "  tok/s ", HasMetrics(s) ? FormatRate(m.tokens_per_s()) : kNone);
    absl::StrAppend(&line, "  ETA ", Eta(s));
    // Why it is not training yet, the thing a user waiting on PENDING wants to know.
    if (!s.pending_reason().empty()) absl::StrAppend(&line, "  (", s.pending_reason(), ")");
    return line;
  }

  bool tty_;
  bool line_drawn_ = false;
  int64_t pace_generation_ = -1;
  int64_t pace_step_ = 0;
  absl::Time pace_time_;
  std::set<std::string> printed_events_;
};

int Watch(CoordinatorClient& client, const GlobalOptions& global, const std::string& job_id) {
  WatchPrinter printer(::isatty(STDOUT_FILENO) == 1);
  JobStatus last;
  bool got_any = false;
  absl::Status print_status;
  absl::Status watched = client.WatchJob(job_id, [&](const JobStatus& status) {
    last = status;
    got_any = true;
    if (global.json()) {
      print_status = PrintJsonLine(status);
      return print_status.ok();
    }
    printer.Update(status);
    return true;
  });
  printer.Finish();
  if (!print_status.ok()) return Fail(print_status);
  if (!watched.ok()) return Fail(watched);
  if (!got_any) return Fail(absl::UnavailableError("watch ended without any update"));
  switch (last.state()) {
    case weft::v1::SUCCEEDED:
      if (!global.json()) {
        std::cout << last.job_id() << " SUCCEEDED after " << last.step() << " steps\n";
      }
      return 0;
    case weft::v1::FAILED:
    case weft::v1::CANCELLED: {
      std::string why = last.error();
      if (why.empty()) {
        // A cancelled job has no error; the cancel request says who and why.
        for (const JobEvent& e : last.events()) {
          if (e.type() == weft::v1::CANCEL_REQUESTED && !e.message().empty()) why = e.message();
        }
      }
      return Fail(absl::AbortedError(absl::StrCat("job ", last.job_id(), " ",
                                                  StateName(last.state()),
                                                  why.empty() ? "" : ": ", why)));
    }
    default:
      return Fail(absl::UnavailableError(absl::StrCat("watch of job ", job_id, " ended while ",
                                                      StateName(last.state()))));
  }
}

// Identity of an event, to print each once while following (the coordinator keeps the newest
// events only, so positions in the list shift).
std::string EventKey(const JobEvent& e) {
  return absl::StrCat(e.time().seconds(), ".", e.time().nanos(), "/", e.type(), "/",
                      e.generation(), "/", e.message());
}

// Every transition of a job with its time and reason, oldest first; with `follow`, new ones as
// they happen until the job ends (exit 0 if it SUCCEEDED, like watch). JSON: {"job_id": ...,
// "events": [JobEvent...]}; with `follow`, one JobEvent per line.
int Events(CoordinatorClient& client, const GlobalOptions& global, const std::string& job_id,
           bool follow) {
  if (!follow) {
    absl::StatusOr<weft::v1::Job> job = client.GetJob(job_id);
    if (!job.ok()) return Fail(job.status());
    if (!global.json()) {
      for (const JobEvent& e : job->status().events()) std::cout << EventLine(e) << "\n";
      return 0;
    }
    nlohmann::json events = nlohmann::json::array();
    for (const JobEvent& e : job->status().events()) {
      absl::StatusOr<nlohmann::json> event = ProtoToJson(e);
      if (!event.ok()) return Fail(event.status());
      events.push_back(*std::move(event));
    }
    return PrintJsonObject({{"job_id", job_id}, {"events", std::move(events)}});
  }
  absl::flat_hash_set<std::string> printed;
  absl::Status print_status;
  JobStatus last;
  auto print_new = [&](const JobStatus& status) {
    last = status;
    for (const JobEvent& e : status.events()) {
      if (!printed.insert(EventKey(e)).second) continue;
      if (global.json()) {
        print_status = PrintJsonLine(e);
        if (!print_status.ok()) return false;
      } else {
        std::cout << EventLine(e) << "\n";
      }
    }
    std::cout.flush();
    return true;
  };
  absl::Status watched = client.WatchJob(job_id, print_new);
  if (!print_status.ok()) return Fail(print_status);
  if (!watched.ok()) return Fail(watched);
  return last.state() == weft::v1::SUCCEEDED ? 0 : 1;
}

// A machine id (32 hex digits) cut to its first 12, as `git log` shortens hashes; other host ids
// (names given with --host-id) in full.
std::string ShortHostId(const std::string& host_id) {
  const bool machine_id =
      host_id.size() == 32 && std::all_of(host_id.begin(), host_id.end(), absl::ascii_isxdigit);
  return machine_id ? host_id.substr(0, 12) : host_id;
}

// Where a worker's collectives listen and the NCCL variables it runs with.
std::string NetworkOf(const v1::WorkerInfo& info) {
  std::vector<std::string> parts;
  if (!info.address().empty()) parts.push_back(info.address());
  std::map<std::string, std::string> sorted(info.comm().nccl_env().begin(),
                                            info.comm().nccl_env().end());
  for (const auto& [name, value] : sorted) parts.push_back(absl::StrCat(name, "=", value));
  return parts.empty() ? std::string(kNone) : absl::StrJoin(parts, " ");
}

int Workers(CoordinatorClient& client, const GlobalOptions& global) {
  absl::StatusOr<std::vector<v1::WorkerStatus>> workers = client.ListWorkers();
  if (!workers.ok()) return Fail(workers.status());
  if (global.json()) {
    return PrintListJson(std::move(*workers), &weft::v1::ListWorkersResponse::mutable_workers);
  }
  std::vector<std::vector<std::string>> rows = {
      {"WORKER ID", "HOST", "HOST ID", "DEVICE", "STATE", "JOB", "GEN", "RANK", "HEARTBEAT",
       "NETWORK", "REASON"}};
  for (const v1::WorkerStatus& w : *workers) {
    const auto& info = w.info();
    std::string device =
        absl::StrCat(absl::AsciiStrToLower(ShortEnumName(
                         weft::v1::DeviceKind_Name(info.device_kind()), "DEVICE_KIND_")),
                     ":", info.device_index());
    if (!info.gpu_model().empty()) absl::StrAppend(&device, " ", info.gpu_model());
    const bool busy = w.state() == weft::v1::WORKER_BUSY;
    rows.push_back({info.worker_id(), info.host(), ShortHostId(info.host_id()), device,
                    ShortEnumName(weft::v1::WorkerState_Name(w.state()), "WORKER_"),
                    busy ? w.job_id() : kNone, busy ? absl::StrCat(w.generation()) : kNone,
                    busy ? absl::StrCat(w.rank()) : kNone,
                    HasTime(w.last_heartbeat_time())
                        ? absl::StrCat(AgeOf(w.last_heartbeat_time()), " ago")
                        : kNone,
                    NetworkOf(info), w.reason()});
  }
  PrintTable(rows);
  return 0;
}

struct SampleFlags {
  std::string prompt;
  std::vector<std::string> prompt_words;  // PROMPT...: the same as --prompt, words joined
  std::string model_path;
  model_io::SampleOptions options;
  ChatSampleFlags chat;

  std::string Prompt() const {
    return prompt_words.empty() ? prompt : absl::StrJoin(prompt_words, " ");
  }
};

// Where the trained model of `job_id` (the file rank 0 wrote) is, if this machine can read it.
absl::StatusOr<std::string> JobModelPath(CoordinatorClient& client, const std::string& job_id) {
  auto job = client.GetJob(job_id);
  if (!job.ok()) return job.status();
  const JobStatus& s = job->status();
  if (s.model_path().empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no trained model yet (state ", StateName(s.state()),
        "); a job writes its model when it SUCCEEDS"));
  }
  if (::access(s.model_path().c_str(), R_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "the model of job ", job_id, " is at ", s.model_host(), ":", s.model_path(),
        ", which this machine cannot read; copy it here and pass the file instead"));
  }
  return s.model_path();
}

// Loads the job's trained model and continues the prompt here, in text when the model records
// its tokenizer (bytes or SentencePiece), in token ids otherwise; with --chat, answers it as
// the assistant (trainctl_chat.h).
int Sample(CoordinatorClient& client, const GlobalOptions& global, const std::string& job_id,
           const SampleFlags& flags) {
  std::string path = flags.model_path;
  if (path.empty()) {
    auto job_path = JobModelPath(client, job_id);
    if (!job_path.ok()) return Fail(job_path.status());
    path = *job_path;
  }
  auto model = model_io::LoadModel(path);
  if (!model.ok()) return Fail(model.status());
  const std::string prompt = flags.Prompt();
  if (flags.chat.chat) {
    return SampleChat(*model, job_id, path, flags.chat, prompt, flags.options, global.json());
  }
  auto text = model_io::GenerateText(*model, prompt, flags.options);
  if (!text.ok()) return Fail(text.status());
  if (global.json()) {
    const std::string tokenizer =
        model->tokenizer != nullptr ? std::string(model->tokenizer->kind()) : "none";
    PrintJsonObject({{"job_id", job_id}, {"model_path", path}, {"tokenizer", tokenizer},
                     {"prompt", prompt}, {"text", *text}});
  } else if (model->tokenizer == nullptr) {
    std::cout << prompt << (prompt.empty() ? "" : " ") << *text << "\n";
  } else {
    std::cout << prompt << *text << "\n";
  }
  return 0;
}

void AddGlobalOptions(CLI::App& app, GlobalOptions* global) {
  app.add_option("--coordinator", global->coordinator, "Coordinator address host:port")
      ->envname("WEFT_COORDINATOR")
      ->capture_default_str();
  app.add_option("--checkpointd", global->checkpointd, "weft-checkpointd address host:port")
      ->envname("WEFT_CHECKPOINTD")
      ->capture_default_str();
  app.add_option("-o,--output", global->output,
                 "Output format: text, or json (one object per answer, one per line while "
                 "following; errors stay on stderr)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app.add_option("--timeout-s", global->timeout_s, "Deadline of each call in seconds")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  AddSecurityFlags(app, &global->security);
}

CLI::App* AddSampleCommand(CLI::App& app, std::string* job_id, SampleFlags* flags) {
  CLI::App* sample =
      app.add_subcommand("sample", "Generate text from a finished job's trained model");
  sample->add_option("JOB", *job_id, "Job id")->required();
  CLI::Option* prompt_words = sample->add_option(
      "PROMPT", flags->prompt_words,
      "Text to continue, or with --chat the user's message (the same as --prompt)");
  sample->add_option("--prompt", flags->prompt,
                     "Text to continue (token ids if the model records no tokenizer)")
      ->excludes(prompt_words);
  sample->add_option("--tokens", flags->options.tokens, "Tokens to generate")
      ->capture_default_str();
  sample->add_option("--temperature", flags->options.temperature, "0 picks the most likely token")
      ->capture_default_str();
  sample->add_option("--top-k", flags->options.top_k, "Sample among the k most likely (0: all)")
      ->capture_default_str();
  sample->add_option("--seed", flags->options.seed, "Sampling seed")->capture_default_str();
  sample->add_option("--model", flags->model_path,
                     "Model file to use instead of the job's (model.safetensors)");
  flags->chat.AddTo(sample);
  return sample;
}

// After a failed parse: "unknown subcommand 'X' ..." when a command that takes a subcommand got
// a word that is none of them (with the closest name, if one is close), else "".
std::string UnknownSubcommand(const CLI::App& app) {
  const CLI::App* command = &app;
  std::string path = "trainctl";  // app.get_name() is argv[0] as run
  for (bool deeper = true; deeper;) {
    deeper = false;
    for (const CLI::App* sub : command->get_subcommands({})) {
      if (sub->parsed()) {
        command = sub;
        absl::StrAppend(&path, " ", sub->get_name());
        deeper = true;
        break;
      }
    }
  }
  std::vector<std::string> names;
  for (const CLI::App* sub : command->get_subcommands({})) names.push_back(sub->get_name());
  if (names.empty()) return "";
  // A word a subcommand does not take falls through to its parents (app.fallthrough()).
  for (const std::string& word : app.remaining(true)) {
    if (word.empty() || word[0] == '-') continue;
    std::string message = absl::StrCat("unknown subcommand '", word, "' of ", path);
    if (const std::string closest = ClosestName(word, names); !closest.empty()) {
      absl::StrAppend(&message, "; did you mean '", closest, "'?");
    } else {
      absl::StrAppend(&message, "; `", path, " --help` lists them");
    }
    return message;
  }
  return "";
}

int Main(int argc, char** argv) {
  CLI::App app{"trainctl: submit, inspect and cancel Weft training jobs"};
  app.require_subcommand(1);
  // Global options may also follow the subcommand (`trainctl list -o json`).
  app.fallthrough();
  GlobalOptions global;
  AddGlobalOptions(app, &global);

  std::string spec_path;
  CLI::App* submit = app.add_subcommand("submit", "Submit a job spec (text-format JobSpec)");
  submit->add_option("FILE", spec_path, "Job spec file (*.pb.txt)")->required();
  std::string resume_from;
  submit->add_option("--resume-from", resume_from,
                     "Start from the latest checkpoint of this job (sets resume_from_job)");

  std::string job_id;
  CLI::App* status = app.add_subcommand("status", "Show one job: spec, state, metrics, events");
  status->add_option("JOB", job_id, "Job id")->required();

  std::vector<std::string> states;
  int limit = 0;
  CLI::App* list = app.add_subcommand("list", "List jobs, newest first");
  list->add_option("--state", states, "Only jobs in these states (repeat or comma-separate)")
      ->delimiter(',');
  list->add_option("--limit", limit, "At most this many jobs (0: the coordinator's default)")
      ->check(CLI::NonNegativeNumber);

  std::string reason;
  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a job that has not ended");
  cancel->add_option("JOB", job_id, "Job id")->required();
  cancel->add_option("--reason", reason, "Recorded in the job's events");

  CLI::App* watch = app.add_subcommand(
      "watch", "Follow a job until it ends; exit 0 if it SUCCEEDED, 1 otherwise");
  watch->add_option("JOB", job_id, "Job id")->required();

  bool follow = false;
  CLI::App* events = app.add_subcommand(
      "events", "A job's transitions with time and reason (failures, recoveries, checkpoints)");
  events->add_option("JOB", job_id, "Job id")->required();
  events->add_flag("-f,--follow", follow,
                   "Keep printing new events until the job ends (exit 0 if it SUCCEEDED)");

  LogsFlags logs_flags;
  CLI::App* logs = app.add_subcommand(
      "logs", "What a job's ranks logged (lines kept by the coordinator; times in UTC)");
  logs->add_option("JOB", job_id, "Job id")->required();
  logs->add_option("--rank", logs_flags.rank, "Only this rank's lines")
      ->check(CLI::NonNegativeNumber);
  logs->add_flag("-f,--follow", logs_flags.follow,
                 "Keep printing new lines until the job ends (exit 0 if it SUCCEEDED)");

  CLI::App* workers = app.add_subcommand("workers", "List registered workers");

  SampleFlags sample_flags;
  CLI::App* sample = AddSampleCommand(app, &job_id, &sample_flags);

  CheckpointCommands checkpoint_commands(&app);
  DataCommands data_commands(&app);
  ModelCommands model_commands(&app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 reports a mistyped subcommand only as "A subcommand is required".
    if (std::string unknown = UnknownSubcommand(app); !unknown.empty()) {
      return Fail(absl::InvalidArgumentError(unknown));
    }
    return app.exit(e);
  }
  if (absl::Status s = InstallSecurity(global.security); !s.ok()) return Fail(s);

  // Data commands are local work: no daemon is involved.
  if (data_commands.Parsed()) return data_commands.Run(global.json());
  // Checkpoint commands talk to weft-checkpointd only: a bad --coordinator must not stop them.
  ClientOptions options;
  options.rpc_timeout = absl::Seconds(global.timeout_s);
  if (checkpoint_commands.Parsed()) {
    return checkpoint_commands.Run(
        global.checkpointd, global.json(), absl::Seconds(global.timeout_s),
        [&](const std::string& job_id) -> absl::Status {
          WEFT_RETURN_IF_ERROR(CheckHostPort(global.coordinator, "--coordinator"));
          ClientOptions fail_fast = options;
          fail_fast.reconnect_wait = absl::ZeroDuration();  // only a hint: do not wait for it
          return CoordinatorClient(global.coordinator, fail_fast).GetJob(job_id).status();
        });
  }
  // Model commands work on local files; only a job's model needs the coordinator.
  if (model_commands.Parsed()) {
    return model_commands.Run(global.json(), [&](const std::string& job_id)
                                                 -> absl::StatusOr<std::string> {
      WEFT_RETURN_IF_ERROR(CheckHostPort(global.coordinator, "--coordinator"));
      CoordinatorClient client(global.coordinator, options);
      return JobModelPath(client, job_id);
    });
  }
  if (absl::Status ok = CheckHostPort(global.coordinator, "--coordinator"); !ok.ok()) {
    return Fail(ok);
  }
  CoordinatorClient client(global.coordinator, options);

  if (submit->parsed()) return Submit(client, global, spec_path, resume_from);
  if (status->parsed()) return Status(client, global, job_id);
  if (list->parsed()) return List(client, global, states, limit);
  if (cancel->parsed()) return Cancel(client, global, job_id, reason);
  if (watch->parsed()) return Watch(client, global, job_id);
  if (workers->parsed()) return Workers(client, global);
  if (events->parsed()) return Events(client, global, job_id, follow);
  if (logs->parsed()) return Logs(client, global.json(), job_id, logs_flags);
  if (sample->parsed()) return Sample(client, global, job_id, sample_flags);
  return Fail(absl::InvalidArgumentError("no subcommand"));
}

}  // namespace
}  // namespace weft::trainctl

int main(int argc, char** argv) { return weft::trainctl::Main(argc, argv); }
