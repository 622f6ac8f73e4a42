#include "common/rocksdb_log.h"

#include <cstdarg>
#include <cstdio>
#include <utility>

#include "spdlog/spdlog.h"

namespace weft {
namespace {

class SpdlogRocksLogger final : public rocksdb::Logger {
 public:
  explicit SpdlogRocksLogger(std::string what)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), what_(std::move(what)) {}
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap);
  }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    using rocksdb::InfoLogLevel;
    const spdlog::level::level_enum to = level >= InfoLogLevel::ERROR_LEVEL ? spdlog::level::err
                                         : level == InfoLogLevel::WARN_LEVEL ? spdlog::level::warn
                                                                             : spdlog::level::debug;
    if (!spdlog::should_log(to)) return;
    va_list copy;
    va_copy(copy, ap);
    const int n = std::vsnprintf(nullptr, 0, format, copy);
    va_end(copy);
    if (n <= 0) return;
    std::string text(static_cast<size_t>(n) + 1, '\0');
    std::vsnprintf(text.data(), text.size(), format, ap);
    text.resize(static_cast<size_t>(n));
    spdlog::log(to, "{}: {}", what_, text);
  }

 private:
  const std::string what_;
};

}  // namespace

std::shared_ptr<rocksdb::Logger> NewRocksDbLogger(std::string what) {
  return std::make_shared<SpdlogRocksLogger>(std::move(what));
}

}  // namespace weft
