// Collectives over a RANGE of a flat array that is split into equal blocks over the ranks:
// rank r owns elements [r * block, (r + 1) * block), as ZeRO shards a unit
// (worker/zero/shard_layout.h). The GPU engine gathers and reduces parts of its head unit this way
// (the embedding apart from the final norm and LM head), so that neither is resident while
// the other works.
//
// A rank's part of the range is the intersection of its block with it. The parts are uneven,
// and a short range has few owners, so a range collective is one Broadcast (gather) or Reduce
// (reduce-scatter) per owning rank, in rank order: every rank enqueues the same sequence.
// Through a ring, Σ parts moves about as many bytes as one all-gather or reduce-scatter of the
// range would.
#ifndef WEFT_WORKER_COMM_RANGE_COLLECTIVES_H_
#define WEFT_WORKER_COMM_RANGE_COLLECTIVES_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "worker/comm/communicator.h"

namespace weft::comm {

// One owner's part of a range.
struct RangePart {
  int rank = 0;
  size_t offset = 0;  // elements from the start of the range
  size_t count = 0;   // > 0
  bool operator==(const RangePart&) const = default;
};

// The ranks owning some of [begin, end) when rank r of `world` owns [r * block, (r+1) * block),
// in rank order, with their parts; elements past world * block have no owner. block > 0.
std::vector<RangePart> RangeParts(size_t begin, size_t end, size_t block, int world);

// This rank's part of [begin, end) (count 0 if it owns none).
RangePart OwnPart(size_t begin, size_t end, size_t block, int world, int rank);

// Every rank's `recv` (end - begin elements) gets the whole range: each owner broadcasts its
// part from where the part lies in its own `recv`, where the caller has written it. The Work
// completes when every broadcast has.
std::shared_ptr<Work> AllGatherRange(Communicator& comm, void* recv, size_t begin, size_t end,
                                     size_t block, DataType type);

// SUM: `send` holds the range (end - begin elements) on every rank; this rank's `recv` gets
// the sum of its own part only (OwnPart's count elements; untouched if it owns none). `send`
// is not modified, except in place: `recv` may be this rank's part of `send` (send + the
// part's offset), and then only that part changes.
std::shared_ptr<Work> ReduceScatterRange(Communicator& comm, const void* send, void* recv,
                                         size_t begin, size_t end, size_t block, DataType type);

}  // namespace weft::comm

#endif  // WEFT_WORKER_COMM_RANGE_COLLECTIVES_H_
