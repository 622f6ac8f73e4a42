#include "common/logging.h"

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace weft {

absl::Status InitLogging(const std::string& component, const std::string& level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-level: \"", level, "\" is not one of trace, debug, info, warn, error, off"));
  }
  auto logger = spdlog::stderr_color_mt(component);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %n %l %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace weft
