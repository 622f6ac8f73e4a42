#include "worker/zero/zero_cpu.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "spdlog/spdlog.h"
#include "worker/comm/wire_codec.h"
#include "worker/engine/adamw.h"
#include "worker/engine/checkpointing.h"
#include "worker/zero/sharding_groups.h"

namespace weft::zero {
namespace {

using comm::DataType;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void AddInto(float* dst, const float* src, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

// The process besides the engine, model and checkpointer (code, gRPC, the data readers' buffers,
// thread stacks); an idle weft-worker's resident set is well below it.
constexpr size_t kProcessReserveBytes = size_t{128} << 20;

// How many ranks of the world refused to build their engine: every rank's 0 or 1 summed over
// the group, then over the replicas. A barrier too (see Create).
absl::StatusOr<int> CountRefusals(comm::Communicator* group, comm::Communicator* replica,
                                  bool refused) {
  float flag = refused ? 1.0f : 0.0f;
  for (comm::Communicator* c : {group, replica}) {
    if (c == nullptr || c->world_size() == 1) continue;
    WEFT_RETURN_IF_ERROR(c->AllReduce(&flag, 1, DataType::kFloat32)->Wait());
  }
  return static_cast<int>(std::lround(flag));
}

}  // namespace

CpuMemoryPlan PlanCpuMemory(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                            const engine::cpu::CpuModelEntry& model, engine::Checkpointing level,
                            int micro_batch_size, int group, int stage, bool writes_checkpoints,
                            ShardPieces pieces, bool shards_moments) {
  // Every rank keeps as much as rank 0 (shards are padded to equal sizes), which owns a whole
  // shard of every unit, so its layout speaks for all.
  pieces.index = 0;
  const ShardLayout layout(UnitSizes(arch), group, /*rank=*/0, pieces);
  CpuMemoryPlan plan;
  size_t max_padded = 0, max_block_shard = 0;
  for (int u = 0; u < layout.num_units(); ++u) {
    const UnitShard& unit = layout.unit(u);
    // Params, grads (fp32) and the decay mask (a byte) of what the rank keeps; m and v of its
    // piece.
    const size_t kept = layout.KeptElements(u, stage);
    const size_t moments = shards_moments ? unit.piece : kept;
    plan.state_bytes += kept * (2 * sizeof(float) + sizeof(uint8_t)) + moments * 2 * sizeof(float);
    if (stage == 1 || stage == 2) plan.state_bytes += unit.padded * sizeof(float);  // resident
    if (stage <= 2) plan.state_bytes += unit.padded * sizeof(float);                // full grad
    if (writes_checkpoints) {
      plan.checkpoint_bytes += 3 * (shards_moments ? unit.piece : unit.shard) * sizeof(float);
    }
    max_padded = std::max(max_padded, unit.padded);
    if (u > 0) max_block_shard = std::max(max_block_shard, unit.shard);
  }
  const size_t head_padded = layout.unit(0).padded, head_shard = layout.unit(0).shard;
  if (stage == 3) {
    // Two block slots (current and prefetched) and the head, each gathered and with its full
    // gradient, and the reduce-scatter outputs of two blocks and the head.
    plan.working_bytes = (4 * layout.max_block_padded() + 2 * head_padded +
                          2 * (layout.max_block_padded() / layout.world()) + head_shard) *
                         sizeof(float);
  } else if (stage >= 1) {
    // The reduce-scatter outputs, grown to the largest block's shard and the head's.
    plan.working_bytes = (max_block_shard + head_shard) * sizeof(float);
  }
  const int seq_len = spec.training().sequence_length();
  const size_t positions = static_cast<size_t>(micro_batch_size) * seq_len;
  plan.working_bytes += 2 * positions * sizeof(int32_t);  // inputs and targets
  plan.working_bytes += max_padded * sizeof(float);       // GatherUnit for the model file
  // A compressed replica all-reduce's send and receive buffers (comm/wire_codec.h): the
  // largest shard's encoding each (and up to a block of padding per replica, in the reserve).
  const comm::WireFormat wire = ReplicaWireFormat(spec.sharding());
  if (wire != comm::WireFormat::kFp32 &&
      spec.sharding().scope() != weft::v1::ShardingSpec::WORLD) {
    plan.working_bytes += 2 * comm::WireBufferBytes(wire, layout.max_shard(), 1);
  }
  plan.activation_bytes = model.activation_bytes(micro_batch_size, seq_len, level);
  // Gloo's scratch for a reduce-scatter's piece and its algorithm's own buffers, each at most
  // a chunk (or the largest unit), once there is anyone to talk to (a group, or replicas,
  // which hybrid scopes have).
  if (group > 1 || spec.sharding().scope() != weft::v1::ShardingSpec::WORLD) {
    const size_t chunk = static_cast<size_t>(comm::GlooOptions().chunk_bytes);
    plan.reserve_bytes = 2 * std::min(chunk, max_padded * sizeof(float));
  }
  plan.reserve_bytes += kProcessReserveBytes;
  return plan;
}

namespace {

// What one rank of a group of `group` ranks needs of the host's memory (its share of what is
// available), planned now. `replica_rank`: the rank's place among its `replicas` (-1: none).
CpuMemoryDecision DecideOnThisHost(const weft::v1::JobSpec& spec, const engine::ModelArch& arch,
                                   const engine::cpu::CpuModelEntry& model, int group,
                                   int replicas, int replica_rank,
                                   const ZeroCpuOptions& options) {
  const bool hybrid = replica_rank >= 0;
  const int r = hybrid ? replicas : 1;
  const ShardPieces pieces = ReplicaPieces(r, std::max(replica_rank, 0));
  const bool shards_moments = ShardsOptimizer(spec.sharding(), r);
  // Checkpointer's writers (ZeroEngine::checkpoint_writers): with hybrid sharding, group 0
  // (replica rank 0) alone, unless every rank holds its own piece. Read from the spec, so a
  // worker without --checkpointd (which then saves nothing) counts them anyway.
  const bool writes_checkpoints = spec.checkpoint().interval_steps() > 0 &&
                                  (!hybrid || replica_rank == 0 || shards_moments);
  return DecideCpuMemory(
      spec.training().activation_checkpointing(),
      options.host_available_bytes.has_value() ? *options.host_available_bytes
                                               : HostAvailableBytes(),
      options.ranks_on_host, spec.training().micro_batch_size(), group, spec.zero_stage(),
      hybrid, [&](engine::Checkpointing level, int rows, int at_group, int at_stage) {
        return PlanCpuMemory(spec, arch, model, level, rows, at_group, at_stage,
                             writes_checkpoints, pieces, shards_moments);
      });
}

absl::Status CheckStage(int stage) {
  if (stage >= 0 && stage <= 3) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("zero_stage: must be in [0, 3], got ", stage));
}

}  // namespace

absl::Status ZeroCpuEngine::CheckFits(const weft::v1::JobSpec& spec, int group_size,
                                      int replicas, const ZeroCpuOptions& options) {
  WEFT_RETURN_IF_ERROR(CheckStage(spec.zero_stage()));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec.model()));
  WEFT_ASSIGN_OR_RETURN(const engine::cpu::CpuModelEntry model,
                        engine::cpu::FindCpuModel(*arch));
  // Replica rank 0 writes checkpoints: the most any rank of the replicas needs.
  const CpuMemoryDecision memory =
      DecideOnThisHost(spec, *arch, model, group_size, replicas, replicas > 1 ? 0 : -1, options);
  return memory.fits ? absl::OkStatus() : absl::ResourceExhaustedError(memory.reason);
}

absl::StatusOr<std::unique_ptr<ZeroCpuEngine>> ZeroCpuEngine::Create(
    const weft::v1::JobSpec& spec, comm::Communicator* comm, comm::Communicator* replica,
    const ZeroCpuOptions& options) {
  WEFT_RETURN_IF_ERROR(CheckStage(spec.zero_stage()));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec.model()));
  WEFT_ASSIGN_OR_RETURN(const engine::cpu::CpuModelEntry model,
                        engine::cpu::FindCpuModel(*arch));
  const bool hybrid = replica != nullptr && replica->world_size() > 1;
  const int replicas = hybrid ? replica->world_size() : 1;
  const CpuMemoryDecision memory = DecideOnThisHost(spec, *arch, model, comm->world_size(),
                                                    replicas, hybrid ? replica->rank() : -1,
                                                    options);
  const absl::Status fits =
      memory.fits ? absl::OkStatus() : absl::ResourceExhaustedError(memory.reason);
  WEFT_ASSIGN_OR_RETURN(const int refusals, CountRefusals(comm, replica, !fits.ok()));
  WEFT_RETURN_IF_ERROR(fits);
  if (refusals > 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        refusals, " other rank(s) of the job cannot build their engine (their error names "
        "the memory they lack); this one could, with ", memory.reason));
  }
  std::unique_ptr<engine::cpu::CpuModel> cpu_model = model.create(
      spec.training().micro_batch_size(), spec.training().sequence_length(), memory.level);
  std::unique_ptr<ZeroCpuEngine> engine(
      new ZeroCpuEngine(spec, comm, replica, std::move(arch), std::move(cpu_model),
                        ReplicaPieces(replicas, hybrid ? replica->rank() : 0),
                        ShardsOptimizer(spec.sharding(), replicas)));
  engine->plan_ = memory.plan;
  engine->plan_note_ = memory.reason;
  engine->Initialize();
  // Once per generation (the engine is built for each one): the level AUTO resolved to.
  spdlog::info("CPU engine, rank {} of a group of {} ({} replicas): {} (job spec {})",
               comm->rank(), comm->world_size(),
               replica != nullptr ? replica->world_size() : 1, memory.reason,
               weft::v1::ActivationCheckpointing::Level_Name(
                   spec.training().activation_checkpointing()));
  return engine;
}

ZeroCpuEngine::ZeroCpuEngine(const weft::v1::JobSpec& spec, comm::Communicator* comm,
                             comm::Communicator* replica,
                             std::unique_ptr<const engine::ModelArch> arch,
                             std::unique_ptr<engine::cpu::CpuModel> model, ShardPieces pieces,
                             bool shards_moments)
    : ZeroEngine(spec, std::move(arch), comm->world_size(), comm->rank(), pieces,
                 shards_moments),
      comm_(comm),
      replica_(replica != nullptr && replica->world_size() > 1 ? replica : nullptr),
      world_(comm->world_size() * (replica != nullptr ? replica->world_size() : 1)),
      replica_format_(replica_ != nullptr ? ReplicaWireFormat(spec.sharding())
                                          : comm::WireFormat::kFp32),
      batch_size_(spec.training().micro_batch_size()),
      seq_len_(spec.training().sequence_length()),
      model_(std::move(model)) {}

void ZeroCpuEngine::Initialize() {
  units_.resize(layout_.num_units());
  for (int u = 0; u < layout_.num_units(); ++u) {
    Unit& unit = units_[u];
    InitialUnit init = InitialState(u);
    const size_t kept = init.kept.size();
    unit.params = std::move(init.kept);
    unit.decay_mask = std::move(init.decay_mask);
    unit.grads.assign(kept, 0.0f);
    unit.m.assign(KeptStateElements(u, model_io::UnitState::kM), 0.0f);
    unit.v.assign(unit.m.size(), 0.0f);
    if (stage_ == 1 || stage_ == 2) unit.resident = std::move(init.full);
    if (stage_ <= 2) unit.full_grad.assign(layout_.unit(u).padded, 0.0f);
  }
  if (stage_ == 3) {
    const size_t max_block = layout_.max_block_padded();
    for (auto& b : block_work_) b.assign(max_block, 0.0f);
    for (auto& b : block_grad_work_) b.assign(max_block, 0.0f);
    for (auto& b : scatter_out_) b.assign(max_block / layout_.world(), 0.0f);
    head_work_.assign(layout_.unit(0).padded, 0.0f);
    head_grad_work_.assign(layout_.unit(0).padded, 0.0f);
    head_scatter_out_.assign(layout_.unit(0).shard, 0.0f);
  } else if (stage_ >= 1) {
    // The reduce-scatter outputs now rather than at the first backward, so that what the
    // memory plan counted is taken before training.
    size_t max_block_shard = 0;
    for (int u = 1; u < layout_.num_units(); ++u) {
      max_block_shard = std::max(max_block_shard, layout_.unit(u).shard);
    }
    scatter_out_[0].assign(max_block_shard, 0.0f);
    head_scatter_out_.assign(layout_.unit(0).shard, 0.0f);
  }
  inputs_.resize(static_cast<size_t>(batch_size_) * seq_len_);
  targets_.resize(inputs_.size());
  if (spec_.data().document_masking()) doc_starts_.resize(inputs_.size());
}

MicroBatch ZeroCpuEngine::Buffers() {
  return MicroBatch{inputs_.data(), targets_.data(),
                    doc_starts_.empty() ? nullptr : doc_starts_.data()};
}

void ZeroCpuEngine::SetDocuments(const MicroBatch& mb) {
  // SetShape first: it ends an inference forward (evaluation) the model may still be in.
  model_->SetShape(batch_size_, seq_len_);
  model_->SetDocuments(mb.doc_starts, spec_.data().reset_positions());
}

const float* ZeroCpuEngine::ResidentParams(int unit) const {
  return stage_ == 0 ? units_[unit].params.data() : units_[unit].resident.data();
}

float* ZeroCpuEngine::FullGrad(int unit) { return units_[unit].full_grad.data(); }

absl::Status ZeroCpuEngine::Await(const std::shared_ptr<comm::Work>& work) {
  const auto start = Clock::now();
  absl::Status s = work->Wait();
  exposed_ms_ += MsSince(start);
  return s;
}

std::shared_ptr<comm::Work> ZeroCpuEngine::GatherInto(int unit, float* dst) {
  return comm_->AllGather(units_[unit].params.data(), dst, layout_.unit(unit).shard,
                          DataType::kFloat32);
}

absl::Status ZeroCpuEngine::ReduceScatterAccumulate(int unit, float* full) {
  const size_t shard = layout_.unit(unit).shard;
  std::vector<float>& out = unit == 0 ? head_scatter_out_ : scatter_out_[0];
  if (out.size() < shard) out.resize(shard);
  WEFT_RETURN_IF_ERROR(Await(comm_->ReduceScatter(full, out.data(), shard, DataType::kFloat32)));
  AddInto(units_[unit].grads.data(), out.data(), shard);
  return absl::OkStatus();
}

absl::Status ZeroCpuEngine::AllReduceOverReplica() {
  if (replica_ == nullptr) return absl::OkStatus();
  if (shards_moments_) return ReduceScatterOverReplica();
  if (replica_format_ != comm::WireFormat::kFp32) return WireOverReplica(comm::WireAllReduce);
  std::vector<std::shared_ptr<comm::Work>> reduces;
  for (Unit& u : units_) {
    reduces.push_back(replica_->AllReduce(u.grads.data(), u.grads.size(), DataType::kFloat32));
  }
  for (auto& r : reduces) WEFT_RETURN_IF_ERROR(Await(r));
  return absl::OkStatus();
}

absl::Status ZeroCpuEngine::WireOverReplica(WireCollective collective) {
  // Blocking, unit by unit: all of it is exposed.
  const auto start = std::chrono::steady_clock::now();
  for (Unit& u : units_) {
    absl::Status s = collective(*replica_, replica_format_, u.grads.data(), u.grads.size(),
                                &wire_send_, &wire_recv_);
    if (!s.ok()) return s;
  }
  exposed_ms_ += MsSince(start);
  return absl::OkStatus();
}

absl::Status ZeroCpuEngine::ReduceScatterOverReplica() {
  // The layout's pieces are the codec's chunks (whole blocks, shard / replicas each).
  if (replica_format_ != comm::WireFormat::kFp32) return WireOverReplica(comm::WireReduceScatter);
  // Gloo's reduce-scatter writes its own buffer: the piece is copied into place after.
  std::vector<float>& out = scatter_out_[1];
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitShard& unit = layout_.unit(u);
    if (out.size() < unit.piece) out.resize(unit.piece);
    float* grads = units_[u].grads.data();
    WEFT_RETURN_IF_ERROR(Await(
        replica_->ReduceScatter(grads, out.data(), unit.piece, DataType::kFloat32)));
    std::copy(out.begin(), out.begin() + unit.piece, grads + unit.piece_offset);
  }
  return absl::OkStatus();
}

absl::Status ZeroCpuEngine::GatherPiecesOverReplica() {
  std::vector<float>& mine = scatter_out_[1];
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitShard& unit = layout_.unit(u);
    if (mine.size() < unit.piece) mine.resize(unit.piece);
    float* params = units_[u].params.data();
    std::copy(params + unit.piece_offset, params + unit.piece_offset + unit.piece, mine.data());
    WEFT_RETURN_IF_ERROR(
        Await(replica_->AllGather(mine.data(), params, unit.piece, DataType::kFloat32)));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ZeroCpuEngine::SumOfSquaresByPiece() {
  // One piece without replicas (the whole kept gradient); one per replica with them, whether
  // the rank holds every piece's sum (replicated optimizer) or only its own (sharded).
  const int pieces = layout_.pieces();
  const int units = layout_.num_units();
  // (pieces, units): piece p's sum of squares of unit u at p * units + u.
  std::vector<double> sums(static_cast<size_t>(pieces) * units, 0.0);
  for (int u = 0; u < units; ++u) {
    const std::vector<float>& g = units_[u].grads;
    const size_t piece = g.size() / pieces;
    for (int p = 0; p < pieces; ++p) {
      if (shards_moments_ && p != replica_->rank()) continue;
      const size_t begin = static_cast<size_t>(p) * piece;
      // The last piece takes any remainder (a layout of one piece is not cut to replicas).
      const size_t end = p + 1 == pieces ? g.size() : begin + piece;
      sums[static_cast<size_t>(p) * units + u] =
          engine::SumOfSquares(g.data() + begin, end - begin);
    }
  }
  if (shards_moments_) {
    std::vector<double> mine(sums.begin() + static_cast<size_t>(replica_->rank()) * units,
                             sums.begin() + static_cast<size_t>(replica_->rank() + 1) * units);
    WEFT_RETURN_IF_ERROR(Await(replica_->AllGather(mine.data(), sums.data(),
                                                   mine.size() * sizeof(double),
                                                   DataType::kUInt8)));
  }
  double total = 0;
  for (int u = 0; u < units; ++u) {
    for (int p = 0; p < pieces; ++p) total += sums[static_cast<size_t>(p) * units + u];
  }
  return total;
}

absl::Status ZeroCpuEngine::SumOverWorld(float* values, size_t n) {
  WEFT_RETURN_IF_ERROR(Await(comm_->AllReduce(values, n, DataType::kFloat32)));
  if (replica_ == nullptr) return absl::OkStatus();
  return Await(replica_->AllReduce(values, n, DataType::kFloat32));
}

// ---- one micro-batch -----------------------------------------------------------------------

absl::StatusOr<float> ZeroCpuEngine::MicroStep(const int32_t* inputs, const int32_t* targets,
                                            bool backward, float loss_scale) {
  return stage_ == 3 ? MicroStepStage3(inputs, targets, backward, loss_scale)
                     : MicroStepResident(inputs, targets, backward, loss_scale);
}

absl::StatusOr<float> ZeroCpuEngine::MicroStepResident(const int32_t* inputs,
                                                    const int32_t* targets, bool backward,
                                                    float loss_scale) {
  const int layers = arch_->num_layers();
  PhaseTimer forward(this, &forward_ms_);
  model_->EncoderForward(ResidentParams(0), inputs);
  for (int l = 0; l < layers; ++l) model_->BlockForward(l, ResidentParams(1 + l));
  const float loss = model_->ClassifierForward(ResidentParams(0), targets, loss_scale);
  forward.Stop();
  if (!backward) return loss;
  PhaseTimer backward_timer(this, &backward_ms_);

  model_->ClassifierBackward(ResidentParams(0), FullGrad(0));
  for (int l = layers - 1; l >= 0; --l) {
    model_->BlockBackward(l, ResidentParams(1 + l), FullGrad(1 + l));
    if (stage_ >= 1) {
      // Stage 2: the block's gradient leaves as soon as it is complete.
      WEFT_RETURN_IF_ERROR(ReduceScatterAccumulate(1 + l, FullGrad(1 + l)));
      std::fill(units_[1 + l].full_grad.begin(), units_[1 + l].full_grad.end(), 0.0f);
    }
  }
  model_->EncoderBackward(FullGrad(0));
  if (stage_ >= 1) {
    WEFT_RETURN_IF_ERROR(ReduceScatterAccumulate(0, FullGrad(0)));
    std::fill(units_[0].full_grad.begin(), units_[0].full_grad.end(), 0.0f);
  } else {
    // Every stage accumulates micro-steps the same way (a fresh gradient, then +=), so that
    // one rank gives the same bits at any stage.
    for (Unit& u : units_) {
      AddInto(u.grads.data(), u.full_grad.data(), u.full_grad.size());
      std::fill(u.full_grad.begin(), u.full_grad.end(), 0.0f);
    }
  }
  return loss;
}

absl::StatusOr<float> ZeroCpuEngine::MicroStepStage3(const int32_t* inputs, const int32_t* targets,
                                                  bool backward, float loss_scale) {
  const int layers = arch_->num_layers();
  auto block_buf = [this](int l) { return block_work_[l % 2].data(); };

  // ---- forward: head, then blocks with the next one's gather in flight.
  PhaseTimer forward(this, &forward_ms_);
  auto head = GatherInto(0, head_work_.data());
  auto next = layers > 0 ? GatherInto(1, block_buf(0)) : nullptr;
  WEFT_RETURN_IF_ERROR(Await(head));
  model_->EncoderForward(head_work_.data(), inputs);
  for (int l = 0; l < layers; ++l) {
    WEFT_RETURN_IF_ERROR(Await(next));
    // Prefetch: the next block, or the head again for the classifier.
    next = l + 1 < layers ? GatherInto(2 + l, block_buf(l + 1)) : GatherInto(0, head_work_.data());
    model_->BlockForward(l, block_buf(l));
  }
  if (layers == 0) next = GatherInto(0, head_work_.data());
  WEFT_RETURN_IF_ERROR(Await(next));
  const float loss = model_->ClassifierForward(head_work_.data(), targets, loss_scale);
  forward.Stop();
  if (!backward) return loss;
  PhaseTimer backward_timer(this, &backward_ms_);

  // ---- backward: blocks in reverse, each re-gathered; its gradient reduce-scattered while
  // the block below computes.
  std::fill(head_grad_work_.begin(), head_grad_work_.end(), 0.0f);
  next = layers > 0 ? GatherInto(layers, block_buf(layers - 1)) : nullptr;
  model_->ClassifierBackward(head_work_.data(), head_grad_work_.data());
  std::shared_ptr<comm::Work> scatter[2];
  int scatter_unit[2] = {-1, -1};
  auto finish_scatter = [&](int slot) -> absl::Status {
    if (!scatter[slot]) return absl::OkStatus();
    WEFT_RETURN_IF_ERROR(Await(scatter[slot]));
    const int u = scatter_unit[slot];
    AddInto(units_[u].grads.data(), scatter_out_[slot].data(), layout_.unit(u).shard);
    scatter[slot] = nullptr;
    return absl::OkStatus();
  };
  for (int l = layers - 1; l >= 0; --l) {
    const int slot = l % 2;
    WEFT_RETURN_IF_ERROR(Await(next));
    if (l > 0) next = GatherInto(l, block_buf(l - 1));
    // This slot's gradient buffer was sent two blocks ago; its scatter must be done first.
    WEFT_RETURN_IF_ERROR(finish_scatter(slot));
    float* grad = block_grad_work_[slot].data();
    std::fill(grad, grad + layout_.unit(1 + l).padded, 0.0f);
    model_->BlockBackward(l, block_buf(l), grad);
    scatter[slot] = comm_->ReduceScatter(grad, scatter_out_[slot].data(),
                                         layout_.unit(1 + l).shard, DataType::kFloat32);
    scatter_unit[slot] = 1 + l;
  }
  model_->EncoderBackward(head_grad_work_.data());
  auto head_scatter = comm_->ReduceScatter(head_grad_work_.data(), head_scatter_out_.data(),
                                           layout_.unit(0).shard, DataType::kFloat32);
  WEFT_RETURN_IF_ERROR(finish_scatter(0));
  WEFT_RETURN_IF_ERROR(finish_scatter(1));
  WEFT_RETURN_IF_ERROR(Await(head_scatter));
  AddInto(units_[0].grads.data(), head_scatter_out_.data(), layout_.unit(0).shard);
  return loss;
}

// ---- optimizer step ------------------------------------------------------------------------

absl::StatusOr<StepResult> ZeroCpuEngine::TrainStep(int64_t step, const BatchFn& batch) {
  const auto step_start = Clock::now();
  StepResult result;
  exposed_ms_ = 0;
  for (Unit& u : units_) std::fill(u.grads.begin(), u.grads.end(), 0.0f);

  const int accum = spec_.training().grad_accum_steps();
  const float loss_scale = 1.0f / static_cast<float>(world_ * accum);
  const size_t positions = inputs_.size();
  double loss_sum = 0;
  int64_t counted = 0;
  forward_ms_ = backward_ms_ = 0;
  for (int micro = 0; micro < accum; ++micro) {
    const MicroBatch mb = Buffers();
    batch(step, micro, mb);
    SetDocuments(mb);
    counted += CountedTargets(mb, positions);
    WEFT_ASSIGN_OR_RETURN(float loss,
                          MicroStep(inputs_.data(), targets_.data(), true, loss_scale));
    loss_sum += loss;
  }
  result.timings.forward_ms = forward_ms_;
  result.timings.backward_ms = backward_ms_;

  const auto opt_start = Clock::now();
  const double exposed_before_opt = exposed_ms_;
  if (stage_ == 0) {
    // Gradients are complete per rank; sum them across ranks unit by unit.
    for (Unit& u : units_) {
      WEFT_RETURN_IF_ERROR(
          Await(comm_->AllReduce(u.grads.data(), u.grads.size(), DataType::kFloat32)));
    }
  }
  WEFT_RETURN_IF_ERROR(AllReduceOverReplica());
  // Global gradient norm: every rank sums the squares of what it owns, then one all-reduce of
  // a scalar over the group (stage 0 owns everything, so no reduction is needed there; the
  // replicas own the same shards, so their squares are counted once).
  WEFT_ASSIGN_OR_RETURN(const double sum_squares, SumOfSquaresByPiece());
  // [sum of squares, summed per-micro-step mean losses, targets that count]. Losses and
  // counts sum over the world, squares over what each rank owns.
  float stats[3] = {static_cast<float>(sum_squares), static_cast<float>(loss_sum),
                    static_cast<float>(counted)};
  if (stage_ == 0) {
    WEFT_RETURN_IF_ERROR(SumOverWorld(&stats[1], 2));
  } else {
    WEFT_RETURN_IF_ERROR(Await(comm_->AllReduce(stats, 3, DataType::kFloat32)));
    if (replica_ != nullptr) {
      WEFT_RETURN_IF_ERROR(Await(replica_->AllReduce(&stats[1], 2, DataType::kFloat32)));
    }
  }
  // The backward took each rank's micro-step losses as means over all B * T positions, scaled
  // by 1 / (world * accum): the gradient of the mean over every position. Ignored targets
  // added nothing, so `gradient_scale` turns it into the mean over the targets that count.
  const MaskedMean mean = MaskedMeanOf(stats[1], stats[2], world_ * accum, positions);
  result.loss = mean.loss;
  result.targets = mean.targets;
  // NaN stays NaN (std::max would hide it): a non-finite norm skips the step below.
  result.grad_norm =
      std::isnan(stats[0]) ? stats[0] : mean.gradient_scale * std::sqrt(std::max(0.0f, stats[0]));

  const auto& opt = spec_.optimizer();
  const float grad_scale =
      mean.gradient_scale * engine::GradScaleFor(result.grad_norm, opt.grad_clip_norm());
  result.learning_rate = engine::LearningRate(spec_, step);
  const engine::AdamWConfig adamw = engine::AdamWConfigFromSpec(opt, result.learning_rate);
  for (int i = 0; i < layout_.num_units(); ++i) {
    Unit& u = units_[i];
    // The rank's piece (m and v are of it): the whole kept state with one piece.
    const size_t from = shards_moments_ ? layout_.unit(i).piece_offset : 0;
    engine::AdamWUpdate(u.params.data() + from, u.grads.data() + from, u.m.data(), u.v.data(),
                        u.decay_mask.data() + from, u.m.size(), adamw, optimizer_steps_ + 1,
                        grad_scale);
  }
  if (shards_moments_) WEFT_RETURN_IF_ERROR(GatherPiecesOverReplica());
  if (std::isfinite(result.grad_norm)) ++optimizer_steps_;
  if (stage_ == 1 || stage_ == 2) {
    // Bring every rank's updated shard back into the resident copies.
    std::vector<std::shared_ptr<comm::Work>> gathers;
    for (size_t u = 0; u < units_.size(); ++u) {
      gathers.push_back(GatherInto(static_cast<int>(u), units_[u].resident.data()));
    }
    for (auto& g : gathers) WEFT_RETURN_IF_ERROR(Await(g));
  }
  result.timings.optimizer_ms = MsSince(opt_start) - (exposed_ms_ - exposed_before_opt);
  result.timings.exposed_comm_ms = exposed_ms_;
  result.timings.step_ms = MsSince(step_start);
  return result;
}

absl::StatusOr<float> ZeroCpuEngine::EvalLoss(int batches, const BatchFn& batch) {
  double sum = 0;
  int64_t counted = 0;
  for (int i = 0; i < batches; ++i) {
    const MicroBatch mb = Buffers();
    batch(0, i, mb);
    SetDocuments(mb);
    counted += CountedTargets(mb, inputs_.size());
    WEFT_ASSIGN_OR_RETURN(float loss, MicroStep(inputs_.data(), targets_.data(), false, 1.0f));
    sum += loss;
  }
  float totals[2] = {static_cast<float>(sum), static_cast<float>(counted)};
  WEFT_RETURN_IF_ERROR(SumOverWorld(totals, 2));
  return MaskedMeanOf(totals[0], totals[1], world_ * std::max(1, batches), inputs_.size()).loss;
}

absl::StatusOr<std::vector<float>> ZeroCpuEngine::GatherUnit(int u) {
  const UnitShard& unit = layout_.unit(u);
  if (stage_ != 3) {
    const float* p = ResidentParams(u);
    return std::vector<float>(p, p + unit.size);
  }
  std::vector<float> full(unit.padded);
  WEFT_RETURN_IF_ERROR(Await(GatherInto(u, full.data())));
  full.resize(unit.size);
  return full;
}

const std::vector<float>& ZeroCpuEngine::Kept(int u, model_io::UnitState state) const {
  const Unit& unit = units_[u];
  return state == model_io::UnitState::kParams ? unit.params
         : state == model_io::UnitState::kM    ? unit.m
                                               : unit.v;
}

std::vector<float>& ZeroCpuEngine::Kept(int u, model_io::UnitState state) {
  return const_cast<std::vector<float>&>(std::as_const(*this).Kept(u, state));
}

absl::Status ZeroCpuEngine::CopyKeptToHost(int u, model_io::UnitState state, size_t offset,
                                           size_t n, float* host) const {
  const std::vector<float>& kept = Kept(u, state);
  std::copy(kept.begin() + offset, kept.begin() + offset + n, host);
  return absl::OkStatus();
}

absl::Status ZeroCpuEngine::CopyKeptFromHost(int u, model_io::UnitState state, const float* host) {
  std::vector<float>& kept = Kept(u, state);
  std::copy(host, host + kept.size(), kept.begin());
  return absl::OkStatus();
}

absl::Status ZeroCpuEngine::FinishRestore(const model_io::RangeReader& read) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    Unit& unit = units_[u];
    if (!unit.resident.empty()) {
      std::fill(unit.resident.begin(), unit.resident.end(), 0.0f);
      WEFT_RETURN_IF_ERROR(read(model_io::CheckpointTensorName(u, model_io::UnitState::kParams), 0,
                                static_cast<int64_t>(layout_.unit(u).size),
                                unit.resident.data()));
    }
    std::fill(unit.grads.begin(), unit.grads.end(), 0.0f);
  }
  return absl::OkStatus();
}

size_t ZeroCpuEngine::StateBytes() const {
  size_t floats = 0;
  for (const Unit& u : units_) {
    floats += u.params.size() + u.grads.size() + u.m.size() + u.v.size() + u.resident.size() +
              u.full_grad.size();
  }
  return floats * sizeof(float);
}

size_t ZeroCpuEngine::WorkingBytes() const {
  size_t floats = head_work_.size() + head_grad_work_.size() + head_scatter_out_.size();
  for (int i = 0; i < 2; ++i) {
    floats += block_work_[i].size() + block_grad_work_[i].size() + scatter_out_[i].size();
  }
  return floats * sizeof(float) + model_->ActivationBytes();
}

}  // namespace weft::zero
