// Conversions between absl::Time and google.protobuf.Timestamp.
#ifndef WEFT_COMMON_TIME_UTIL_H_
#define WEFT_COMMON_TIME_UTIL_H_

#include "absl/time/time.h"
#include "google/protobuf/timestamp.pb.h"

namespace weft {

inline void ToProtoTime(absl::Time t, google::protobuf::Timestamp* out) {
  const int64_t ns = absl::ToUnixNanos(t);
  out->set_seconds(ns / 1000000000);
  out->set_nanos(static_cast<int32_t>(ns % 1000000000));
}

inline absl::Time FromProtoTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

}  // namespace weft

#endif  // WEFT_COMMON_TIME_UTIL_H_
