// RocksDB's informational log, into the daemon's spdlog log instead of a LOG file in the data
// directory. On a full disk Debian's RocksDB 7.8 (built with assertions) aborts the process at
// the LOG file's next append after a failed one (`sync_without_flush_called_`), and RocksDB
// logs while opening, so a daemon could not even start again on that disk. The coordinator's
// state database and checkpointd's store both set it as `Options::info_log`.
#ifndef WEFT_COMMON_ROCKSDB_LOG_H_
#define WEFT_COMMON_ROCKSDB_LOG_H_

#include <memory>
#include <string>

#include "rocksdb/env.h"

namespace weft {

// Lines are prefixed "`what`: ". RocksDB's chatter (option dumps, flushes, statistics) goes
// to debug; its warnings and errors stay visible as such.
std::shared_ptr<rocksdb::Logger> NewRocksDbLogger(std::string what);

}  // namespace weft

#endif  // WEFT_COMMON_ROCKSDB_LOG_H_
