#include "worker/zero/zero_cuda.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/adamw.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/ops.h"
#include "worker/engine/cuda/reduce.h"
#include "worker/engine/cuda/wire_codec.h"
#include "worker/comm/wire_codec.h"
#include "worker/comm/range_collectives.h"
#include "worker/model_io/host_buffer.h"
#include "worker/zero/sharding_groups.h"

namespace weft::zero {
namespace {

using comm::DataType;
namespace cuda = engine::cuda;

// Checkpoint snapshots in pinned memory (model_io/host_buffer.h); null makes them heap memory.
void* PinnedAllocate(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void PinnedRelease(void* p) { cudaFreeHost(p); }

// How many ranks of the world refused to build their engine: the sum of every rank's 0 or 1
// over the group, then over the replicas. A barrier too: every rank has checked the host's
// memory before any of them pins some, and a rank that cannot run makes all of them fail now
// rather than leaving the others to hang in their first collective.
absl::StatusOr<int> CountRefusals(comm::CudaCommunicator* group, comm::CudaCommunicator* replica,
                                  bool refused) {
  void* memory = nullptr;
  WEFT_CUDA_RETURN_IF_ERROR(cudaMalloc(&memory, sizeof(float)));
  const std::unique_ptr<void, decltype(&cudaFree)> owned(memory, cudaFree);
  float* const flag = static_cast<float*>(memory);
  const float mine = refused ? 1.0f : 0.0f;
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpy(flag, &mine, sizeof(float), cudaMemcpyHostToDevice));
  for (comm::CudaCommunicator* c : {group, replica}) {
    if (c == nullptr || c->world_size() == 1) continue;
    const std::shared_ptr<comm::Work> work = c->AllReduce(flag, 1, DataType::kFloat32);
    if (work->IsCompleted()) WEFT_RETURN_IF_ERROR(work->Wait());
    cudaEvent_t done = nullptr;
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    absl::Status waited = cuda::CudaStatus(cudaEventRecord(done, c->stream()), "cudaEventRecord");
    if (waited.ok()) waited = c->WaitEvent(done);
    cudaEventDestroy(done);
    WEFT_RETURN_IF_ERROR(waited);
  }
  float total = 0;
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpy(&total, flag, sizeof(float), cudaMemcpyDeviceToHost));
  return static_cast<int>(std::lround(total));
}

// Before anything is planned: the stage this engine implements, on a GPU its kernels run on.
absl::Status CheckStageAndDevice(const weft::v1::JobSpec& spec) {
  if (spec.zero_stage() != 3) {
    return absl::FailedPreconditionError(absl::StrCat(
        "zero_stage: the CUDA engine implements ZeRO stage 3 only, got ", spec.zero_stage()));
  }
  int device = 0, major = 0, minor = 0;
  WEFT_CUDA_RETURN_IF_ERROR(cudaGetDevice(&device));
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  return CheckComputeCapability(major, minor, spec.precision());
}

// What one rank of a group of `group` ranks (and `options.replicas` replicas) needs on this
// device, planned against its free memory now.
absl::StatusOr<GpuMemoryDecision> DecideOnThisDevice(const weft::v1::JobSpec& spec,
                                                     const engine::ModelArch& arch, int group,
                                                     int ranks_on_host,
                                                     const ZeroCudaOptions& options) {
  WEFT_ASSIGN_OR_RETURN(cuda::CudaModelEntry model, cuda::FindCudaModel(arch));
  size_t free_bytes = 0, total_bytes = 0;
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DecideGpuMemory(
      spec, arch, group, free_bytes, HostAvailableBytes(), ranks_on_host,
      CudaActivationBytes(std::move(model), spec.training().sequence_length()), options);
}

// Where `part` (a rank's OwnPart of the piece of unit 0 starting at `piece_begin`, count > 0)
// starts in that rank's shard of the unit.
size_t ShardOffsetOf(size_t piece_begin, const comm::RangePart& part, size_t shard) {
  return piece_begin + part.offset - static_cast<size_t>(part.rank) * shard;
}

}  // namespace

ActivationBytesFn CudaActivationBytes(cuda::CudaModelEntry model, int sequence_length) {
  return [model = std::move(model), sequence_length](const engine::CheckpointingPlan& level,
                                                     int rows,
                                                     const cuda::ArenaRequests& requests) {
    return model.activation_bytes(rows, sequence_length, level, requests);
  };
}

absl::StatusOr<GpuMemoryPlan> PlanGpuMemory(const weft::v1::JobSpec& spec,
                                            const engine::ModelArch& arch,
                                            const engine::CheckpointingPlan& level,
                                            int micro_batch_size, int world,
                                            const ZeroCudaOptions& options) {
  WEFT_ASSIGN_OR_RETURN(cuda::CudaModelEntry model, cuda::FindCudaModel(arch));
  return PlanGpuBuffers(spec, arch, level, micro_batch_size, world,
                        FirstOffloadedUnit(UnitSizes(arch), spec.optimizer()),
                        CudaActivationBytes(std::move(model), spec.training().sequence_length()),
                        options)
      .totals;
}

size_t ZeroCudaEngine::DeviceUsedBytes() const {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return total_bytes - free_bytes;
}

// ---- timing events --------------------------------------------------------------------------

ZeroCudaEngine::TimingEvents::~TimingEvents() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

absl::StatusOr<cudaEvent_t> ZeroCudaEngine::TimingEvents::Next() {
  if (used_ == events_.size()) {
    cudaEvent_t e = nullptr;
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e));
    events_.push_back(e);
  }
  return events_[used_++];
}

absl::StatusOr<size_t> ZeroCudaEngine::Mark() {
  WEFT_ASSIGN_OR_RETURN(cudaEvent_t e, timing_.Next());
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(e, compute_));
  return timing_.used() - 1;
}

// ---- creation -------------------------------------------------------------------------------

ZeroCudaEngine::ZeroCudaEngine(const weft::v1::JobSpec& spec, comm::CudaCommunicator* comm,
                               comm::CudaCommunicator* replica,
                               std::unique_ptr<const engine::ModelArch> arch,
                               int first_offloaded, const ZeroCudaOptions& options)
    : ZeroEngine(spec, std::move(arch), comm->world_size(), comm->rank(),
                 ReplicaPieces(options.replicas, replica != nullptr ? replica->rank() : 0),
                 ShardsOptimizer(spec.sharding(), options.replicas)),
      comm_(comm),
      replica_(replica != nullptr && replica->world_size() > 1 ? replica : nullptr),
      world_(comm->world_size() * (replica_ != nullptr ? replica_->world_size() : 1)),
      group_(comm->world_size()),
      batch_size_(spec.training().micro_batch_size()),
      seq_len_(spec.training().sequence_length()),
      first_offloaded_(first_offloaded),
      options_(options),
      direct_grads_(DirectGradients(comm->world_size())),
      head_split_(arch_->HeadOutputBegin()),
      replica_format_(replica_ != nullptr ? ReplicaWireFormat(spec.sharding())
                                          : comm::WireFormat::kFp32) {}

ZeroCudaEngine::~ZeroCudaEngine() {
  if (compute_ != nullptr) cudaStreamSynchronize(compute_);
  model_.reset();
  optimizer_.reset();
  for (void* p : allocations_) cudaFree(p);
  for (void* p : host_allocations_) cudaFreeHost(p);
  for (cudaEvent_t e : {compute_ready_, head_gathered_, gathered_[0], gathered_[1],
                        head_scattered_, scattered_[0], scattered_[1], comm_done_,
                        replica_ready_, replica_done_, replica_idle_}) {
    if (e != nullptr) cudaEventDestroy(e);
  }
  for (cudaEvent_t e : pieces_gathered_) cudaEventDestroy(e);
  if (compute_ != nullptr) cudaStreamDestroy(compute_);
}

absl::StatusOr<void*> ZeroCudaEngine::Allocate(const GpuBuffer& buffer) {
  const bool device = buffer.place == GpuBufferPlace::kDevice;
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(buffer.elements, 1) * buffer.element_bytes;
  const cudaError_t err = device ? cudaMalloc(&p, bytes) : cudaMallocHost(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat(device ? "cudaMalloc of " : "cudaMallocHost of ", bytes,
                     device ? " bytes failed: " : " bytes (pinned host memory) failed: ",
                     cudaGetErrorString(err)));
  }
  (device ? allocations_ : host_allocations_).push_back(p);
  if (device) allocated_bytes_ += bytes;
  return p;
}

absl::Status CheckComputeCapability(int major, int minor, weft::v1::Precision precision) {
  if (major < 8) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA engine needs a GPU of compute capability 8.0 (A100) or newer for its bf16 "
        "tensor-core kernels; this one is ",
        major, ".", minor, " (run the worker with --device cpu, or on a newer GPU)"));
  }
  if (precision == weft::v1::FP8 && major * 10 + minor < 89) {
    return absl::FailedPreconditionError(absl::StrCat(
        "precision FP8 needs a GPU of compute capability 8.9 (L40S, H100) or newer for FP8 "
        "tensor cores; this one is ",
        major, ".", minor, " (train it in BF16)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ZeroCudaEngine>> ZeroCudaEngine::Create(
    const weft::v1::JobSpec& spec, comm::CudaCommunicator* comm, comm::CudaCommunicator* replica,
    int ranks_on_host, const ZeroCudaOptions& tuning) {
  WEFT_RETURN_IF_ERROR(CheckStageAndDevice(spec));
  ZeroCudaOptions options = tuning;
  options.replicas = replica != nullptr ? replica->world_size() : 1;
  // A sharded optimizer steps at the end of the step: its pieces must cross to the other
  // replicas before the next forward gathers them, not be stepped in that forward.
  if (ShardsOptimizer(spec.sharding(), options.replicas)) options.update_in_next_forward = false;
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec.model()));
  WEFT_ASSIGN_OR_RETURN(
      const GpuMemoryDecision d,
      DecideOnThisDevice(spec, *arch, comm->world_size(), ranks_on_host, options));
  WEFT_ASSIGN_OR_RETURN(const int refusals, CountRefusals(comm, replica, !d.fits.ok()));
  WEFT_RETURN_IF_ERROR(d.fits);
  if (refusals > 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        refusals, " other rank(s) of the job cannot build their engine (their error names "
        "the memory they lack); this one could"));
  }
  model_io::SetHostBufferAllocator({PinnedAllocate, PinnedRelease});
  std::unique_ptr<ZeroCudaEngine> engine(
      new ZeroCudaEngine(spec, comm, replica, std::move(arch), d.first_offloaded, options));
  engine->plan_ = d.buffers;
  engine->checkpointing_ = d.memory.level;
  engine->plan_note_ = d.note;
  WEFT_RETURN_IF_ERROR(engine->Initialize());
  return engine;
}

absl::Status ZeroCudaEngine::CheckFits(const weft::v1::JobSpec& spec, int group_size,
                                       int replicas, int ranks_on_host) {
  WEFT_RETURN_IF_ERROR(CheckStageAndDevice(spec));
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<const engine::ModelArch> arch,
                        engine::MakeModelArch(spec.model()));
  ZeroCudaOptions options;
  options.replicas = replicas;
  WEFT_ASSIGN_OR_RETURN(const GpuMemoryDecision d,
                        DecideOnThisDevice(spec, *arch, group_size, ranks_on_host, options));
  return d.fits;
}

absl::Status ZeroCudaEngine::CreateStreams() {
  // With nothing to gather or reduce (one rank, one replica) the comm stream carries only the
  // update in the next forward and the casts: compute takes the GPU first and the update fills
  // its gaps (2 ms of an 8-layer GPT 6.7B step's 169 measured on an H100). Beyond, collectives
  // must not queue behind compute, and the streams stay equal.
  int priority = 0;
  if (group_ == 1 && replica_ == nullptr) {
    int least = 0;
    WEFT_CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &priority));
  }
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithPriority(&compute_, cudaStreamNonBlocking, priority));
  for (cudaEvent_t* e : {&compute_ready_, &head_gathered_, &gathered_[0], &gathered_[1],
                         &head_scattered_, &scattered_[0], &scattered_[1], &comm_done_}) {
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  if (replica_ != nullptr) {
    for (cudaEvent_t* e : {&replica_ready_, &replica_done_, &replica_idle_}) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    }
  }
  if (shards_moments_) {
    pieces_gathered_.assign(layout_.num_units(), nullptr);
    for (cudaEvent_t& e : pieces_gathered_) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<void*> ZeroCudaEngine::Carve(const GpuBuffer& buffer) {
  switch (buffer.place) {
    case GpuBufferPlace::kDevice:
    case GpuBufferPlace::kPinnedHost: return Allocate(buffer);
    case GpuBufferPlace::kModelArena:
    case GpuBufferPlace::kNowhere: return nullptr;  // the model's own, or not allocated
    case GpuBufferPlace::kInArena: break;
  }
  void* memory = nullptr;
  if (buffer.role == GpuBufferRole::kHeadWork) memory = model_->HeadWork();
  if (buffer.role == GpuBufferRole::kGrads && buffer.index > 0) {
    memory = model_->SpentActivationGradient(buffer.index - 1);
  }
  if (memory == nullptr) {
    return absl::InternalError(absl::StrCat("the plan puts the ", GpuBufferName(buffer),
                                            " in the model's allocation, which has none"));
  }
  return memory;
}

absl::Status ZeroCudaEngine::Bind(const GpuBuffer& buffer, void* memory) {
  float* const floats = static_cast<float*>(memory);
  const int i = buffer.index;
  switch (buffer.role) {
    case GpuBufferRole::kModelArena:
    case GpuBufferRole::kSmallBufferRounding: return absl::OkStatus();
    case GpuBufferRole::kHeadWork: head_work_ = static_cast<bf16*>(memory); break;
    case GpuBufferRole::kParams: units_[i].params = floats; break;
    case GpuBufferRole::kM: units_[i].m = floats; break;
    case GpuBufferRole::kV: units_[i].v = floats; break;
    case GpuBufferRole::kGrads: units_[i].grads = floats; break;
    case GpuBufferRole::kHostDecayMask:
      units_[i].host_decay_mask = static_cast<uint8_t*>(memory);
      break;
    case GpuBufferRole::kParamsBf16: units_[i].params_bf16 = static_cast<bf16*>(memory); break;
    case GpuBufferRole::kBlockWork: block_work_[i] = static_cast<bf16*>(memory); break;
    case GpuBufferRole::kGradBuffer: head_grad_ = floats; break;
    case GpuBufferRole::kGatherStaging: gather_staging_ = floats; break;
    case GpuBufferRole::kGatherSource: gather_source_ = floats; break;
    case GpuBufferRole::kNormScratch: norm_scratch_ = floats; break;
    case GpuBufferRole::kStats: stats_ = floats; break;
    case GpuBufferRole::kGradScale: grad_scale_ = floats; break;
    case GpuBufferRole::kHostStats: host_stats_ = floats; break;
    case GpuBufferRole::kStagingGrads: staging_grads_[i] = floats; break;
    case GpuBufferRole::kStagingBf16: staging_bf16_[i] = static_cast<uint16_t*>(memory); break;
    case GpuBufferRole::kWireSend: wire_send_ = static_cast<uint8_t*>(memory); break;
    case GpuBufferRole::kWireRecv: wire_recv_ = static_cast<uint8_t*>(memory); break;
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::AllocatePlanned() {
  units_.resize(layout_.num_units());
  for (const GpuBuffer& buffer : plan_.buffers) {
    WEFT_ASSIGN_OR_RETURN(void* const memory, Carve(buffer));
    WEFT_RETURN_IF_ERROR(Bind(buffer, memory));
  }
  head_grad_takes_turns_ = plan_.head_grad_takes_turns;
  one_block_grad_slot_ = plan_.one_block_grad_slot;
  gather_chunk_ = plan_.gather_chunk_floats;
  if (head_grad_ != nullptr) {
    // Head first, then the slots: apart, or in one buffer they take turns in.
    block_grad_[0] = head_grad_ + plan_.block_grad_offset[0];
    block_grad_[1] = head_grad_ + plan_.block_grad_offset[1];
    // Padding elements of the gradient units are never written by the model; zero them once
    // (and again after each turn of the head's: BlockBackward leaves the slots' padding alone).
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
        head_grad_, 0, plan_.Find(GpuBufferRole::kGradBuffer)->bytes(), compute_));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::InitializeUnits() {
  for (int u = 0; u < layout_.num_units(); ++u) {
    Unit& unit = units_[u];
    const size_t shard = layout_.unit(u).shard;
    const size_t moments = KeptStateElements(u, model_io::UnitState::kM);
    unit.moments_begin = shards_moments_ ? layout_.unit(u).piece_offset : 0;
    unit.moments_end = unit.moments_begin + moments;
    const InitialUnit init = InitialState(u);
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpy(unit.params, init.kept.data(), shard * sizeof(float),
                                         cudaMemcpyDefault));
    if (Offloaded(u)) {
      // The host AdamW reads a mask; the device one is told the runs.
      std::copy(init.decay_mask.begin(), init.decay_mask.end(), unit.host_decay_mask);
      std::fill(unit.m, unit.m + shard, 0.0f);
      std::fill(unit.v, unit.v + shard, 0.0f);
      WEFT_RETURN_IF_ERROR(cuda::CastToBf16(unit.params_bf16, unit.params, shard, compute_));
    } else {
      units_[u].decay_runs = DecayRuns(init.decay_mask);
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(unit.m, 0, moments * sizeof(float), compute_));
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(unit.v, 0, moments * sizeof(float), compute_));
    }
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(unit.grads, 0, shard * sizeof(float), compute_));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::Initialize() {
  WEFT_RETURN_IF_ERROR(CreateStreams());
  WEFT_ASSIGN_OR_RETURN(model_, cuda::CreateCudaModel(*arch_, batch_size_, seq_len_,
                                                      checkpointing_, compute_,
                                                      plan_.arena_requests));
  // Every buffer the plan lists, and nothing else: what DecideMemory weighed is what runs.
  WEFT_RETURN_IF_ERROR(AllocatePlanned());
  WEFT_RETURN_IF_ERROR(InitializeUnits());
  WEFT_RETURN_IF_ERROR(CreateOptimizer());
  inputs_.resize(static_cast<size_t>(batch_size_) * seq_len_);
  targets_.resize(inputs_.size());
  if (spec_.data().document_masking()) doc_starts_.resize(inputs_.size());
  return SyncCompute();
}

absl::Status ZeroCudaEngine::CreateOptimizer() {
  ZeroCudaOptimizer::Config config;
  config.layout = &layout_;
  config.shards = &units_;
  config.comm = comm_;
  config.compute = compute_;
  config.grad_scale = grad_scale_;
  config.host_clip_scale = &host_stats_[2];
  config.first_offloaded = first_offloaded_;
  config.head_split = head_split_;
  config.update_in_next_forward = options_.update_in_next_forward;
  config.head_work = head_work_;
  config.head_slot_elements = plan_.Find(GpuBufferRole::kHeadWork)->elements;
  config.sync_compute = [this] { return SyncCompute(); };
  for (int i = 0; i < 2; ++i) {
    config.staging_grads[i] = staging_grads_[i];
    config.staging_bf16[i] = staging_bf16_[i];
  }
  WEFT_ASSIGN_OR_RETURN(optimizer_, ZeroCudaOptimizer::Create(config));
  return absl::OkStatus();
}

// ---- stream ordering ------------------------------------------------------------------------

absl::Status ZeroCudaEngine::CommWaitsCompute() {
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_ready_, compute_));
  WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(comm_->stream(), compute_ready_, 0));
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::ComputeWaits(cudaEvent_t event, bool behind_update) {
  WEFT_ASSIGN_OR_RETURN(size_t begin, Mark());
  WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(compute_, event, 0));
  WEFT_ASSIGN_OR_RETURN(size_t end, Mark());
  waits_.push_back({begin, end, behind_update});
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::CheckWork(const std::shared_ptr<comm::Work>& work) {
  // Device-buffer collectives complete asynchronously; only an op refused at once (bad
  // arguments, a communicator already broken) is complete here, and then carries its error.
  if (work->IsCompleted()) return work->Wait();
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::SyncCompute() const {
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_done_, compute_));
  return comm_->WaitEvent(comm_done_);
}

absl::Status ZeroCudaEngine::Gather(int unit, bf16* dst) {
  const size_t shard = layout_.unit(unit).shard;
  WEFT_RETURN_IF_ERROR(WaitForPieces(unit, comm_->stream()));
  if (Offloaded(unit)) {
    return CheckWork(
        comm_->AllGather(units_[unit].params_bf16, dst, shard, DataType::kBFloat16));
  }
  // The bf16 copy of the shard is cast from the master where the gather reads it (this rank's
  // part of dst), then gathered in place: no resident bf16 copy of the shard.
  bf16* mine = dst + static_cast<size_t>(comm_->rank()) * shard;
  WEFT_ASSIGN_OR_RETURN(const bool updated,
                        optimizer_->RunPending(unit, 0, shard, mine, comm_->stream()));
  if (!updated) {
    WEFT_RETURN_IF_ERROR(cuda::CastToBf16(mine, units_[unit].params, shard, comm_->stream()));
  }
  if (group_ == 1) return absl::OkStatus();
  return CheckWork(comm_->AllGather(mine, dst, shard, DataType::kBFloat16));
}

absl::Status ZeroCudaEngine::ReduceScatterGrad(int unit, float* full, bool accumulate) {
  float* grads = units_[unit].grads;
  const size_t shard = layout_.unit(unit).shard;
  if (!accumulate) {
    return CheckWork(comm_->ReduceScatter(full, grads, shard, DataType::kFloat32));
  }
  // In place, into this rank's block of the full gradient, which nothing reads again before
  // the slot is next written (behind this slot's `scattered_` event): no scratch shard. The
  // sum is added to the shard's, right behind on the comm stream.
  float* const mine = full + static_cast<size_t>(comm_->rank()) * shard;
  WEFT_RETURN_IF_ERROR(CheckWork(comm_->ReduceScatter(full, mine, shard, DataType::kFloat32)));
  return cuda::AccumulateInto(grads, mine, shard, comm_->stream());
}

absl::Status ZeroCudaEngine::GatherHead(HeadPiece piece) {
  if (head_split_ == 0) return Gather(0, head_work_);
  WEFT_RETURN_IF_ERROR(WaitForPieces(0, comm_->stream()));
  // head_work_[i] is element piece.begin + i of the unit. This rank's part of the piece is
  // cast (or copied, offloaded) from its shard into place, then every owner broadcasts its.
  const size_t shard = layout_.unit(0).shard;
  const comm::RangePart mine =
      comm::OwnPart(piece.begin, piece.end, shard, group_, comm_->rank());
  if (mine.count > 0) {
    const size_t from = ShardOffsetOf(piece.begin, mine, shard);
    if (Offloaded(0)) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(head_work_ + mine.offset,
                                                units_[0].params_bf16 + from,
                                                mine.count * sizeof(bf16),
                                                cudaMemcpyDeviceToDevice, comm_->stream()));
    } else {
      WEFT_RETURN_IF_ERROR(
          optimizer_->RunPending(0, from, from + mine.count, nullptr, comm_->stream()).status());
      WEFT_RETURN_IF_ERROR(cuda::CastToBf16(head_work_ + mine.offset, units_[0].params + from,
                                            mine.count, comm_->stream()));
    }
  }
  if (group_ == 1) return absl::OkStatus();
  return CheckWork(comm::AllGatherRange(*comm_, head_work_, piece.begin, piece.end, shard,
                                        DataType::kBFloat16));
}

absl::Status ZeroCudaEngine::ReduceHeadGrad(HeadPiece piece, bool accumulate) {
  if (head_split_ == 0) return ReduceScatterGrad(0, head_grad_, accumulate);
  const size_t shard = layout_.unit(0).shard;
  const comm::RangePart mine =
      comm::OwnPart(piece.begin, piece.end, shard, group_, comm_->rank());
  // Where this rank's part of the piece lies in its shard (it may own none of the piece).
  float* const grads =
      mine.count == 0 ? nullptr : units_[0].grads + ShardOffsetOf(piece.begin, mine, shard);
  // Accumulating, the sum goes in place (head_grad_ is not read again before the next memset,
  // behind `head_scattered_`) and is added to the shard's behind it, as ReduceScatterGrad does.
  float* const sum = accumulate ? head_grad_ + mine.offset : grads;
  WEFT_RETURN_IF_ERROR(CheckWork(comm::ReduceScatterRange(
      *comm_, head_grad_, sum, piece.begin, piece.end, shard, DataType::kFloat32)));
  if (!accumulate || mine.count == 0) return absl::OkStatus();
  return cuda::AccumulateInto(grads, sum, mine.count, comm_->stream());
}

absl::Status ZeroCudaEngine::WaitForSlotScatters() {
  for (int slot : {0, 1}) {
    if (scatter_pending_[slot]) WEFT_RETURN_IF_ERROR(ComputeWaits(scattered_[slot]));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::ZeroSlotPadding() {
  const size_t max_block = layout_.max_block_padded();
  // Past the smallest block's elements: every block's padding (and any larger block's
  // elements, which its backward writes).
  size_t smallest = max_block;
  for (int u = 1; u < layout_.num_units(); ++u) {
    smallest = std::min(smallest, layout_.unit(u).size);
  }
  // One buffer under both names with one_block_grad_slot_: zeroed once.
  for (int slot = 0; slot < (one_block_grad_slot_ ? 1 : 2); ++slot) {
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(block_grad_[slot] + smallest, 0,
                                              (max_block - smallest) * sizeof(float), compute_));
  }
  return absl::OkStatus();
}

// ---- one micro-batch ------------------------------------------------------------------------

absl::Status ZeroCudaEngine::SumSquaresOnComm(int unit) {
  return cuda::SumOfSquares(&stats_[0], units_[unit].grads, layout_.unit(unit).shard,
                            norm_scratch_, comm_->stream());
}

absl::Status ZeroCudaEngine::FinishShardGradient(int unit) {
  if (replica_ == nullptr) return SumSquaresOnComm(unit);
  float* grads = units_[unit].grads;
  const size_t shard = layout_.unit(unit).shard;
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(replica_ready_, comm_->stream()));
  WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(replica_->stream(), replica_ready_, 0));
  if (shards_moments_) {
    // Only the rank's piece is summed, and only its squares counted (AllReduceStats sums
    // them over the replicas too).
    WEFT_RETURN_IF_ERROR(ReduceScatterOnReplica(grads, shard));
    const UnitShard& s = layout_.unit(unit);
    return cuda::SumOfSquares(&stats_[0], grads + s.piece_offset, s.piece, norm_scratch_,
                              replica_->stream());
  }
  if (replica_format_ == comm::WireFormat::kFp32) {
    WEFT_RETURN_IF_ERROR(CheckWork(replica_->AllReduce(grads, shard, DataType::kFloat32)));
  } else {
    WEFT_RETURN_IF_ERROR(WireAllReduceOnReplica(grads, shard));
  }
  // Only this stream touches stats_[0] and norm_scratch_ in a hybrid step.
  return cuda::SumOfSquares(&stats_[0], grads, shard, norm_scratch_, replica_->stream());
}

absl::StatusOr<uint8_t*> ZeroCudaEngine::ReduceOwnWireChunk(const float* grads, size_t shard) {
  // comm/wire_codec.h's layout, on the replica stream: the wire buffers are reused unit after
  // unit, in that stream's order.
  const int ranks = replica_->world_size();
  const size_t chunk = comm::WireChunkValues(shard, ranks);
  const size_t chunk_bytes = comm::WireChunkBytes(replica_format_, chunk);
  cudaStream_t stream = replica_->stream();
  uint8_t* const mine = wire_recv_ + static_cast<size_t>(replica_->rank()) * chunk_bytes;
  WEFT_RETURN_IF_ERROR(cuda::EncodeWireChunks(replica_format_, grads, shard, ranks, chunk,
                                              chunk_bytes, wire_send_, stream));
  WEFT_RETURN_IF_ERROR(
      CheckWork(replica_->AllToAll(wire_send_, wire_recv_, chunk_bytes, DataType::kUInt8)));
  WEFT_RETURN_IF_ERROR(cuda::SumWireChunks(replica_format_, wire_recv_, ranks, chunk,
                                           chunk_bytes, mine, stream));
  return mine;
}

absl::Status ZeroCudaEngine::WireAllReduceOnReplica(float* grads, size_t shard) {
  WEFT_ASSIGN_OR_RETURN(uint8_t* const mine, ReduceOwnWireChunk(grads, shard));
  const int ranks = replica_->world_size();
  const size_t chunk = comm::WireChunkValues(shard, ranks);
  const size_t chunk_bytes = comm::WireChunkBytes(replica_format_, chunk);
  WEFT_RETURN_IF_ERROR(
      CheckWork(replica_->AllGather(mine, wire_recv_, chunk_bytes, DataType::kUInt8)));
  return cuda::DecodeWireChunks(replica_format_, wire_recv_, ranks, chunk, chunk_bytes, grads,
                                shard, replica_->stream());
}

absl::Status ZeroCudaEngine::ReduceScatterOnReplica(float* grads, size_t shard) {
  const int ranks = replica_->world_size();
  const size_t piece = shard / static_cast<size_t>(ranks);
  float* const mine = grads + static_cast<size_t>(replica_->rank()) * piece;
  if (replica_format_ == comm::WireFormat::kFp32) {
    return CheckWork(replica_->ReduceScatter(grads, mine, piece, DataType::kFloat32));
  }
  // The layout's pieces are whole wire chunks: the codec's chunk r is piece r. The sum is
  // decoded as the all-reduce would: the same bits in the piece.
  WEFT_ASSIGN_OR_RETURN(const uint8_t* const encoded, ReduceOwnWireChunk(grads, shard));
  return cuda::DecodeWireChunks(replica_format_, encoded, 1, piece,
                                comm::WireChunkBytes(replica_format_, piece), mine, piece,
                                replica_->stream());
}

absl::Status ZeroCudaEngine::GatherPiecesOnReplica() {
  if (!shards_moments_) return absl::OkStatus();
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(compute_ready_, compute_));
  WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(replica_->stream(), compute_ready_, 0));
  // Forward order: the head (its embedding is gathered first), then the blocks.
  for (int u = 0; u < layout_.num_units(); ++u) {
    const UnitShard& s = layout_.unit(u);
    float* const params = units_[u].params;
    WEFT_RETURN_IF_ERROR(CheckWork(replica_->AllGather(params + s.piece_offset, params, s.piece,
                                                       DataType::kFloat32)));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(pieces_gathered_[u], replica_->stream()));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::WaitForPieces(int u, cudaStream_t stream) {
  if (!shards_moments_) return absl::OkStatus();
  WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(stream, pieces_gathered_[u], 0));
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::SyncPieces() const {
  if (!shards_moments_) return absl::OkStatus();
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(replica_idle_, replica_->stream()));
  return replica_->WaitEvent(replica_idle_);
}

absl::Status ZeroCudaEngine::CopyStatsToHost() {
  // [sum of squares, loss sum] to host_stats_[0..1] and the targets to [3]: [2] is the clip
  // scale the optimizer's host step copies on its own.
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_stats_, stats_, 2 * sizeof(float), cudaMemcpyDeviceToHost, compute_));
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&host_stats_[3], &stats_[2], sizeof(float),
                                            cudaMemcpyDeviceToHost, compute_));
  // The FP8 casts' tallies of the step, zeroed for the next once copied.
  if (cuda::Fp8CastCounts* counts = model_->Fp8Counts(); counts != nullptr) {
    constexpr size_t kBytes = 2 * sizeof(cuda::Fp8CastCounts);
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(HostFp8Counts(), counts, kBytes, cudaMemcpyDeviceToHost, compute_));
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counts, 0, kBytes, compute_));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::AllReduceStats() {
  WEFT_RETURN_IF_ERROR(CommWaitsCompute());
  WEFT_RETURN_IF_ERROR(CheckWork(comm_->AllReduce(stats_, 3, DataType::kFloat32)));
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_done_, comm_->stream()));
  if (replica_ != nullptr) {
    WEFT_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(replica_->stream(), comm_done_, 0));
    // Squares too when each replica counted its own piece's.
    float* const summed = shards_moments_ ? &stats_[0] : &stats_[1];
    WEFT_RETURN_IF_ERROR(
        CheckWork(replica_->AllReduce(summed, shards_moments_ ? 3 : 2, DataType::kFloat32)));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_done_, replica_->stream()));
  }
  return ComputeWaits(comm_done_);
}

ZeroCudaEngine::HeadPiece ZeroCudaEngine::InputPiece() const {
  return {0, head_split_ > 0 ? head_split_ : layout_.unit(0).size};
}

ZeroCudaEngine::HeadPiece ZeroCudaEngine::OutputPiece() const {
  return {head_split_, layout_.unit(0).size};
}

bool ZeroCudaEngine::ReducesClassifierGrad() const {
  return (head_split_ > 0 || head_grad_takes_turns_) && !direct_grads_;
}

MicroBatch ZeroCudaEngine::Buffers() {
  return MicroBatch{inputs_.data(), targets_.data(),
                    doc_starts_.empty() ? nullptr : doc_starts_.data()};
}

absl::Status ZeroCudaEngine::StageTargetCount(int64_t counted) {
  // Through pinned memory, as the stats' other entries go the other way; the copy is done
  // before the host writes the slot again (TrainStep and EvalLoss end synchronised).
  host_stats_[4] = static_cast<float>(counted);
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(&stats_[2], &host_stats_[4], sizeof(float),
                                            cudaMemcpyHostToDevice, compute_));
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::MicroStep(const MicroBatch& batch, bool backward, float grad_scale,
                                       bool first_micro_step, bool last_micro_step) {
  std::array<size_t, 3> phase{};
  WEFT_ASSIGN_OR_RETURN(phase[0], Mark());
  WEFT_RETURN_IF_ERROR(model_->SetBatch(batch_size_, seq_len_, batch.inputs, batch.targets,
                                        batch.doc_starts, spec_.data().reset_positions()));
  WEFT_RETURN_IF_ERROR(Forward());
  WEFT_RETURN_IF_ERROR(ClassifierStep(backward, grad_scale, first_micro_step));
  WEFT_ASSIGN_OR_RETURN(phase[1], Mark());
  if (!backward) {
    phase[2] = phase[1];
    phases_.push_back(phase);
    return absl::OkStatus();
  }
  WEFT_RETURN_IF_ERROR(BackwardBlocks(first_micro_step, last_micro_step));
  WEFT_RETURN_IF_ERROR(EmbeddingBackward());
  WEFT_ASSIGN_OR_RETURN(phase[2], Mark());
  phases_.push_back(phase);
  return ReduceEmbeddingGrad(first_micro_step, last_micro_step);
}

absl::Status ZeroCudaEngine::Forward() {
  const int layers = arch_->num_layers();
  cudaStream_t comm_stream = comm_->stream();
  // An unsplit head stays gathered for the whole micro-step. A split one has its embedding
  // piece gathered first and its LM head piece after the embedding's forward, into the same
  // buffer. Block 0 goes into slot 0.
  const bool split = head_split_ > 0;
  WEFT_RETURN_IF_ERROR(CommWaitsCompute());
  // The last step's updates (ZeroCudaOptions::update_in_next_forward) go with the gathers;
  // the units whose gradients the gathered head overwrites, first. Every gather of this
  // forward then runs one, so a compute wait for a gather counts as the optimizer's time.
  const bool updating = optimizer_->pending();
  WEFT_RETURN_IF_ERROR(optimizer_->RunPendingUnderHead(comm_stream));
  WEFT_RETURN_IF_ERROR(GatherHead(InputPiece()));
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(head_gathered_, comm_stream));
  WEFT_RETURN_IF_ERROR(Gather(1, block_work_[0]));
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(gathered_[0], comm_stream));
  WEFT_RETURN_IF_ERROR(ComputeWaits(head_gathered_, updating));
  WEFT_RETURN_IF_ERROR(model_->EncoderForward(head_work_));
  for (int l = 0; l < layers; ++l) {
    const int slot = l % 2;
    if (l + 1 < layers) {
      // Slot (l+1)%2 held block l-1, whose forward is enqueued: comm waits for it, then
      // fetches block l+1 while block l computes.
      WEFT_RETURN_IF_ERROR(CommWaitsCompute());
      WEFT_RETURN_IF_ERROR(Gather(2 + l, block_work_[(l + 1) % 2]));
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(gathered_[(l + 1) % 2], comm_stream));
    }
    if (split && l == 0) {
      // The embedding's forward is behind the comm stream's wait (the one above, or this):
      // the LM head's piece takes its place, behind block 1's gather.
      if (layers == 1) WEFT_RETURN_IF_ERROR(CommWaitsCompute());
      WEFT_RETURN_IF_ERROR(GatherHead(OutputPiece()));
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(head_gathered_, comm_stream));
    }
    WEFT_RETURN_IF_ERROR(ComputeWaits(gathered_[slot], updating));
    WEFT_RETURN_IF_ERROR(model_->BlockForward(l, block_work_[slot]));
  }
  if (split) WEFT_RETURN_IF_ERROR(ComputeWaits(head_gathered_, updating));
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::ClassifierStep(bool backward, float grad_scale,
                                            bool first_micro_step) {
  const bool split = head_split_ > 0;
  // Element i of head_grad is element i of unit 0 for the embedding (and an unsplit head),
  // element head_split_ + i for the classifier (CudaModel::Classifier).
  float* const head_grad = direct_grads_ ? units_[0].grads : head_grad_;
  float* const classifier_grad = direct_grads_ ? head_grad + head_split_ : head_grad_;
  if (backward) {
    if (scatter_pending_[2]) WEFT_RETURN_IF_ERROR(ComputeWaits(head_scattered_));
    // The slots' last reduce-scatters (the previous micro-step's) are long done by now.
    if (head_grad_takes_turns_) WEFT_RETURN_IF_ERROR(WaitForSlotScatters());
    // Direct gradients accumulate over micro-steps in place: zeroed by the first only.
    if (direct_grads_ && first_micro_step) {
      WEFT_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(head_grad, 0, layout_.unit(0).padded * sizeof(float), compute_));
    } else if (!direct_grads_) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          head_grad_, 0, (split ? OutputPiece().size() : layout_.unit(0).padded) * sizeof(float),
          compute_));
    }
  }
  // head_work_ holds the output piece (element head_split_ on), or the whole unsplit head.
  WEFT_RETURN_IF_ERROR(
      model_->Classifier(head_work_, grad_scale, backward ? classifier_grad : nullptr));
  if (backward && ReducesClassifierGrad()) {
    WEFT_RETURN_IF_ERROR(CommWaitsCompute());
    WEFT_RETURN_IF_ERROR(ReduceHeadGrad(OutputPiece(), !first_micro_step));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(head_scattered_, comm_->stream()));
    scatter_pending_[2] = true;
  }
  return cuda::SumInto(&stats_[1], model_->Losses(), static_cast<size_t>(batch_size_) * seq_len_,
                       compute_);
}

absl::Status ZeroCudaEngine::BackwardBlocks(bool first_micro_step, bool last_micro_step) {
  const int layers = arch_->num_layers();
  cudaStream_t comm_stream = comm_->stream();
  for (int l = layers - 1; l >= 0; --l) {
    const int slot = l % 2;
    if (l >= 1) {
      // Slot (l-1)%2 last held block l+1 (backward) or block l-1 (forward, for l = L-1).
      WEFT_RETURN_IF_ERROR(CommWaitsCompute());
      WEFT_RETURN_IF_ERROR(Gather(l, block_work_[(l - 1) % 2]));
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(gathered_[(l - 1) % 2], comm_stream));
    }
    // Block L-1's parameters are still in place from the forward.
    if (l < layers - 1) WEFT_RETURN_IF_ERROR(ComputeWaits(gathered_[slot]));
    WEFT_RETURN_IF_ERROR(model_->RecomputeBlock(l, block_work_[slot]));
    // The gradient buffer of this slot was last reduce-scattered for block l+2; in one slot,
    // for block l+1, whose reduce-scatter ran behind this block's recomputation.
    if (one_block_grad_slot_) {
      WEFT_RETURN_IF_ERROR(WaitForSlotScatters());
    } else if (scatter_pending_[slot]) {
      WEFT_RETURN_IF_ERROR(ComputeWaits(scattered_[slot]));
    }
    if (head_grad_takes_turns_ && l == layers - 1) {
      // The slots lie over the LM head's gradient: its reduce first (it ran behind this
      // block's recomputation), then the slots' padding, which the head's turn wrote, zeroed.
      WEFT_RETURN_IF_ERROR(ComputeWaits(head_scattered_));
      WEFT_RETURN_IF_ERROR(ZeroSlotPadding());
    }
    float* const grad = direct_grads_ ? units_[1 + l].grads : block_grad_[slot];
    // A slot buffer holds one micro-step's gradient; a direct one accumulates over the
    // micro-steps after the first. Overwriting needs no memset and no read of the old values.
    const bool accumulate = direct_grads_ && !first_micro_step;
    WEFT_RETURN_IF_ERROR(model_->BlockBackwardRecomputed(
        l, block_work_[slot], grad,
        accumulate ? cuda::GradWrite::kAccumulate : cuda::GradWrite::kOverwrite));
    if (!direct_grads_ || last_micro_step) WEFT_RETURN_IF_ERROR(CommWaitsCompute());
    if (!direct_grads_) {
      WEFT_RETURN_IF_ERROR(ReduceScatterGrad(1 + l, grad, !first_micro_step));
      WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(scattered_[slot], comm_stream));
      scatter_pending_[slot] = true;
    }
    // Behind the reduce-scatter (or the backward) of unit 1 + l, its shard gradient is final.
    if (last_micro_step) WEFT_RETURN_IF_ERROR(FinishShardGradient(1 + l));
  }
  return absl::OkStatus();
}

absl::Status ZeroCudaEngine::EmbeddingBackward() {
  if (ReducesClassifierGrad()) {
    // The LM head's gradient has left head_grad_ (the reduce above): the embedding's now, and
    // when the slots lie over it, once they have been reduce-scattered too (a tied head's
    // padding included: the slots wrote over it).
    WEFT_RETURN_IF_ERROR(ComputeWaits(head_scattered_));
    if (head_grad_takes_turns_) WEFT_RETURN_IF_ERROR(WaitForSlotScatters());
    const size_t zeroed = head_split_ > 0 ? InputPiece().size() : layout_.unit(0).padded;
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(head_grad_, 0, zeroed * sizeof(float), compute_));
  }
  return model_->EncoderBackward(direct_grads_ ? units_[0].grads : head_grad_);
}

absl::Status ZeroCudaEngine::ReduceEmbeddingGrad(bool first_micro_step, bool last_micro_step) {
  if (!direct_grads_ || last_micro_step) WEFT_RETURN_IF_ERROR(CommWaitsCompute());
  if (!direct_grads_) {
    // A tied head's LM head gradient is in the shard already, this micro-step's included.
    const bool tied_twice = head_split_ == 0 && head_grad_takes_turns_;
    WEFT_RETURN_IF_ERROR(ReduceHeadGrad(InputPiece(), !first_micro_step || tied_twice));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(head_scattered_, comm_->stream()));
    scatter_pending_[2] = true;
  }
  if (last_micro_step) WEFT_RETURN_IF_ERROR(FinishShardGradient(0));
  return absl::OkStatus();
}

// ---- optimizer step -------------------------------------------------------------------------

absl::StatusOr<StepResult> ZeroCudaEngine::TrainStep(int64_t step, const BatchFn& batch) {
  const auto wall_start = std::chrono::steady_clock::now();
  timing_.Reset();
  waits_.clear();
  phases_.clear();
  StepResult result;
  WEFT_RETURN_IF_ERROR(AccumulateGradients(step, batch));
  WEFT_RETURN_IF_ERROR(WaitForGradients());
  WEFT_ASSIGN_OR_RETURN(const size_t opt_begin, Mark());
  // The sum of squares is in stats_[0] already (the last micro-step's comm stream).
  // One all-reduce of [sum of squares, loss sum, targets that count].
  WEFT_RETURN_IF_ERROR(AllReduceStats());
  const auto& opt = spec_.optimizer();
  const int accum = spec_.training().grad_accum_steps();
  const size_t positions = static_cast<size_t>(batch_size_) * seq_len_;
  const double all_targets = static_cast<double>(world_) * accum * static_cast<double>(positions);
  WEFT_RETURN_IF_ERROR(cuda::ClipScale(grad_scale_, stats_, all_targets,
                                       static_cast<float>(opt.grad_clip_norm()), compute_));
  result.learning_rate = engine::LearningRate(spec_, step);
  const engine::AdamWConfig adamw = engine::AdamWConfigFromSpec(opt, result.learning_rate);
  WEFT_RETURN_IF_ERROR(CopyStatsToHost());
  WEFT_RETURN_IF_ERROR(optimizer_->Step(optimizer_steps_ + 1, adamw));
  WEFT_ASSIGN_OR_RETURN(const size_t opt_end, Mark());
  WEFT_RETURN_IF_ERROR(GatherPiecesOnReplica());
  WEFT_RETURN_IF_ERROR(comm_->WaitEvent(timing_.at(opt_end)));

  // stats_[1] sums per-position losses, ignored ones 0.
  const MaskedMean mean =
      MaskedMeanOf(host_stats_[1] / static_cast<double>(positions), host_stats_[3],
                   static_cast<int64_t>(world_) * accum, positions);
  result.loss = mean.loss;
  result.targets = mean.targets;
  // NaN stays NaN (std::max would hide it): ClipScale skipped the update for it.
  result.grad_norm = std::isnan(host_stats_[0])
                         ? host_stats_[0]
                         : mean.gradient_scale * std::sqrt(std::max(0.0f, host_stats_[0]));
  if (std::isfinite(result.grad_norm)) ++optimizer_steps_;
  if (model_->Fp8Counts() != nullptr) {
    const auto tally = [](const cuda::Fp8CastCounts& c) {
      return Fp8Tally{static_cast<int64_t>(c.values), static_cast<int64_t>(c.underflows),
                      static_cast<int64_t>(c.saturated)};
    };
    result.fp8_e4m3 = tally(HostFp8Counts()[0]);
    result.fp8_e5m2 = tally(HostFp8Counts()[1]);
  }
  result.timings = StepTimingsOf(opt_begin, opt_end, wall_start);
  return result;
}

absl::Status ZeroCudaEngine::AccumulateGradients(int64_t step, const BatchFn& batch) {
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stats_, 0, 3 * sizeof(float), compute_));
  const int accum = spec_.training().grad_accum_steps();
  const size_t positions = static_cast<size_t>(batch_size_) * seq_len_;
  // Each rank's backward is of (1 / (world * accum * B * T)) * its summed losses: the
  // reduce-scattered sum is then the gradient of the global mean loss over all positions
  // (ClipScale rescales it to the mean over the targets that count).
  const float grad_scale = 1.0f / static_cast<float>(static_cast<double>(world_) * accum *
                                                     static_cast<double>(positions));
  int64_t counted = 0;
  for (int micro = 0; micro < accum; ++micro) {
    const MicroBatch mb = Buffers();
    batch(step, micro, mb);
    counted += CountedTargets(mb, positions);
    WEFT_RETURN_IF_ERROR(MicroStep(mb, true, grad_scale, micro == 0, micro + 1 == accum));
  }
  return StageTargetCount(counted);
}

absl::Status ZeroCudaEngine::WaitForGradients() {
  // The optimizer needs every reduce-scatter (and accumulation) done.
  WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_done_, comm_->stream()));
  WEFT_RETURN_IF_ERROR(ComputeWaits(comm_done_));
  if (replica_ != nullptr) {  // and every replica all-reduce
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(replica_done_, replica_->stream()));
    WEFT_RETURN_IF_ERROR(ComputeWaits(replica_done_));
  }
  scatter_pending_[0] = scatter_pending_[1] = scatter_pending_[2] = false;
  return absl::OkStatus();
}

StepTimings ZeroCudaEngine::StepTimingsOf(
    size_t opt_begin, size_t opt_end,
    std::chrono::steady_clock::time_point wall_start) const {
  const auto elapsed = [&](size_t a, size_t b) {
    float ms = 0;
    cudaEventElapsedTime(&ms, timing_.at(a), timing_.at(b));
    return static_cast<double>(ms);
  };
  double exposed_forward = 0, exposed_backward = 0, exposed_total = 0, behind_update = 0;
  for (const auto& [begin, end, update] : waits_) {
    const double ms = elapsed(begin, end);
    (update ? behind_update : exposed_total) += ms;
    for (const auto& phase : phases_) {
      if (begin >= phase[0] && end <= phase[1]) exposed_forward += ms;
      if (begin >= phase[1] && end <= phase[2]) exposed_backward += ms;
    }
  }
  StepTimings timings;
  for (const auto& phase : phases_) {
    timings.forward_ms += elapsed(phase[0], phase[1]);
    timings.backward_ms += elapsed(phase[1], phase[2]);
  }
  timings.forward_ms -= exposed_forward;
  timings.backward_ms -= exposed_backward;
  timings.optimizer_ms = elapsed(opt_begin, opt_end) + behind_update;
  timings.exposed_comm_ms = exposed_total;
  timings.step_ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - wall_start)
                        .count();
  return timings;
}

absl::StatusOr<float> ZeroCudaEngine::EvalLoss(int batches, const BatchFn& batch) {
  timing_.Reset();
  waits_.clear();
  phases_.clear();
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(stats_, 0, 3 * sizeof(float), compute_));
  const size_t positions = static_cast<size_t>(batch_size_) * seq_len_;
  int64_t counted = 0;
  for (int i = 0; i < batches; ++i) {
    const MicroBatch mb = Buffers();
    batch(0, i, mb);
    counted += CountedTargets(mb, positions);
    WEFT_RETURN_IF_ERROR(MicroStep(mb, false, 1.0f, true, false));
  }
  WEFT_RETURN_IF_ERROR(StageTargetCount(counted));
  WEFT_RETURN_IF_ERROR(AllReduceStats());
  WEFT_RETURN_IF_ERROR(CopyStatsToHost());
  WEFT_RETURN_IF_ERROR(SyncCompute());
  return MaskedMeanOf(host_stats_[1] / static_cast<double>(positions), host_stats_[3],
                      static_cast<int64_t>(world_) * std::max(1, batches), positions)
      .loss;
}

absl::StatusOr<std::vector<float>> ZeroCudaEngine::GatherUnit(int u) {
  WEFT_RETURN_IF_ERROR(optimizer_->Flush());
  WEFT_RETURN_IF_ERROR(SyncPieces());
  const UnitShard& unit = layout_.unit(u);
  std::vector<float> out(unit.size);
  if (group_ == 1) {
    // The shard is the unit (on the device, or in pinned host memory when offloaded).
    WEFT_RETURN_IF_ERROR(SyncCompute());
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data(), units_[u].params, unit.size * sizeof(float),
                                         cudaMemcpyDefault));
    return out;
  }
  // Chunk by chunk of every rank's shard: gather_staging_ receives the world's pieces of a
  // chunk in rank order; rank r's piece is elements r * shard + offset onward of the unit.
  for (size_t offset = 0; offset < unit.shard; offset += gather_chunk_) {
    const size_t n = std::min(gather_chunk_, unit.shard - offset);
    const float* piece = units_[u].params + offset;
    if (Offloaded(u)) {
      // NCCL reads device memory: offloaded master weights go through a device buffer.
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(gather_source_, piece, n * sizeof(float),
                                                cudaMemcpyHostToDevice, compute_));
      piece = gather_source_;
    }
    WEFT_RETURN_IF_ERROR(CommWaitsCompute());
    WEFT_RETURN_IF_ERROR(CheckWork(comm_->AllGather(piece, gather_staging_, n,
                                                    DataType::kFloat32)));
    WEFT_CUDA_RETURN_IF_ERROR(cudaEventRecord(comm_done_, comm_->stream()));
    WEFT_RETURN_IF_ERROR(comm_->WaitEvent(comm_done_));
    for (int r = 0; r < group_; ++r) {
      const size_t begin = static_cast<size_t>(r) * unit.shard + offset;
      if (begin >= unit.size) break;  // the rest is padding
      const size_t count = std::min(n, unit.size - begin);
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpy(out.data() + begin, gather_staging_ + r * n,
                                           count * sizeof(float), cudaMemcpyDeviceToHost));
    }
  }
  return out;
}

float* ZeroCudaEngine::Kept(int u, model_io::UnitState state) const {
  const Unit& unit = units_[u];
  if (state == model_io::UnitState::kParams) return unit.params;
  return state == model_io::UnitState::kM ? unit.m : unit.v;
}

absl::Status ZeroCudaEngine::CopyKeptToHost(int u, model_io::UnitState state, size_t offset,
                                            size_t n, float* host) const {
  // Between steps: TrainStep returned only after the optimizer finished, or left its update
  // pending (run here first).
  WEFT_RETURN_IF_ERROR(optimizer_->Flush());
  WEFT_RETURN_IF_ERROR(SyncPieces());
  return cuda::CudaStatus(cudaMemcpy(host, Kept(u, state) + offset, n * sizeof(float),
                                     cudaMemcpyDefault),
                          "cudaMemcpy of a checkpoint shard");
}

absl::Status ZeroCudaEngine::CopyKeptFromHost(int u, model_io::UnitState state, const float* host) {
  // The restored state replaces what the pending update would have made of the unit's.
  optimizer_->Drop(u);
  WEFT_RETURN_IF_ERROR(SyncPieces());  // no gather in flight writes over what comes in
  return cuda::CudaStatus(cudaMemcpy(Kept(u, state), host,
                                     KeptStateElements(u, state) * sizeof(float),
                                     cudaMemcpyDefault),
                          "cudaMemcpy of a restored shard");
}

absl::Status ZeroCudaEngine::FinishRestore(const model_io::RangeReader&) {
  for (int u = 0; u < layout_.num_units(); ++u) {
    const Unit& unit = units_[u];
    const size_t shard = layout_.unit(u).shard;
    WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(unit.grads, 0, shard * sizeof(float), compute_));
    if (Offloaded(u)) {
      WEFT_RETURN_IF_ERROR(cuda::CastToBf16(unit.params_bf16, unit.params, shard, compute_));
    }
  }
  return SyncCompute();
}

}  // namespace weft::zero
