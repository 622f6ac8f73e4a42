#include "worker/engine/cuda/llama_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/engine/cuda/cuda_check.h"
#include "worker/engine/cuda/model_util.h"
#include "worker/engine/cuda/ops.h"

namespace weft::engine::cuda {
namespace {

// What the kernels cannot take, as "field: problem" (empty: fine).
std::string ShapeProblem(const LlamaConfig& c) {
  const int d = c.head_size();
  if (c.hidden_size % 8 != 0) {
    return absl::StrCat("model.hidden_size: the CUDA engine needs a multiple of 8, got ",
                        c.hidden_size);
  }
  if (!FlashAttentionSupported(d) || d % 16 != 0) {
    return absl::StrCat("model: the CUDA Llama needs a head size (hidden_size / num_heads) of 16, "
                        "32, 64 or 128, got ", d);
  }
  if (c.intermediate_size % 8 != 0) {
    return absl::StrCat("model.intermediate_size: the CUDA engine needs a multiple of 8, got ",
                        c.intermediate_size);
  }
  if (c.padded_vocab_size % 8 != 0) {
    return absl::StrCat("model.padded_vocab_size: the CUDA engine needs a multiple of 8, got ",
                        c.padded_vocab_size);
  }
  return "";
}

}  // namespace

LlamaCuda::LlamaCuda(const LlamaConfig& config, int max_b, int max_t, cudaStream_t stream)
    : config_(config), max_b_(max_b), max_t_(max_t), stream_(stream) {
  const LlamaArch arch(config);
  head_tensors_ = arch.UnitTensors(0);
  block_tensors_ = arch.UnitTensors(1);
}

LlamaCuda::~LlamaCuda() {
  if (arena_ != nullptr) cudaFree(arena_);
}

size_t LlamaCuda::Layout(char* base) {
  Arena a(base);
  const int layers = config_.num_layers;
  const size_t n = static_cast<size_t>(max_b_) * max_t_;
  const size_t nc = n * config_.hidden_size;
  const size_t n_qkv = n * config_.qkv_width();
  const size_t n_i = n * config_.intermediate_size;
  const size_t head_rows = static_cast<size_t>(max_b_) * config_.num_heads * max_t_;
  res_.resize(layers + 1);
  for (int l = 0; l <= layers; ++l) res_[l] = a.Take<bf16>(nc);
  for (auto* v : {&attn_norm_, &qkv_, &atty_, &res2_, &mlp_norm_, &gate_up_, &act_}) {
    v->resize(layers);
  }
  for (auto* v : {&attn_rstd_, &mlp_rstd_, &lse_}) v->resize(layers);
  for (int l = 0; l < layers; ++l) {
    attn_norm_[l] = a.Take<bf16>(nc);
    qkv_[l] = a.Take<bf16>(n_qkv);  // rotated q, k and v, read in place by flash attention
    atty_[l] = a.Take<bf16>(nc);
    res2_[l] = a.Take<bf16>(nc);
    mlp_norm_[l] = a.Take<bf16>(nc);
    gate_up_[l] = a.Take<bf16>(2 * n_i);
    act_[l] = a.Take<bf16>(n_i);
    attn_rstd_[l] = a.Take<float>(n);
    mlp_rstd_[l] = a.Take<float>(n);
    lse_[l] = a.Take<float>(head_rows);
  }
  final_norm_ = a.Take<bf16>(nc);
  final_rstd_ = a.Take<float>(n);
  dqkv_ = a.Take<bf16>(n_qkv);
  dgate_up_ = a.Take<bf16>(2 * n_i);
  dact_ = a.Take<bf16>(n_i);
  tmp_ = a.Take<bf16>(nc);
  dres_ = a.Take<bf16>(nc);
  dtmp_ = a.Take<bf16>(nc);
  logit_rows_ = LogitChunkRows(n, config_.padded_vocab_size);
  logits_ = a.Take<bf16>(static_cast<size_t>(logit_rows_) * config_.padded_vocab_size);
  losses_ = a.Take<float>(n);
  norm_scratch_ = a.Take<float>(RmsNormBackwardScratchFloats(static_cast<int>(n),
                                                             config_.hidden_size));
  flash_scratch_ = a.Take<float>(FlashAttentionBackwardScratchFloats(
      max_b_, config_.num_heads, max_t_, config_.head_size()));
  const size_t half = config_.head_size() / 2;
  rope_cos_ = a.Take<float>(static_cast<size_t>(max_t_) * half);
  rope_sin_ = a.Take<float>(static_cast<size_t>(max_t_) * half);
  inv_freq_ = a.Take<float>(half);
  tokens_ = a.Take<int32_t>(n);
  targets_ = a.Take<int32_t>(n);
  return a.size();
}

size_t LlamaCuda::PlanActivationBytes(const LlamaConfig& config, int max_b, int max_t) {
  LlamaCuda probe(config, max_b, max_t, nullptr);
  return probe.Layout(nullptr) + BlasOptions{}.workspace_bytes;
}

absl::StatusOr<std::unique_ptr<LlamaCuda>> LlamaCuda::Create(const LlamaConfig& config,
                                                             int max_b, int max_t,
                                                             cudaStream_t stream) {
  if (const std::string problem = ShapeProblem(config); !problem.empty()) {
    return absl::InvalidArgumentError(problem);
  }
  if (max_b <= 0 || max_t <= 0 || max_t > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch shape (", max_b, ", ", max_t,
                                                   ") out of range"));
  }
  std::unique_ptr<LlamaCuda> model(new LlamaCuda(config, max_b, max_t, stream));
  WEFT_RETURN_IF_ERROR(model->Allocate());
  WEFT_RETURN_IF_ERROR(model->BuildRopeTables());
  return model;
}

absl::Status LlamaCuda::Allocate() {
  WEFT_ASSIGN_OR_RETURN(blas_, Blas::Create());
  const size_t bytes = Layout(nullptr);
  WEFT_RETURN_IF_ERROR(AllocateActivations(bytes, &arena_));
  arena_bytes_ = bytes;
  Layout(static_cast<char*>(arena_));
  return absl::OkStatus();
}

absl::Status LlamaCuda::BuildRopeTables() {
  const std::vector<double> inv_freq = RopeInverseFrequencies(config_);
  // fp32 on the device, as Hugging Face keeps inv_freq.
  const std::vector<float> host(inv_freq.begin(), inv_freq.end());
  WEFT_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(inv_freq_, host.data(), host.size() * sizeof(float),
                                            cudaMemcpyHostToDevice, stream_));
  WEFT_RETURN_IF_ERROR(RopeTables(rope_cos_, rope_sin_, inv_freq_, max_t_,
                                  static_cast<int>(host.size()), stream_));
  // `host` dies here: the copy must have left it.
  WEFT_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status LlamaCuda::SetBatch(int b, int t, const int32_t* inputs, const int32_t* targets) {
  WEFT_RETURN_IF_ERROR(UploadBatch(b, t, max_b_, max_t_, inputs, targets, tokens_, targets_,
                                   stream_));
  b_ = b;
  t_ = t;
  return absl::OkStatus();
}

absl::Status LlamaCuda::EncoderForward(const bf16* head) {
  return EmbeddingForward(res_[0], tokens_, head + head_tensors_[kLlamaEmbed].offset, b_, t_,
                          config_.hidden_size, stream_);
}

absl::Status LlamaCuda::BlockForward(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int nh = config_.num_heads;
  const int nkv = config_.num_kv_heads;
  const int d = config_.head_size();
  const int inter = config_.intermediate_size;
  const int n = b_ * t_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  const bf16* x = res_[l];  // (B, T, C)
  WEFT_RETURN_IF_ERROR(
      RmsNormForward(attn_norm_[l], attn_rstd_[l], x, p(kLlamaAttnNorm), n, c, eps, stream_));
  bf16* qkv = qkv_[l];  // (B, T, (NH + 2 NKV) D)
  WEFT_RETURN_IF_ERROR(blas_->LinearForward(qkv, attn_norm_[l], p(kLlamaQkvw), nullptr, n, c,
                                            config_.qkv_width(), stream_));
  WEFT_RETURN_IF_ERROR(RopeForward(qkv, rope_cos_, rope_sin_, b_, t_, nh, nkv, d, stream_));
  WEFT_RETURN_IF_ERROR(
      FlashAttentionForward(atty_[l], lse_[l], qkv, b_, nh, nkv, t_, d, stream_));  // (B, T, C)
  WEFT_RETURN_IF_ERROR(blas_->LinearForward(tmp_, atty_[l], p(kLlamaAttnOut), nullptr, n,
                                            config_.q_width(), c, stream_));
  const int64_t nc = static_cast<int64_t>(n) * c;
  WEFT_RETURN_IF_ERROR(ResidualForward(res2_[l], x, tmp_, nc, stream_));
  WEFT_RETURN_IF_ERROR(RmsNormForward(mlp_norm_[l], mlp_rstd_[l], res2_[l], p(kLlamaMlpNorm), n,
                                      c, eps, stream_));
  WEFT_RETURN_IF_ERROR(blas_->LinearForward(gate_up_[l], mlp_norm_[l], p(kLlamaGateUp), nullptr,
                                            n, c, 2 * inter, stream_));  // (B, T, 2I)
  WEFT_RETURN_IF_ERROR(SwiGluForward(act_[l], gate_up_[l], n, inter, stream_));  // (B, T, I)
  WEFT_RETURN_IF_ERROR(
      blas_->LinearForward(tmp_, act_[l], p(kLlamaDown), nullptr, n, inter, c, stream_));
  return ResidualForward(res_[l + 1], res2_[l], tmp_, nc, stream_);
}

absl::Status LlamaCuda::Classifier(const bf16* head, float grad_scale, float* head_grad) {
  const int c = config_.hidden_size;
  const int vp = config_.padded_vocab_size;
  const int n = b_ * t_;
  const int lm = config_.tie_word_embeddings ? kLlamaEmbed : kLlamaLmHead;
  const bf16* weight = head + head_tensors_[lm].offset;  // (Vp, C)
  const bf16* last = res_[config_.num_layers];
  const bf16* norm_w = head + head_tensors_[kLlamaNorm].offset;
  WEFT_RETURN_IF_ERROR(RmsNormForward(final_norm_, final_rstd_, last, norm_w, n, c,
                                      static_cast<float>(config_.rms_norm_eps), stream_));
  for (int r0 = 0; r0 < n; r0 += logit_rows_) {
    const int rows = std::min(logit_rows_, n - r0);
    const bf16* normed = final_norm_ + static_cast<size_t>(r0) * c;  // (rows, C)
    WEFT_RETURN_IF_ERROR(
        blas_->LinearForward(logits_, normed, weight, nullptr, rows, c, vp, stream_));
    WEFT_RETURN_IF_ERROR(CrossEntropyForwardBackward(logits_, losses_ + r0, targets_ + r0, rows,
                                                     config_.vocab_size, vp, grad_scale,
                                                     stream_));  // logits -> dlogits
    if (head_grad == nullptr) continue;
    WEFT_RETURN_IF_ERROR(blas_->LinearBackwardInput(dtmp_ + static_cast<size_t>(r0) * c, logits_,
                                                    weight, rows, c, vp, stream_));
    WEFT_RETURN_IF_ERROR(blas_->LinearBackwardWeight(head_grad + head_tensors_[lm].offset,
                                                     logits_, normed, rows, c, vp, stream_));
  }
  if (head_grad == nullptr) return absl::OkStatus();
  // The residual stream's gradient starts here; RmsNormBackward accumulates into it.
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dres_, 0, static_cast<size_t>(n) * c * sizeof(bf16), stream_));
  return RmsNormBackward(dres_, head_grad + head_tensors_[kLlamaNorm].offset, dtmp_, last, norm_w,
                         final_rstd_, norm_scratch_, n, c, stream_);
}

absl::Status LlamaCuda::BlockBackward(int l, const bf16* block, float* block_grad) {
  const int c = config_.hidden_size;
  const int inter = config_.intermediate_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  const auto g = [&](int tensor) { return block_grad + block_tensors_[tensor].offset; };
  // dres_ (B, T, C) holds dL/d(output of block l) on entry, dL/d(input of block l) on exit.

  // MLP: out = res2 + down(swiglu(gate_up(mlp_norm(res2)))).
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardWeight(g(kLlamaDown), dres_, act_[l], n, inter, c, stream_));
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardInput(dact_, dres_, p(kLlamaDown), n, inter, c, stream_));  // (B,T,I)
  WEFT_RETURN_IF_ERROR(SwiGluBackward(dgate_up_, dact_, gate_up_[l], n, inter, stream_));
  WEFT_RETURN_IF_ERROR(blas_->LinearBackwardWeight(g(kLlamaGateUp), dgate_up_, mlp_norm_[l], n, c,
                                                   2 * inter, stream_));
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardInput(dtmp_, dgate_up_, p(kLlamaGateUp), n, c, 2 * inter, stream_));
  WEFT_RETURN_IF_ERROR(RmsNormBackward(dres_, g(kLlamaMlpNorm), dtmp_, res2_[l], p(kLlamaMlpNorm),
                                       mlp_rstd_[l], norm_scratch_, n, c, stream_));
  return AttentionBackward(l, block, block_grad);
}

absl::Status LlamaCuda::AttentionBackward(int l, const bf16* block, float* block_grad) {
  const int c = config_.hidden_size;
  const int nh = config_.num_heads;
  const int nkv = config_.num_kv_heads;
  const int d = config_.head_size();
  const int q_width = config_.q_width();
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_tensors_[tensor].offset; };
  const auto g = [&](int tensor) { return block_grad + block_tensors_[tensor].offset; };
  // res2 = x + attn_out(attention(rope(qkvw(attn_norm(x))))).
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardWeight(g(kLlamaAttnOut), dres_, atty_[l], n, q_width, c, stream_));
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardInput(dtmp_, dres_, p(kLlamaAttnOut), n, q_width, c, stream_));
  // dq, dk (of the rotated q, k) and dv land in dqkv_ at their places in qkv; then rotated back.
  WEFT_RETURN_IF_ERROR(FlashAttentionBackward(dqkv_, dtmp_, atty_[l], lse_[l], qkv_[l],
                                              flash_scratch_, b_, nh, nkv, t_, d, stream_));
  WEFT_RETURN_IF_ERROR(RopeBackward(dqkv_, rope_cos_, rope_sin_, b_, t_, nh, nkv, d, stream_));
  const int width = config_.qkv_width();
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardWeight(g(kLlamaQkvw), dqkv_, attn_norm_[l], n, c, width, stream_));
  WEFT_RETURN_IF_ERROR(
      blas_->LinearBackwardInput(dtmp_, dqkv_, p(kLlamaQkvw), n, c, width, stream_));
  return RmsNormBackward(dres_, g(kLlamaAttnNorm), dtmp_, res_[l], p(kLlamaAttnNorm),
                         attn_rstd_[l], norm_scratch_, n, c, stream_);
}

absl::Status LlamaCuda::EncoderBackward(float* head_grad) {
  return EmbeddingBackward(head_grad + head_tensors_[kLlamaEmbed].offset, dres_, tokens_, b_, t_,
                           config_.hidden_size, stream_);
}

}  // namespace weft::engine::cuda
