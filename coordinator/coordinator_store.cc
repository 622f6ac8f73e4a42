// The generations' stores as the Store service sees them (Coordinator::GenerationStore,
// StoreForKey, WaitForKeys): a store per (job, generation), ABORTED once the generation ended.
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/coordinator.h"

namespace weft::coordinator {

absl::StatusOr<std::shared_ptr<MemoryStore>> Coordinator::GenerationStore(
    const weft::v1::StoreScope& scope) {
  absl::MutexLock lock(&mu_);
  auto found = jobs_.Find(scope.job_id(), "scope.job_id");
  if (!found.ok()) return found.status();
  JobRecord& rec = **found;
  if (Generation* gen = rec.ActiveGeneration(scope.generation())) return gen->store();
  if (scope.generation() >= 1 && scope.generation() <= rec.job.status().generation()) {
    return absl::AbortedError(absl::StrCat("generation ", scope.generation(), " of job ",
                                           scope.job_id(), " has ended"));
  }
  return absl::NotFoundError(absl::StrCat("scope.generation: job ", scope.job_id(),
                                          " has no generation ", scope.generation(),
                                          " (current: ", rec.job.status().generation(), ")"));
}

absl::Status Coordinator::CheckStoreKey(const std::string& key, const char* field) {
  if (key.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  if (key.size() > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": longer than 4096 bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<MemoryStore>> Coordinator::StoreForKey(
    const weft::v1::StoreScope& scope, const std::string& key) {
  if (absl::Status s = CheckStoreKey(key, "key"); !s.ok()) return s;
  return GenerationStore(scope);
}

void Coordinator::WaitForKeys(const weft::v1::StoreScope& scope,
                              const std::vector<std::string>& keys, int64_t timeout_ms,
                              absl::Time deadline, Done<weft::v1::StoreWaitResponse> done) {
  absl::Status check = keys.empty() ? absl::InvalidArgumentError("keys: at least one required")
                                    : absl::OkStatus();
  for (size_t i = 0; i < keys.size() && check.ok(); ++i) check = CheckStoreKey(keys[i], "keys[]");
  if (timeout_ms < 0) {
    check = absl::InvalidArgumentError(absl::StrCat("timeout_ms: must be >= 0, got ", timeout_ms));
  }
  auto store = check.ok() ? GenerationStore(scope)
                          : absl::StatusOr<std::shared_ptr<MemoryStore>>(check);
  if (!store.ok()) return done(store.status());
  if (timeout_ms > 0) deadline = std::min(deadline, absl::Now() + absl::Milliseconds(timeout_ms));
  using WaitCall = ParkedCall<weft::v1::StoreWaitResponse>;
  auto wait_id = std::make_shared<std::atomic<uint64_t>>(0);
  const absl::Time started = absl::Now();
  // The store has its own lock: no guard; the key waiter and the deadline race through Take.
  auto call = WaitCall::Park(
      timer_, /*guard=*/nullptr, deadline, std::move(done),
      [s = *store, keys, wait_id, started](const WaitCall&) -> absl::StatusOr<weft::v1::StoreWaitResponse> {
        if (uint64_t id = wait_id->load(); id != 0) s->CancelWait(id);
        return absl::DeadlineExceededError(absl::StrCat(
            "store wait timed out after ", absl::FormatDuration(absl::Now() - started),
            "; missing keys: ", absl::StrJoin(s->Missing(keys), ", ")));
      });
  const uint64_t id = (*store)->WhenAll(keys, [call](absl::Status s) {
    if (auto answer = call->Take()) {
      if (s.ok()) {
        answer(weft::v1::StoreWaitResponse());
      } else {
        answer(s);
      }
    }
  });
  *wait_id = id;
  // A deadline that fired before the id was known could not cancel the waiter: do it here, or
  // it would stay in the store until its keys came or the generation closed.
  if (call->Answered()) (*store)->CancelWait(id);
}

}  // namespace weft::coordinator
