// Process-wide logging setup (spdlog). Components log through spdlog's default logger.
#ifndef WEFT_COMMON_LOGGING_H_
#define WEFT_COMMON_LOGGING_H_

#include <string>

#include "absl/status/status.h"

namespace weft {

// Logs to stderr as "<time> <component> <level> message". `level` is one of trace, debug,
// info, warn, error; INVALID_ARGUMENT naming --log-level otherwise.
absl::Status InitLogging(const std::string& component, const std::string& level);

}  // namespace weft

#endif  // WEFT_COMMON_LOGGING_H_
