#include "checkpointd/decisions.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/message_differencer.h"

namespace weft::checkpointd {
namespace {

using weft::v1::CheckpointManifest;
using weft::v1::ShardHeader;
using weft::v1::TensorLayout;

Verdict Refuse(std::string reason) { return Verdict{false, std::move(reason)}; }

const TensorLayout* FindTensor(const CheckpointManifest& manifest, const std::string& name) {
  auto it = std::find_if(manifest.tensors().begin(), manifest.tensors().end(),
                         [&](const TensorLayout& t) { return t.name() == name; });
  return it == manifest.tensors().end() ? nullptr : &*it;
}

std::string NotListed(int rank, const std::string& tensor) {
  return absl::StrCat("rank ", rank, " wrote tensor ", tensor, " that the manifest does not list");
}

// One tensor's ranges, sorted: the first element that is not covered exactly once, if any.
Verdict CheckOneTensor(const std::string& name, int64_t numel,
                       std::vector<std::tuple<int64_t, int64_t, int>> ranges) {
  const std::string what = absl::StrCat("tensor ", name, ": the ranks' ranges do not cover [0, ",
                                        numel, ") exactly once");
  std::sort(ranges.begin(), ranges.end());
  int64_t next = 0;
  for (const auto& [begin, end, rank] : ranges) {
    if (end > numel) {
      return Refuse(absl::StrCat(what, " (rank ", rank, "'s range [", begin, ", ", end,
                                 ") runs past the end)"));
    }
    if (begin > next) return Refuse(absl::StrCat(what, " (gap at element ", next, ")"));
    if (begin < next) {
      return Refuse(absl::StrCat(what, " (overlap at element ", begin, ", rank ", rank, ")"));
    }
    next = end;
  }
  if (next != numel) return Refuse(absl::StrCat(what, " (gap at element ", next, ")"));
  return Verdict{};
}

}  // namespace

Verdict CheckShardAgainstManifest(const CheckpointManifest& manifest, const ShardHeader& shard,
                                  int rank) {
  if (shard.world_size() != manifest.world_size()) {
    return Refuse(absl::StrCat("rank ", rank, " wrote its shard for world size ",
                               shard.world_size(), ", manifest says ", manifest.world_size()));
  }
  for (const TensorLayout& t : shard.tensors()) {
    const TensorLayout* listed = FindTensor(manifest, t.name());
    if (listed != nullptr && !google::protobuf::util::MessageDifferencer::Equals(*listed, t)) {
      return Refuse(absl::StrCat("tensor ", t.name(), ": rank ", rank,
                                 " wrote it with another dtype or shape"));
    }
  }
  for (const auto& r : shard.ranges()) {
    if (FindTensor(manifest, r.tensor()) == nullptr) return Refuse(NotListed(rank, r.tensor()));
  }
  return Verdict{};
}

Verdict CheckCoverage(const std::map<std::string, int64_t>& numels,
                      const std::vector<weft::v1::RankState>& ranks) {
  // name -> (begin, end, rank): the rank only for the reason.
  std::map<std::string, std::vector<std::tuple<int64_t, int64_t, int>>> by_tensor;
  for (const auto& state : ranks) {
    for (const auto& r : state.ranges()) {
      if (!numels.contains(r.tensor())) return Refuse(NotListed(state.rank(), r.tensor()));
      by_tensor[r.tensor()].emplace_back(r.begin(), r.end(), state.rank());
    }
  }
  for (const auto& [name, numel] : numels) {
    Verdict v = CheckOneTensor(name, numel, std::move(by_tensor[name]));
    if (!v.ok) return v;
  }
  return Verdict{};
}

RetentionDecision DecideRetention(int64_t committed_step, int keep_last,
                                  const std::vector<StoredCheckpoint>& existing) {
  RetentionDecision d;
  if (keep_last < 1) {
    d.reason = "keep last: unset, every checkpoint kept";
    return d;
  }
  std::vector<int64_t> kept = {committed_step}, pinned;
  for (const StoredCheckpoint& c : existing) {
    // Newer checkpoints than the one committed (a job that went back to an older step) are
    // kept and counted, so that they are never the victims of an older step's commit.
    if (c.step > committed_step || kept.size() < static_cast<size_t>(keep_last)) {
      kept.push_back(c.step);
    } else if (c.pinned) {
      pinned.push_back(c.step);
    } else {
      d.victims.push_back(c.step);
    }
  }
  std::sort(kept.rbegin(), kept.rend());
  d.reason = absl::StrCat("keep last ", keep_last, ": keeping ", absl::StrJoin(kept, ", "));
  if (!pinned.empty()) absl::StrAppend(&d.reason, "; pinned: ", absl::StrJoin(pinned, ", "));
  absl::StrAppend(&d.reason, "; deleting ",
                  d.victims.empty() ? std::string("none") : absl::StrJoin(d.victims, ", "));
  return d;
}

Verdict CheckDiskSpace(const std::string& what, int64_t write_bytes, int64_t keep_free_bytes,
                       const DiskSpace& disk) {
  const int64_t needed = write_bytes + disk.promised_bytes + keep_free_bytes;
  if (disk.free_bytes >= needed) return Verdict{};
  std::string parts = absl::StrCat(write_bytes, " to write");
  if (disk.promised_bytes > 0) {
    absl::StrAppend(&parts, ", ", disk.promised_bytes, " promised to shards being written");
  }
  absl::StrAppend(&parts, ", ", keep_free_bytes, " kept free for the store's own files");
  return Refuse(absl::StrCat("no room on the checkpoint store's disk for ", what, ": ",
                             disk.free_bytes, " bytes free, ", needed, " needed (", parts,
                             "); delete checkpoints (trainctl checkpoint delete) or free the "
                             "disk"));
}

}  // namespace weft::checkpointd
