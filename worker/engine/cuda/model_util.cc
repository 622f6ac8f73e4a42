#include "worker/engine/cuda/model_util.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/ops.h"
#include "worker/engine/documents.h"

namespace weft::engine::cuda {
namespace {

// Budget for one chunk of logits (rows x Vp bf16): large enough for efficient LM-head GEMMs,
// small enough that the (B*T, Vp) logits of a whole micro-batch never exist at once.
constexpr size_t kLogitChunkBytes = size_t{512} << 20;

}  // namespace

ArenaModel::~ArenaModel() {
  if (arena_ != nullptr) cudaFree(arena_);
}

void ArenaModel::TakeCommon(Arena& arena, int vp, int c, ClassifierSpare spare) {
  vp_ = vp;
  const size_t n = static_cast<size_t>(max_b_) * max_t_;
  const size_t row_bytes = static_cast<size_t>(vp) * sizeof(bf16);
  // The chunk's rows do not depend on where it lives: they set the order in which the LM
  // head's gradient sums its chunks, which every checkpointing level must share to stay
  // bit-identical to the others.
  logit_rows_ = static_cast<int>(std::clamp<size_t>(kLogitChunkBytes / row_bytes, 1, n));
  const size_t chunk_bytes = static_cast<size_t>(logit_rows_) * row_bytes;
  // The head is gathered before the forward and read by the classifier: the room first, for
  // the one buffer that has no other place to go.
  head_work_ = requests_.head_work_elements == 0
                   ? nullptr
                   : TakeBeforeBackward<bf16>(arena, requests_.head_work_elements);
  // An empty spare (no shared buffers) may end before the aligned offset it began at.
  if (spare.end > spare.begin && spare.end - spare.begin >= chunk_bytes) {
    logits_ = reinterpret_cast<bf16*>(arena.At(spare.begin));
  } else {
    logits_ = TakeBeforeBackward<bf16>(arena, static_cast<size_t>(logit_rows_) * vp);
  }
  losses_ = arena.Take<float>(n);
  tokens_ = arena.Take<int32_t>(n);
  targets_ = arena.Take<int32_t>(n);
  doc_starts_ = arena.Take<int32_t>(n);
  positions_ = arena.Take<int32_t>(n);
  embedding_plan_device_ = arena.Take<int32_t>(EmbeddingGradPlanMaxInts(static_cast<int>(n)));
  embedding_scratch_ = arena.Take<float>(EmbeddingGradScratchFloats(static_cast<int>(n), c));
}

void ArenaModel::PlaceSpentActivationGradients(Arena& arena,
                                               const std::vector<size_t>& layer_ends) {
  const std::vector<size_t>& bytes = requests_.spent_grad_bytes;
  spent_grads_.assign(bytes.size(), nullptr);
  size_t end = 0;
  for (size_t l = 0; l < bytes.size() && l < layer_ends.size(); ++l) {
    const size_t begin = (std::max(end, layer_ends[l]) + 255) / 256 * 256;
    spent_grads_[l] = reinterpret_cast<float*>(arena.At(begin));
    end = begin + bytes[l];
  }
  room_ = {arena.size(), std::max(arena.size(), end)};
  arena.ExtendTo(end);
}

absl::Status ArenaModel::Allocate() {
  WEFT_ASSIGN_OR_RETURN(blas_, Blas::Create());
  const size_t bytes = RunLayout(nullptr);
  const cudaError_t err = cudaMalloc(&arena_, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the (non-sticky) allocation error
    arena_ = nullptr;
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(absl::StrCat("activations need ", bytes >> 20,
                                                     " MiB but the GPU has ", free_bytes >> 20,
                                                     " MiB free"));
  }
  arena_bytes_ = bytes;
  RunLayout(static_cast<char*>(arena_));
  if (requests_.fp8_linears) {
    fp8_ = std::make_unique<Fp8Linears>(blas_.get(), fp8_scratch_);
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaMemsetAsync(fp8_scratch_.counts, 0, 2 * sizeof(Fp8CastCounts), stream_));
  }
  return absl::OkStatus();
}

void ArenaModel::TakeFp8Scratch(Arena& arena, int max_width, size_t max_weight, size_t kept_bytes) {
  if (!requests_.fp8_linears) return;
  const int rows = max_b_ * max_t_;
  const size_t at = arena.NextOffset();
  arena.ExtendTo(at + Fp8LinearScratch::Bytes(rows, max_width, max_weight, kept_bytes));
  fp8_scratch_ = Fp8LinearScratch::At(arena.At(at), rows, max_width, max_weight, kept_bytes);
}

absl::Status ArenaModel::Linear(bf16* out, const bf16* inp, const bf16* weight, const bf16* bias,
                                const bf16* residual, int n, int c, int oc) {
  if (fp8_ != nullptr) return fp8_->Forward(out, inp, weight, bias, residual, n, c, oc, stream_);
  if (residual != nullptr) {
    return blas_->LinearForwardResidual(out, inp, weight, bias, residual, n, c, oc, stream_);
  }
  return blas_->LinearForward(out, inp, weight, bias, n, c, oc, stream_);
}

absl::Status ArenaModel::LinearBackward(bf16* dinp, float* dweight, bool accumulate,
                                        const bf16* dout, const bf16* inp, const bf16* weight,
                                        int n, int c, int oc) {
  if (fp8_ != nullptr) {
    return fp8_->Backward(dinp, dweight, accumulate, dout, inp, weight, n, c, oc, stream_);
  }
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardWeight(dweight, dout, inp, n, c, oc, accumulate, stream_));
  return blas_->LinearBackwardInput(dinp, dout, weight, n, c, oc, stream_);
}

absl::Status ArenaModel::LinearGelu(bf16* out, bf16* pre, const bf16* inp, const bf16* weight,
                                    const bf16* bias, int n, int c, int oc) {
  if (fp8_ == nullptr) {
    return blas_->LinearForwardGelu(out, pre, inp, weight, bias, n, c, oc, stream_);
  }
  WEFT_RETURN_IF_ERROR(fp8_->Forward(pre, inp, weight, bias, nullptr, n, c, oc, stream_));
  return GeluForward(out, pre, static_cast<int64_t>(n) * oc, stream_);
}

absl::Status ArenaModel::LinearBackwardGelu(bf16* dpre, float* dweight, bool accumulate,
                                            const bf16* dout, const bf16* act, const bf16* pre,
                                            const bf16* weight, int n, int c, int oc) {
  if (fp8_ == nullptr) {
    WEFT_RETURN_IF_ERROR(
        blas_->LinearBackwardWeight(dweight, dout, act, n, c, oc, accumulate, stream_));
    return blas_->LinearBackwardInputGelu(dpre, dout, weight, pre, n, c, oc, stream_);
  }
  // dgelu (N, C) lands in dpre, then the GELU backward in place.
  WEFT_RETURN_IF_ERROR(
      fp8_->Backward(dpre, dweight, accumulate, dout, act, weight, n, c, oc, stream_));
  return GeluBackwardOverwrite(dpre, pre, dpre, static_cast<int64_t>(n) * c, stream_);
}

absl::Status ArenaModel::SetBatch(int b, int t, const int32_t* inputs, const int32_t* targets,
                                  const int32_t* doc_starts, bool reset_positions) {
  if (b < 1 || b > max_b_ || t < 1 || t > max_t_) {
    return absl::InvalidArgumentError(absl::StrCat("batch shape (", b, ", ", t, ") outside [1, ",
                                                   max_b_, "] x [1, ", max_t_, "]"));
  }
  b_ = b;
  t_ = t;
  const size_t bytes = static_cast<size_t>(b) * t * sizeof(int32_t);
  // Pageable sources: the call returns once the data is staged, so the caller may refill them.
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(tokens_, inputs, bytes, cudaMemcpyHostToDevice, stream_));
  if (targets != nullptr) {
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(targets_, targets, bytes, cudaMemcpyHostToDevice, stream_));
  }
  has_documents_ = doc_starts != nullptr;
  reset_positions_ = has_documents_ && reset_positions;
  if (has_documents_) {
    host_positions_.resize(static_cast<size_t>(b) * t);
    if (const int64_t bad = DocumentPositions(doc_starts, b, t, host_positions_.data());
        bad >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("doc_starts[", bad / t, ", ", bad % t, "] = ", doc_starts[bad],
                       " does not segment the row (each must be t or the previous one's)"));
    }
    WEFT_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(doc_starts_, doc_starts, bytes, cudaMemcpyHostToDevice, stream_));
    if (reset_positions_) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(positions_, host_positions_.data(), bytes,
                                                cudaMemcpyHostToDevice, stream_));
    }
  }
  // Only a backward reads it; building it is a counting sort of b * t tokens.
  WEFT_ASSIGN_OR_RETURN(embedding_plan_, PlanEmbeddingGrad(inputs, b * t, vp_));
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(embedding_plan_device_, embedding_plan_.data.data(),
                                            embedding_plan_.data.size() * sizeof(int32_t),
                                            cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status ArenaModel::LmHeadLoss(const bf16* normed, const bf16* weight, float* dweight,
                                    bf16* dnormed, int c, int v, int vp, float grad_scale) {
  const int n = b_ * t_;
  for (int r0 = 0; r0 < n; r0 += logit_rows_) {
    const int rows = std::min(logit_rows_, n - r0);
    const bf16* chunk = normed + static_cast<size_t>(r0) * c;  // (rows, C)
    WEFT_RETURN_IF_ERROR(blas_->LinearForward(logits_, chunk, weight, nullptr, rows, c, vp,
                                              stream_));
    WEFT_RETURN_IF_ERROR(CrossEntropyForwardBackward(logits_, losses_ + r0, targets_ + r0, rows,
                                                     v, vp, grad_scale,
                                                     stream_));  // logits -> dlogits
    if (dweight == nullptr) continue;
    WEFT_RETURN_IF_ERROR(blas_->LinearBackwardInput(dnormed + static_cast<size_t>(r0) * c,
                                                    logits_, weight, rows, c, vp, stream_));
    WEFT_RETURN_IF_ERROR(
        blas_->LinearBackwardWeight(dweight, logits_, chunk, rows, c, vp, true, stream_));
  }
  return absl::OkStatus();
}

absl::Status ArenaModel::RecomputeBlock(int l, const bf16* block) {
  // The backward of block l comes next and reads the same inputs and weights (model.h): what
  // the recomputation casts serves it too. Keeping starts afresh even at kNone, so that nothing
  // kept for another block can be found.
  if (fp8_ != nullptr) fp8_->StartKeeping();
  absl::Status status = absl::InternalError("unknown activation checkpointing level");
  switch (level_.At(l)) {
    case Checkpointing::kNone:
      status = absl::OkStatus();
      break;
    case Checkpointing::kFull:
      status = AttentionForward(l, block);
      if (status.ok()) status = MlpForwardToActivation(l, block);
      break;
    case Checkpointing::kSelective:
      status = RecomputeSelective(l, block);
      break;
  }
  if (fp8_ != nullptr) fp8_->StopKeeping();
  return status;
}

}  // namespace weft::engine::cuda
