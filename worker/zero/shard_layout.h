// How ZeRO splits a model over the ranks of a world: pure arithmetic over the units' sizes,
// shared by both engines (worker/zero/zero_cpu.h, worker/zero/zero_cuda.h), the GPU memory planner
// and checkpoint slicing, so that all of them agree on every offset by construction.
//
// Every unit (a flat buffer of `size` elements; see engine::ModelArch in
// worker/engine/model_arch.h) is padded with
// zeros to a multiple of the world size and split into `world` equal shards; rank r owns shard
// r. The padding is never trained (it holds zeros and receives zero gradient) and never
// checkpointed: checkpoints speak of the unpadded elements only, so any world size reads them.
#ifndef WEFT_WORKER_ZERO_SHARD_LAYOUT_H_
#define WEFT_WORKER_ZERO_SHARD_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace weft::zero {

// Elements [begin, end) of a unit's unpadded flat space.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ShardRange&) const = default;
};

// A shard cut into `count` equal pieces, piece `index` the rank's own: with hybrid sharding one
// piece per replica, the replica's rank its index, which the replica reduce-scatter of
// replica_optimizer OPTIMIZER_SHARDED leaves summed (and whose sums of squares add up the
// gradient norm alike in both optimizer modes). Units are then padded to a multiple of
// world * count * align, so that a piece is a whole number of `align`-value blocks
// (comm/wire_codec.h's chunks, kWireBlock).
struct ShardPieces {
  int count = 1;
  int index = 0;
  size_t align = 1;
};

struct UnitShard {
  size_t size = 0;    // elements in the unit
  size_t padded = 0;  // size rounded up to a multiple of the world size
  size_t shard = 0;   // padded / world: elements of every rank's shard
  // What this rank's shard covers of the unpadded unit: rank * shard onward, clipped to the
  // unit (empty for a rank whose whole shard is padding).
  ShardRange owned;
  // shard / pieces: the rank's piece, from `piece_offset` of its shard on (the whole shard
  // with one piece); `owned_piece` what it covers of the unit.
  size_t piece = 0;
  size_t piece_offset = 0;
  ShardRange owned_piece;
};

class ShardLayout {
 public:
  // `unit_sizes` in unit order (unit 0 the head, 1 + l block l). world >= 1, 0 <= rank < world;
  // pieces.count >= 1, 0 <= pieces.index < pieces.count, pieces.align >= 1.
  ShardLayout(const std::vector<size_t>& unit_sizes, int world, int rank,
              ShardPieces pieces = {});

  int world() const { return world_; }
  int rank() const { return rank_; }
  int num_units() const { return static_cast<int>(units_.size()); }
  int pieces() const { return pieces_; }
  const UnitShard& unit(int u) const { return units_[u]; }

  // The largest padded block (units 1 and up; 0 without blocks): the size of the working
  // buffers a block is gathered into.
  size_t max_block_padded() const { return max_block_padded_; }
  // The largest shard of any unit.
  size_t max_shard() const { return max_shard_; }
  // Sum of every unit's shard: the elements of one per-rank state array (params, m, v, ...).
  size_t total_shard() const { return total_shard_; }

  // The elements a rank keeps of unit `u` at ZeRO `stage`: the whole padded unit at stage 0
  // (it owns everything), its shard at stages 1-3.
  size_t KeptElements(int u, int stage) const;
  // The unpadded range a rank keeps at `stage` (stage 0: the whole unit), the range it loads
  // from a checkpoint.
  ShardRange KeptRange(int u, int stage) const;

 private:
  int world_;
  int rank_;
  int pieces_;
  std::vector<UnitShard> units_;
  size_t max_block_padded_ = 0;
  size_t max_shard_ = 0;
  size_t total_shard_ = 0;
};

}  // namespace weft::zero

#endif  // WEFT_WORKER_ZERO_SHARD_LAYOUT_H_
