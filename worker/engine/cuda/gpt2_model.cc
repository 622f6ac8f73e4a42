#include "worker/engine/cuda/gpt2_model.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/model_util.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {

GptCuda::GptCuda(const GptConfig& config, int max_b, int max_t, CheckpointingPlan level,
                 cudaStream_t stream, ArenaRequests requests)
    : ArenaModel(max_b, max_t, level, stream, std::move(requests)),
      config_(config),
      flash_(FlashAttentionSupported(config.hidden_size / config.num_heads)) {
  head_tensors_ = UnitTensors(config, 0);
  block_tensors_ = UnitTensors(config, 1);
}

size_t GptCuda::Layout(char* base) {
  Arena a(base);
  const int layers = config_.num_layers;
  const size_t nc = static_cast<size_t>(max_b_) * max_t_ * config_.hidden_size;
  res_.resize(layers + 1);
  for (auto* vec : {&ln1_, &q_, &k_, &v_, &atty_, &res2_, &ln2_, &fch_, &fcg_}) vec->resize(layers);
  for (auto* vec : {&ln1_mean_, &ln1_rstd_, &ln2_mean_, &ln2_rstd_, &lse_}) vec->resize(layers);
  layer_qkv_.resize(layers);
  // The level's per-layer buffers (gpt2_model.h); what the plan's heaviest level does not keep
  // is taken once, here, and shared by every layer at that level.
  const bool keep_all = KeptPerLayer(level_.level, ActKind::kCheap);
  const bool keep_matmuls = KeptPerLayer(level_.level, ActKind::kSaved);
  const auto shared = [&](bool kept, size_t count) { return kept ? nullptr : a.Take<bf16>(count); };
  ClassifierSpare spare{a.NextOffset(), 0};
  SharedActivations s;
  s.atty = shared(keep_all, nc);
  // ln1 is never shared, and ln2 only at FULL (LateNorms).
  s.ln2 = shared(keep_matmuls, nc);
  s.fcg = shared(keep_all, 4 * nc);
  s.qkv = shared(keep_matmuls || !flash_, 3 * nc);
  s.q = shared(keep_matmuls || flash_, nc);
  s.k = shared(keep_matmuls || flash_, nc);
  s.v = shared(keep_matmuls || flash_, nc);
  s.res2 = shared(keep_matmuls, nc);
  s.fch = shared(keep_matmuls, 4 * nc);
  spare.end = a.size();
  // Layer by layer, its residual-stream entry then what its level keeps, so that the
  // gradients placed over spent layers (PlaceSpentActivationGradients) find them in order.
  std::vector<size_t> layer_ends(layers);
  for (int l = 0; l < layers; ++l) {
    TakeLayer(a, l, s);
    layer_ends[l] = a.size();
  }
  res_[layers] = a.Take<bf16>(nc);
  PlaceSpentActivationGradients(a, layer_ends);
  TakeCommon(a, config_.padded_vocab_size, config_.hidden_size, spare);
  TakeBackwardBuffers(a);
  // FP8's casts: fc's is the widest layer (4C) and the largest weight. A FULL recomputation
  // keeps the transposed casts of q/k/v, attproj and fc (it does not run fcproj); SELECTIVE's
  // runs no Linear layer.
  const size_t c = config_.hidden_size;
  const size_t n = static_cast<size_t>(max_b_) * max_t_;
  bool any_full = false;
  for (int l = 0; l < layers; ++l) any_full |= level_.At(l) == Checkpointing::kFull;
  size_t kept_bytes = 0;
  if (any_full) {
    kept_bytes = 3 * Fp8LinearScratch::KeptBytes(n * c);
    for (const size_t rows : {3 * c, c, 4 * c}) kept_bytes += Fp8LinearScratch::KeptBytes(rows * c);
  }
  TakeFp8Scratch(a, 4 * config_.hidden_size, 4 * c * c, kept_bytes);
  return a.size();
}

void GptCuda::TakeLayer(Arena& a, int l, const SharedActivations& s) {
  const size_t n = static_cast<size_t>(max_b_) * max_t_;
  const size_t nc = n * config_.hidden_size;
  const bool keep_all = KeptPerLayer(level_.At(l), ActKind::kCheap);
  const bool keep_matmuls = KeptPerLayer(level_.At(l), ActKind::kSaved);
  res_[l] = a.Take<bf16>(nc);
  ln1_[l] = keep_all ? a.Take<bf16>(nc) : nullptr;  // else over fch (below)
  if (flash_) {
    layer_qkv_[l] = a.TakeOr(keep_matmuls, s.qkv, 3 * nc);  // (B, T, 3C), read in place
  } else {
    q_[l] = a.TakeOr(keep_matmuls, s.q, nc);  // (B, NH, T, HS) head copies for the cuBLAS path
    k_[l] = a.TakeOr(keep_matmuls, s.k, nc);
    v_[l] = a.TakeOr(keep_matmuls, s.v, nc);
  }
  atty_[l] = a.TakeOr(keep_all, s.atty, nc);
  res2_[l] = a.TakeOr(keep_matmuls, s.res2, nc);
  fch_[l] = a.TakeOr(keep_matmuls, s.fch, 4 * nc);
  fcg_[l] = a.TakeOr(keep_all, s.fcg, 4 * nc);
  if (!keep_all) {
    // LateNorms: in a (re)computed forward, LN1's output is read by the qkv GEMM before the
    // fc GEMM writes fch, and at SELECTIVE LN2's only by the fc GEMM, atty's last reader
    // being the attention projection before it.
    ln1_[l] = fch_[l];
    ln2_[l] = keep_matmuls ? atty_[l] : s.ln2;
  } else {
    ln2_[l] = a.Take<bf16>(nc);
  }
  ln1_mean_[l] = a.Take<float>(n);
  ln1_rstd_[l] = a.Take<float>(n);
  ln2_mean_[l] = a.Take<float>(n);
  ln2_rstd_[l] = a.Take<float>(n);
  lse_[l] = a.Take<float>(static_cast<size_t>(max_b_) * config_.num_heads * max_t_);
}

void GptCuda::TakeBackwardBuffers(Arena& a) {
  const int c = config_.hidden_size;
  const size_t n = static_cast<size_t>(max_b_) * max_t_;
  const size_t nc = n * c;
  const size_t head_rows = static_cast<size_t>(max_b_) * config_.num_heads * max_t_;
  lnf_ = TakeBeforeBackward<bf16>(a, nc);
  dlnf_ = TakeBeforeBackward<bf16>(a, nc);
  lnf_mean_ = TakeBeforeBackward<float>(a, n);
  lnf_rstd_ = TakeBeforeBackward<float>(a, n);
  if (flash_) {
    flash_scratch_ = a.Take<float>(FlashAttentionBackwardScratchFloats(
        max_b_, config_.num_heads, max_t_, c / config_.num_heads));
  } else {
    qkv_ = a.Take<bf16>(3 * nc);  // the forward's qkv, split into head copies
    y_ = a.Take<bf16>(nc);
    att_ = a.Take<bf16>(head_rows * max_t_);
    datt_ = a.Take<bf16>(head_rows * max_t_);
    dq_ = a.Take<bf16>(nc);
    dk_ = a.Take<bf16>(nc);
    dv_ = a.Take<bf16>(nc);
  }
  dres_ = a.Take<bf16>(nc);
  size_t scratch = LayerNormBackwardScratchFloats(static_cast<int>(n), c);
  for (int oc : {c, 3 * c, 4 * c}) {
    scratch = std::max(scratch, BiasBackwardScratchFloats(static_cast<int>(n), oc));
  }
  reduce_scratch_ = a.Take<float>(scratch);
}

size_t GptCuda::PlanActivationBytes(const GptConfig& config, int max_b, int max_t,
                                    CheckpointingPlan level,
                                    const ArenaRequests& requests) {
  GptCuda probe(config, max_b, max_t, level, nullptr, requests);
  return probe.PlannedBytes();
}

absl::StatusOr<std::unique_ptr<GptCuda>> GptCuda::Create(
    const GptConfig& config, int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
    const ArenaRequests& requests) {
  if (requests.fp8_linears && config.hidden_size % 16 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: FP8's GEMMs need hidden_size a multiple of 16, got ", config.hidden_size));
  }
  if (config.hidden_size % 8 != 0 || config.hidden_size % config.num_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.hidden_size: the CUDA engine needs a multiple of 8 that num_heads divides, got ",
        config.hidden_size, " with ", config.num_heads, " heads"));
  }
  if ((config.hidden_size / config.num_heads) % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model: the CUDA engine needs a head size (hidden_size / num_heads) that is a multiple "
        "of 8, got ", config.hidden_size / config.num_heads));
  }
  if (config.padded_vocab_size % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.padded_vocab_size: the CUDA engine needs a multiple of 8, got ",
        config.padded_vocab_size));
  }
  if (max_b <= 0 || max_t <= 0 || max_t > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch shape (", max_b, ", ", max_t,
                                                   ") out of range"));
  }
  std::unique_ptr<GptCuda> model(
      new GptCuda(config, max_b, max_t, level, stream, requests));
  WEFT_RETURN_IF_ERROR(model->Allocate());
  return model;
}

absl::Status GptCuda::EncoderForward(const bf16* head) {
  if (Positions() != nullptr) {
    // The position embedding's backward sums over b per position, deterministically; a
    // gather by position is not written yet.
    return absl::UnimplementedError(
        "data.reset_positions: GPT-2's position embedding restarted per document runs on the "
        "CPU engine only; on CUDA keep document masking without reset_positions");
  }
  return cuda::EncoderForward(res_[0], tokens_, head + head_tensors_[kWte].offset,
                              head + head_tensors_[kWpe].offset, b_, t_, config_.hidden_size,
                              stream_);
}

absl::Status GptCuda::BlockForward(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  WEFT_RETURN_IF_ERROR(AttentionForward(l, block));
  WEFT_RETURN_IF_ERROR(MlpForwardToActivation(l, block));
  // out = res2 + fcproj(fcg), the residual added in the GEMM's epilogue.
  return Linear(res_[l + 1], fcg_[l], p(kFcprojw), p(kFcprojb), res2_[l], n, 4 * c, c);
}

absl::Status GptCuda::AttentionForward(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  const bf16* x = res_[l];  // (B, T, C)
  // res2 = x + attproj(attention(qkv(ln1(x)))).
  WEFT_RETURN_IF_ERROR(LayerNormForward(ln1_[l], ln1_mean_[l], ln1_rstd_[l], x, p(kLn1w),
                                        p(kLn1b), n, c, stream_));
  // Flash: qkv is kept per layer and the kernel reads q, k, v from it in place; cuBLAS: split
  // into head copies.
  bf16* qkv = flash_ ? layer_qkv_[l] : qkv_;
  WEFT_RETURN_IF_ERROR(
      Linear(qkv, ln1_[l], p(kQkvw), p(kQkvb), nullptr, n, c, 3 * c));  // (B, T, 3C)
  if (!flash_) {
    WEFT_RETURN_IF_ERROR(AttentionSplitHeads(q_[l], k_[l], v_[l], qkv, b_, t_, c,
                                             config_.num_heads, stream_));
  }
  WEFT_RETURN_IF_ERROR(Attend(l));
  return Linear(res2_[l], atty_[l], p(kAttprojw), p(kAttprojb), x, n, c, c);
}

absl::Status GptCuda::Attend(int l) {
  const int c = config_.hidden_size;
  const int nh = config_.num_heads;
  const int hs = c / nh;
  if (flash_) {
    return FlashAttentionForward(atty_[l], lse_[l], layer_qkv_[l], DocStarts(), /*window=*/0, b_,
                                 nh, nh, t_, hs,
                                 stream_);  // (B, T, C)
  }
  const int batch = b_ * nh;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  WEFT_RETURN_IF_ERROR(blas_->AttentionScores(att_, q_[l], k_[l], batch, t_, hs, stream_));
  WEFT_RETURN_IF_ERROR(CausalSoftmaxForward(att_, lse_[l], DocStarts(), /*window=*/0,
                                            static_cast<int64_t>(batch) * t_, t_, nh, scale,
                                            stream_));  // (B, NH, T, T)
  WEFT_RETURN_IF_ERROR(blas_->AttentionApply(y_, att_, v_[l], batch, t_, hs, stream_));
  return AttentionMergeHeads(atty_[l], y_, b_, t_, c, nh, stream_);  // (B, T, C)
}

absl::Status GptCuda::MlpForwardToActivation(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  // fcg = gelu(fch), fch = fc(ln2(res2)).
  WEFT_RETURN_IF_ERROR(LayerNormForward(ln2_[l], ln2_mean_[l], ln2_rstd_[l], res2_[l], p(kLn2w),
                                        p(kLn2b), n, c, stream_));
  return LinearGelu(fcg_[l], fch_[l], ln2_[l], p(kFcw), p(kFcb), n, c, 4 * c);  // (B, T, 4C) each
}

absl::Status GptCuda::RecomputeSelective(int l, const bf16* block) {
  (void)block;  // the LayerNorms come back later, where their outputs are read (LateNorms)
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  WEFT_RETURN_IF_ERROR(Attend(l));
  // The standalone GELU of the kept bf16 pre-activation: equal to the GEMM epilogue's GELU to
  // bf16 rounding, not bit for bit (the epilogue sees the fp32 accumulator).
  return GeluForward(fcg_[l], fch_[l], static_cast<int64_t>(n) * 4 * c, stream_);
}

absl::Status GptCuda::Classifier(const bf16* head, float grad_scale, float* head_grad) {
  const int c = config_.hidden_size;
  const int vp = config_.padded_vocab_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return head + head_tensors_[tensor].offset; };
  const bf16* last = res_[config_.num_layers];
  WEFT_RETURN_IF_ERROR(
      LayerNormForward(lnf_, lnf_mean_, lnf_rstd_, last, p(kLnfw), p(kLnfb), n, c, stream_));
  WEFT_RETURN_IF_ERROR(LmHeadLoss(lnf_, p(kWte),
                                  head_grad == nullptr ? nullptr
                                                       : head_grad + head_tensors_[kWte].offset,
                                  dlnf_, c, config_.vocab_size, vp, grad_scale));
  if (head_grad == nullptr) return absl::OkStatus();
  // The residual stream's gradient starts here; LayerNormBackward accumulates into it.
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dres_, 0, static_cast<size_t>(n) * c * sizeof(bf16), stream_));
  return LayerNormBackward(dres_, head_grad + head_tensors_[kLnfw].offset,
                           head_grad + head_tensors_[kLnfb].offset, dlnf_, last, p(kLnfw),
                           lnf_mean_, lnf_rstd_, reduce_scratch_, n, c, stream_);
}

absl::Status GptCuda::BlockBackwardRecomputed(int l, const bf16* block, float* block_grad,
                                              GradWrite write) {
  const int c = config_.hidden_size;
  const int nh = config_.num_heads;
  const int hs = c / nh;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  const auto g = [&](int tensor) { return block_grad + block_tensors_[tensor].offset; };
  // The GEMMs overwrite when asked; the bias and LayerNorm kernels only accumulate, so their
  // (small) gradients are zeroed first. Zeroing the whole unit instead cost a write and a read
  // of its fp32 gradient: 1.6 GB a block at 6.7B.
  const bool acc = write == GradWrite::kAccumulate;
  if (!acc) {
    for (const int small : {kLn1w, kLn1b, kQkvb, kAttprojb, kLn2w, kLn2b, kFcb, kFcprojb}) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(
          g(small), 0, block_tensors_[small].size * sizeof(float), stream_));
    }
  }
  // dres_ (B, T, C) holds dL/d(output of block l) on entry, dL/d(input of block l) on exit.

  // MLP: out = res2 + fcproj(gelu(fc(ln2(res2)))).
  WEFT_RETURN_IF_ERROR(BiasBackward(g(kFcprojb), dres_, reduce_scratch_, n, c, stream_));
  // d(pre-GELU fc output) (B, T, 4C). The GELU output is read for the last time by fcproj's
  // weight gradient, so this takes its place: no (B, T, 4C) scratch (256 MiB at 6.7B, 8 x
  // 1024 rows). Not over fch_[l]: the GELU backward reads it.
  bf16* const dfch = fcg_[l];
  WEFT_RETURN_IF_ERROR(LinearBackwardGelu(dfch, g(kFcprojw), acc, dres_, fcg_[l], fch_[l],
                                          p(kFcprojw), n, 4 * c, c));
  // fch has been read for the last time: the late LayerNorm outputs and the sub-layers' input
  // gradients, (B, T, C) each, lie over it.
  bf16* const late_norm = fch_[l];
  bf16* const dx = fch_[l] + static_cast<size_t>(n) * c;
  const bool late_ln1 = !KeptPerLayer(level_.At(l), ActKind::kCheap);
  const bool late_ln2 = late_ln1 && KeptPerLayer(level_.At(l), ActKind::kSaved);
  const NormLinear fc{kLn2w, kLn2b, kFcw, kFcb, res2_[l], ln2_mean_[l], ln2_rstd_[l],
                      late_ln2 ? nullptr : ln2_[l]};
  WEFT_RETURN_IF_ERROR(
      NormLinearBackward(fc, dfch, 4 * c, block, block_grad, acc, late_norm, dx));
  // Attention: res2 = x + attproj(attention(qkv(ln1(x)))).
  WEFT_RETURN_IF_ERROR(BiasBackward(g(kAttprojb), dres_, reduce_scratch_, n, c, stream_));
  WEFT_RETURN_IF_ERROR(
      LinearBackward(dx, g(kAttprojw), acc, dres_, atty_[l], p(kAttprojw), n, c, c));
  // dfch has been read for the last time: dqkv (B, T, 3C) lies over it, 192 MiB at GPT 6.7B's
  // shape not taken for a scratch of its own.
  bf16* const dqkv = dfch;
  if (flash_) {
    // Straight from the (B, T, C) dy = dx and forward output atty, and the layer's qkv:
    // dq, dk, dv land in dqkv at the places of q, k, v.
    WEFT_RETURN_IF_ERROR(FlashAttentionBackward(dqkv, dx, atty_[l], lse_[l], layer_qkv_[l],
                                                DocStarts(), /*window=*/0, flash_scratch_, b_, nh,
                                                nh, t_, hs, stream_));
  } else {
    WEFT_RETURN_IF_ERROR(AttentionSplitGrad(y_, dx, b_, t_, c, nh, stream_));  // dy
    const int batch = b_ * nh;
    const int64_t rows = static_cast<int64_t>(batch) * t_;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    WEFT_RETURN_IF_ERROR(blas_->AttentionScores(att_, q_[l], k_[l], batch, t_, hs, stream_));
    WEFT_RETURN_IF_ERROR(CausalSoftmaxRecompute(att_, lse_[l], DocStarts(), /*window=*/0, rows, t_,
                                                nh, scale, stream_));  // P
    WEFT_RETURN_IF_ERROR(
        blas_->AttentionScores(datt_, y_, v_[l], batch, t_, hs, stream_));  // dP
    WEFT_RETURN_IF_ERROR(
        blas_->AttentionApplyTransposed(dv_, att_, y_, batch, t_, hs, stream_));  // P^T dy
    WEFT_RETURN_IF_ERROR(CausalSoftmaxBackward(datt_, att_, DocStarts(), /*window=*/0, rows, t_, nh,
                                               scale, stream_));  // dS
    WEFT_RETURN_IF_ERROR(blas_->AttentionApply(dq_, datt_, k_[l], batch, t_, hs, stream_));
    WEFT_RETURN_IF_ERROR(
        blas_->AttentionApplyTransposed(dk_, datt_, q_[l], batch, t_, hs, stream_));
    WEFT_RETURN_IF_ERROR(AttentionMergeGrads(dqkv, dq_, dk_, dv_, b_, t_, c, nh, stream_));
  }
  const NormLinear qkv{kLn1w, kLn1b, kQkvw, kQkvb, res_[l], ln1_mean_[l], ln1_rstd_[l],
                       late_ln1 ? nullptr : ln1_[l]};
  return NormLinearBackward(qkv, dqkv, 3 * c, block, block_grad, acc, late_norm, dx);
}

absl::Status GptCuda::NormLinearBackward(const NormLinear& s, const bf16* dout, int oc,
                                         const bf16* block, float* block_grad, bool accumulate,
                                         bf16* late_norm, bf16* dx) {
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  const auto g = [&](int tensor) { return block_grad + block_tensors_[tensor].offset; };
  const bf16* normed = s.kept;
  if (normed == nullptr) {  // LateNorms
    WEFT_RETURN_IF_ERROR(LayerNormForward(late_norm, s.mean, s.rstd, s.input, p(s.ln_weight),
                                          p(s.ln_bias), n, c, stream_));
    normed = late_norm;
  }
  WEFT_RETURN_IF_ERROR(BiasBackward(g(s.bias), dout, reduce_scratch_, n, oc, stream_));
  WEFT_RETURN_IF_ERROR(
      LinearBackward(dx, g(s.weight), accumulate, dout, normed, p(s.weight), n, c, oc));
  return LayerNormBackward(dres_, g(s.ln_weight), g(s.ln_bias), dx, s.input, p(s.ln_weight),
                           s.mean, s.rstd, reduce_scratch_, n, c, stream_);
}

absl::Status GptCuda::EncoderBackward(float* head_grad) {
  return cuda::EncoderBackward(head_grad + head_tensors_[kWte].offset,
                               head_grad + head_tensors_[kWpe].offset, dres_, embedding_plan_,
                               embedding_plan_device_, embedding_scratch_, b_, t_,
                               config_.hidden_size, stream_);
}

}  // namespace weft::engine::cuda
