// Context on a failing status: "<context>: <what went wrong below>".
//
// A status that crosses a layer names what failed there ("NCCL rank 3: store: deadline
// exceeded", "data.tokenizer_path: /x: no such file"); its code stays the one the failure had,
// because callers branch on the code (ABORTED ends a generation, UNAVAILABLE is retried) and a
// layer that only adds where it happened must not change what it means. Kept apart from
// common/status.h, which every file includes, so that this header's users alone depend on it.
#ifndef WEFT_COMMON_STATUS_CONTEXT_H_
#define WEFT_COMMON_STATUS_CONTEXT_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status.h"

namespace weft {

// OK stays OK. Otherwise a status of the same code whose message is
// "<context>: <status.message()>" (the ": " is there even when either side is empty, so a
// message reads the same wherever it was built), carrying the same payloads.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  status.ForEachPayload([&annotated](absl::string_view type_url, const absl::Cord& payload) {
    annotated.SetPayload(type_url, payload);
  });
  return annotated;
}

}  // namespace weft

// Evaluates `expr` (an absl::Status); if not OK, returns it from the enclosing function
// annotated with `context` (anything an absl::string_view binds to, e.g. an absl::StrCat),
// which is evaluated only then.
#define WEFT_RETURN_IF_ERROR_CONTEXT(expr, context)                          \
  do {                                                                       \
    ::absl::Status weft_context_status_ = (expr);                            \
    if (!weft_context_status_.ok()) {                                        \
      return ::weft::Annotate(weft_context_status_, (context));              \
    }                                                                        \
  } while (0)

// `lhs` = value of `rexpr` (an absl::StatusOr<T>), or return its status annotated with
// `context` (evaluated only then). `lhs` may be a declaration, as in WEFT_ASSIGN_OR_RETURN.
#define WEFT_ASSIGN_OR_RETURN_CONTEXT(lhs, rexpr, context)                                   \
  WEFT_ASSIGN_OR_RETURN_CONTEXT_IMPL_(WEFT_STATUS_CONCAT_(weft_context_statusor_, __LINE__), \
                                      lhs, rexpr, context)
#define WEFT_ASSIGN_OR_RETURN_CONTEXT_IMPL_(statusor, lhs, rexpr, context)           \
  auto statusor = (rexpr);                                                            \
  if (!statusor.ok()) return ::weft::Annotate(std::move(statusor).status(), (context)); \
  lhs = std::move(statusor).value()

#endif  // WEFT_COMMON_STATUS_CONTEXT_H_
