#include "worker/zero/shard_layout.h"

#include <algorithm>

namespace weft::zero {

ShardLayout::ShardLayout(const std::vector<size_t>& unit_sizes, int world, int rank)
    : world_(world), rank_(rank) {
  const size_t w = static_cast<size_t>(world);
  units_.reserve(unit_sizes.size());
  for (size_t u = 0; u < unit_sizes.size(); ++u) {
    UnitShard s;
    s.size = unit_sizes[u];
    s.padded = (s.size + w - 1) / w * w;
    s.shard = s.padded / w;
    const auto n = static_cast<int64_t>(s.size);
    const auto first = static_cast<int64_t>(static_cast<size_t>(rank) * s.shard);
    s.owned = {std::min(first, n), std::min(first + static_cast<int64_t>(s.shard), n)};
    if (u > 0) max_block_padded_ = std::max(max_block_padded_, s.padded);
    max_shard_ = std::max(max_shard_, s.shard);
    total_shard_ += s.shard;
    units_.push_back(s);
  }
}

size_t ShardLayout::KeptElements(int u, int stage) const {
  return stage == 0 ? units_[u].padded : units_[u].shard;
}

ShardRange ShardLayout::KeptRange(int u, int stage) const {
  return stage == 0 ? ShardRange{0, static_cast<int64_t>(units_[u].size)} : units_[u].owned;
}

}  // namespace weft::zero
