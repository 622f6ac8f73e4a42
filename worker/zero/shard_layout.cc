#include "worker/zero/shard_layout.h"

#include <algorithm>

namespace weft::zero {

ShardLayout::ShardLayout(const std::vector<size_t>& unit_sizes, int world, int rank,
                         ShardPieces pieces)
    : world_(world), rank_(rank), pieces_(pieces.count) {
  const size_t w = static_cast<size_t>(world);
  const size_t p = static_cast<size_t>(pieces.count);
  // One piece: padded to a multiple of the world alone, whatever the alignment.
  const size_t multiple = p > 1 ? w * p * pieces.align : w;
  units_.reserve(unit_sizes.size());
  const auto clipped = [](int64_t first, size_t count, int64_t n) {
    return ShardRange{std::min(first, n), std::min(first + static_cast<int64_t>(count), n)};
  };
  for (size_t u = 0; u < unit_sizes.size(); ++u) {
    UnitShard s;
    s.size = unit_sizes[u];
    s.padded = (s.size + multiple - 1) / multiple * multiple;
    s.shard = s.padded / w;
    s.piece = s.shard / p;
    s.piece_offset = static_cast<size_t>(pieces.index) * s.piece;
    const auto n = static_cast<int64_t>(s.size);
    const auto first = static_cast<int64_t>(static_cast<size_t>(rank) * s.shard);
    s.owned = clipped(first, s.shard, n);
    s.owned_piece = clipped(first + static_cast<int64_t>(s.piece_offset), s.piece, n);
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
