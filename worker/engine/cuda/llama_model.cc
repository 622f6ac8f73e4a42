#include "worker/engine/cuda/llama_model.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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
    return absl::StrCat(
        "model.head_dim: the CUDA engine needs a head size (head_dim, or "
        "hidden_size / num_heads) of 16, 32, 64 or 128, got ",
        d);
  }
  if (c.intermediate_size % 8 != 0) {
    return absl::StrCat("model.intermediate_size: the CUDA engine needs a multiple of 8, got ",
                        c.intermediate_size);
  }
  // The backward lays the sub-layers' input gradients (C and Q wide) over the SwiGLU output
  // (I wide) and dqkv over gate_up (2I wide): true of every published shape.
  if (c.intermediate_size < std::max(c.hidden_size, c.q_width()) ||
      2 * c.intermediate_size < c.qkv_width()) {
    return absl::StrCat("model.intermediate_size: the CUDA engine needs at least hidden_size, ",
                        "num_heads x head_dim and half the q/k/v width, got ", c.intermediate_size);
  }
  if (c.padded_vocab_size % 8 != 0) {
    return absl::StrCat("model.padded_vocab_size: the CUDA engine needs a multiple of 8, got ",
                        c.padded_vocab_size);
  }
  return "";
}

}  // namespace

LlamaCuda::LlamaCuda(const LlamaConfig& config, int max_b, int max_t, CheckpointingPlan level,
                     cudaStream_t stream, ArenaRequests requests)
    : ArenaModel(max_b, max_t, level, stream, std::move(requests)), config_(config) {
  const LlamaArch arch(config);
  head_tensors_ = arch.UnitTensors(0);
  block_offsets_ = arch.BlockOffsets();
  head_output_begin_ = arch.HeadOutputBegin();
}

size_t LlamaCuda::Layout(char* base) {
  Arena a(base);
  const int layers = config_.num_layers;
  const size_t n = static_cast<size_t>(max_b_) * max_t_;
  const size_t nc = n * config_.hidden_size;
  const size_t nq = n * config_.q_width();
  const size_t n_qkv = n * config_.qkv_width();
  // Qwen3's q and k before their head norms (what the norms' backward reads); else nothing.
  const size_t n_qk_raw =
      config_.qk_norm() ? n * (config_.num_heads + config_.num_kv_heads) * config_.head_size() : 0;
  const size_t n_i = n * config_.intermediate_size;
  const size_t head_rows = static_cast<size_t>(max_b_) * config_.num_heads * max_t_;
  res_.resize(layers + 1);
  // The level's per-layer buffers; what the plan's heaviest level does not keep is taken once,
  // here, and shared by the layers at that level.
  bool keep_all = KeptPerLayer(level_.level, ActKind::kCheap);
  bool keep_matmuls = KeptPerLayer(level_.level, ActKind::kSaved);
  Saved shared{};
  ClassifierSpare spare{a.NextOffset(), 0};
  shared.attn_norm = keep_all ? nullptr : a.Take<bf16>(nc);
  // Attention's output is kept with the matmul outputs, the mid-block residual recomputed
  // with the cheap ones (llama_model.h says why).
  shared.atty = keep_matmuls ? nullptr : a.Take<bf16>(nq);
  shared.mlp_norm = keep_all ? nullptr : a.Take<bf16>(nc);
  shared.act = keep_all ? nullptr : a.Take<bf16>(n_i);
  shared.qkv = keep_matmuls ? nullptr : a.Take<bf16>(n_qkv);
  shared.qk_raw = keep_matmuls || n_qk_raw == 0 ? nullptr : a.Take<bf16>(n_qk_raw);
  shared.res2 = keep_all ? nullptr : a.Take<bf16>(nc);
  shared.gate_up = keep_matmuls ? nullptr : a.Take<bf16>(2 * n_i);
  spare.end = a.size();
  saved_.resize(layers);
  // Layer by layer, its residual-stream entry then what its level keeps, so that the
  // gradients placed over spent layers (PlaceSpentActivationGradients) find them in order.
  std::vector<size_t> layer_ends(layers);
  for (int l = 0; l < layers; ++l) {
    Saved& s = saved_[l];
    keep_all = KeptPerLayer(level_.At(l), ActKind::kCheap);
    keep_matmuls = KeptPerLayer(level_.At(l), ActKind::kSaved);
    res_[l] = a.Take<bf16>(nc);
    s.attn_rstd = a.Take<float>(n);
    s.lse = a.Take<float>(head_rows);
    s.mlp_rstd = a.Take<float>(n);
    s.attn_norm = a.TakeOr(keep_all, shared.attn_norm, nc);
    s.atty = a.TakeOr(keep_matmuls, shared.atty, nq);
    s.mlp_norm = a.TakeOr(keep_all, shared.mlp_norm, nc);
    s.act = a.TakeOr(keep_all, shared.act, n_i);
    s.qkv = a.TakeOr(keep_matmuls, shared.qkv, n_qkv);
    s.qk_raw = n_qk_raw == 0 ? nullptr : a.TakeOr(keep_matmuls, shared.qk_raw, n_qk_raw);
    s.res2 = a.TakeOr(keep_all, shared.res2, nc);
    s.gate_up = a.TakeOr(keep_matmuls, shared.gate_up, 2 * n_i);
    layer_ends[l] = a.size();
  }
  res_[layers] = a.Take<bf16>(nc);
  PlaceSpentActivationGradients(a, layer_ends);
  TakeCommon(a, config_.padded_vocab_size, config_.hidden_size, spare);
  final_norm_ = TakeBeforeBackward<bf16>(a, nc);
  final_rstd_ = TakeBeforeBackward<float>(a, n);
  dfinal_norm_ = TakeBeforeBackward<bf16>(a, nc);
  // Backward scratch: the norms' and the attention's, then the residual stream's gradient.
  // The MLP's gradients need none: they take the place of the activations they are the
  // gradients of, and once the MLP is done with them the attention's dqkv takes gate_up's and
  // the sub-layers' input gradients act's (BlockBackwardRecomputed).
  size_t reduce_floats = RmsNormBackwardScratchFloats(static_cast<int>(n), config_.hidden_size);
  if (config_.qkv_bias()) {
    reduce_floats = std::max(reduce_floats,
                             BiasBackwardScratchFloats(static_cast<int>(n), config_.qkv_width()));
  }
  if (config_.qk_norm()) {
    reduce_floats = std::max(
        reduce_floats, QkNormBackwardScratchFloats(static_cast<int>(n), config_.num_heads,
                                                   config_.num_kv_heads, config_.head_size()));
  }
  reduce_scratch_ = a.Take<float>(reduce_floats);
  flash_scratch_ = a.Take<float>(FlashAttentionBackwardScratchFloats(
      max_b_, config_.num_heads, max_t_, config_.head_size()));
  dres_ = a.Take<bf16>(nc);
  const size_t half = config_.head_size() / 2;
  rope_cos_ = a.Take<float>(static_cast<size_t>(max_t_) * half);
  rope_sin_ = a.Take<float>(static_cast<size_t>(max_t_) * half);
  inv_freq_ = a.Take<float>(half);
  // FP8's casts: the widest layer and the largest weight are gate_up's (2I >= C, Q and the qkv
  // width: ShapeProblem). A recomputation keeps the transposed casts of the Linear layers it
  // runs: at kFull q/k/v, o and gate/up (not down, which it does not run), at kSelective o.
  const size_t c = config_.hidden_size;
  const size_t q = config_.q_width();
  const auto kept = [&](size_t rows, size_t cols) {
    return Fp8LinearScratch::KeptBytes(rows * cols);
  };
  const size_t attn_out_kept = kept(n, q) + kept(c, q);
  size_t kept_bytes = 0;
  for (int l = 0; l < layers; ++l) {
    if (level_.At(l) == Checkpointing::kFull) {
      kept_bytes = std::max(kept_bytes, kept(n, c) + kept(config_.qkv_width(), c) + attn_out_kept +
                                            kept(n, c) + kept(2 * config_.intermediate_size, c));
    } else if (level_.At(l) == Checkpointing::kSelective) {
      kept_bytes = std::max(kept_bytes, attn_out_kept);
    }
  }
  TakeFp8Scratch(a, 2 * config_.intermediate_size, size_t{2} * config_.intermediate_size * c,
                 kept_bytes);
  return a.size();
}

absl::StatusOr<std::unique_ptr<LlamaCuda>> LlamaCuda::Create(
    const LlamaConfig& config, int max_b, int max_t, CheckpointingPlan level, cudaStream_t stream,
    const ArenaRequests& requests) {
  if (const std::string problem = ShapeProblem(config); !problem.empty()) {
    return absl::InvalidArgumentError(problem);
  }
  if (max_b <= 0 || max_t <= 0 || max_t > config.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch shape (", max_b, ", ", max_t,
                                                   ") out of range"));
  }
  if (requests.fp8_linears) {
    for (const auto& [name, width] :
         {std::pair<const char*, int>{"hidden_size", config.hidden_size},
          {"num_heads x head_dim", config.q_width()},
          {"the q/k/v width", config.qkv_width()},
          {"intermediate_size", config.intermediate_size}}) {
      if (width % 16 != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("model: FP8's GEMMs need ", name, " a multiple of 16, got ", width));
      }
    }
  }
  std::unique_ptr<LlamaCuda> model(
      new LlamaCuda(config, max_b, max_t, level, stream, requests));
  WEFT_RETURN_IF_ERROR(model->Allocate());
  WEFT_RETURN_IF_ERROR(model->BuildRopeTables());
  return model;
}

size_t LlamaCuda::PlanActivationBytes(const LlamaConfig& config, int max_b, int max_t,
                                      CheckpointingPlan level,
                                      const ArenaRequests& requests) {
  LlamaCuda probe(config, max_b, max_t, level, nullptr, requests);
  return probe.PlannedBytes();
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

absl::Status LlamaCuda::EncoderForward(const bf16* head) {
  return EmbeddingForward(res_[0], tokens_, head + head_tensors_[kLlamaEmbed].offset, b_, t_,
                          config_.hidden_size, stream_);
}

absl::Status LlamaCuda::BlockForward(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  WEFT_RETURN_IF_ERROR(AttentionForward(l, block));
  WEFT_RETURN_IF_ERROR(MlpForwardToActivation(l, block));
  // out = res2 + down(act).
  const Saved& s = saved_[l];
  // The residual added in the GEMM's epilogue.
  return Linear(res_[l + 1], s.act, block + block_offsets_[kLlamaDown], nullptr, s.res2, n,
                config_.intermediate_size, c);
}

absl::Status LlamaCuda::AttentionForward(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int nh = config_.num_heads;
  const int nkv = config_.num_kv_heads;
  const int d = config_.head_size();
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_offsets_[tensor]; };
  const Saved& s = saved_[l];
  const bf16* x = res_[l];  // (B, T, C)
  // res2 = x + attn_out(attention(rope(qkvw(attn_norm(x))))).
  WEFT_RETURN_IF_ERROR(RmsNormForward(s.attn_norm, s.attn_rstd, x, p(kLlamaAttnNorm), n, c,
                                      static_cast<float>(config_.rms_norm_eps), stream_));
  const bf16* qkv_bias = config_.qkv_bias() ? p(kLlamaQkvb) : nullptr;
  WEFT_RETURN_IF_ERROR(
      Linear(s.qkv, s.attn_norm, p(kLlamaQkvw), qkv_bias, nullptr, n, c, config_.qkv_width()));
  if (config_.qk_norm()) {
    WEFT_RETURN_IF_ERROR(QkNormForward(s.qkv, s.qk_raw, p(kLlamaQNorm), p(kLlamaKNorm), n, nh, nkv,
                                       d, static_cast<float>(config_.rms_norm_eps), stream_));
  }
  WEFT_RETURN_IF_ERROR(
      RopeForward(s.qkv, Positions(), rope_cos_, rope_sin_, b_, t_, nh, nkv, d, stream_));
  WEFT_RETURN_IF_ERROR(FlashAttentionForward(s.atty, s.lse, s.qkv, DocStarts(),
                                             config_.sliding_window, b_, nh, nkv, t_, d, stream_));
  return Linear(s.res2, s.atty, p(kLlamaAttnOut), nullptr, x, n, config_.q_width(), c);
}

absl::Status LlamaCuda::MlpForwardToActivation(int l, const bf16* block) {
  const int c = config_.hidden_size;
  const int inter = config_.intermediate_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_offsets_[tensor]; };
  const Saved& s = saved_[l];
  // act = swiglu(gate_up(mlp_norm(res2))).
  WEFT_RETURN_IF_ERROR(RmsNormForward(s.mlp_norm, s.mlp_rstd, s.res2, p(kLlamaMlpNorm), n, c,
                                      static_cast<float>(config_.rms_norm_eps), stream_));
  WEFT_RETURN_IF_ERROR(
      Linear(s.gate_up, s.mlp_norm, p(kLlamaGateUp), nullptr, nullptr, n, c, 2 * inter));
  return SwiGluForward(s.act, s.gate_up, n, inter, stream_);
}

absl::Status LlamaCuda::RecomputeSelective(int l, const bf16* block) {
  // The same kernels on the same kept inputs as the forward: the same values. The norms'
  // statistics (rstd) are written again, identically.
  const int c = config_.hidden_size;
  const int n = b_ * t_;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const auto p = [&](int tensor) { return block + block_offsets_[tensor]; };
  const Saved& s = saved_[l];
  const bf16* x = res_[l];  // (B, T, C)
  WEFT_RETURN_IF_ERROR(
      RmsNormForward(s.attn_norm, s.attn_rstd, x, p(kLlamaAttnNorm), n, c, eps, stream_));
  // res2 = x + attn_out(atty), as AttentionForward ends.
  WEFT_RETURN_IF_ERROR(
      Linear(s.res2, s.atty, p(kLlamaAttnOut), nullptr, x, n, config_.q_width(), c));
  WEFT_RETURN_IF_ERROR(
      RmsNormForward(s.mlp_norm, s.mlp_rstd, s.res2, p(kLlamaMlpNorm), n, c, eps, stream_));
  return SwiGluForward(s.act, s.gate_up, n, config_.intermediate_size, stream_);
}

absl::Status LlamaCuda::Classifier(const bf16* head, float grad_scale, float* head_grad) {
  const int c = config_.hidden_size;
  const int vp = config_.padded_vocab_size;
  const int n = b_ * t_;
  // `head` and `head_grad` start at unit 0's element head_output_begin_ (CudaModel::Classifier).
  // The LM head: lm_head, or the embedding when tied (its gradient then joins the encoder's).
  const size_t lm = head_tensors_[config_.tie_word_embeddings ? kLlamaEmbed : kLlamaLmHead].offset -
                    head_output_begin_;
  const size_t norm = head_tensors_[kLlamaNorm].offset - head_output_begin_;
  const bf16* last = res_[config_.num_layers];
  const bf16* norm_w = head + norm;
  WEFT_RETURN_IF_ERROR(RmsNormForward(final_norm_, final_rstd_, last, norm_w, n, c,
                                      static_cast<float>(config_.rms_norm_eps), stream_));
  WEFT_RETURN_IF_ERROR(LmHeadLoss(final_norm_, head + lm,
                                  head_grad == nullptr ? nullptr : head_grad + lm, dfinal_norm_, c,
                                  config_.vocab_size, vp, grad_scale));
  if (head_grad == nullptr) return absl::OkStatus();
  // The residual stream's gradient starts here; RmsNormBackward accumulates into it.
  WEFT_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(dres_, 0, static_cast<size_t>(n) * c * sizeof(bf16), stream_));
  return RmsNormBackward(dres_, head_grad + norm, dfinal_norm_, last, norm_w, final_rstd_,
                         reduce_scratch_, n, c, stream_);
}

absl::Status LlamaCuda::BlockBackwardRecomputed(int l, const bf16* block, float* block_grad,
                                                GradWrite write) {
  const int c = config_.hidden_size;
  const int inter = config_.intermediate_size;
  const int n = b_ * t_;
  const auto p = [&](int tensor) { return block + block_offsets_[tensor]; };
  const auto g = [&](int tensor) { return block_grad + block_offsets_[tensor]; };
  // The GEMMs overwrite when asked; the norms' kernels only accumulate, so their (C) gradients
  // are zeroed first.
  const bool acc = write == GradWrite::kAccumulate;
  if (!acc) {
    for (const int norm : {kLlamaMlpNorm, kLlamaAttnNorm}) {
      WEFT_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(g(norm), 0, c * sizeof(float), stream_));
    }
    if (config_.qkv_bias()) {
      WEFT_CUDA_RETURN_IF_ERROR(
          cudaMemsetAsync(g(kLlamaQkvb), 0, config_.qkv_width() * sizeof(float), stream_));
    }
    if (config_.qk_norm()) {
      for (const int norm : {kLlamaQNorm, kLlamaKNorm}) {
        WEFT_CUDA_RETURN_IF_ERROR(
            cudaMemsetAsync(g(norm), 0, config_.head_size() * sizeof(float), stream_));
      }
    }
  }
  const Saved& s = saved_[l];
  // dres_ (B, T, C) holds dL/d(output of block l) on entry, dL/d(input of block l) on exit.
  // MLP: out = res2 + down(swiglu(gate_up(mlp_norm(res2)))).
  // Block l's activation and gate_up are read for the last time here, so their gradients go
  // where they were: dact over act once down's weight gradient has read it, dgate_up over
  // gate_up (the SwiGLU backward is elementwise, in place). That spares (N, 3I) of scratch:
  // 672 MiB at the Llama-8B shape, 2 x 4096 rows.
  bf16* const dact = s.act;          // (B, T, I)
  bf16* const dgate_up = s.gate_up;  // (B, T, 2I)
  WEFT_RETURN_IF_ERROR(
      LinearBackward(dact, g(kLlamaDown), acc, dres_, s.act, p(kLlamaDown), n, inter, c));
  WEFT_RETURN_IF_ERROR(SwiGluBackward(dgate_up, dact, s.gate_up, n, inter, stream_));
  // dact has been read for the last time: the sub-layers' input gradients (B, T, C) lie over
  // it (I >= C).
  bf16* const dx = dact;
  WEFT_RETURN_IF_ERROR(LinearBackward(dx, g(kLlamaGateUp), acc, dgate_up, s.mlp_norm,
                                      p(kLlamaGateUp), n, c, 2 * inter));
  WEFT_RETURN_IF_ERROR(RmsNormBackward(dres_, g(kLlamaMlpNorm), dx, s.res2, p(kLlamaMlpNorm),
                                       s.mlp_rstd, reduce_scratch_, n, c, stream_));
  // dgate_up has been read for the last time: dqkv (N, qkv width) lies over it, 96 MiB at the
  // Llama-8B shape not taken for a scratch of its own.
  return AttentionBackward(l, block, block_grad, acc, /*dqkv=*/dgate_up, dx);
}

absl::Status LlamaCuda::AttentionBackward(int l, const bf16* block, float* block_grad,
                                          bool accumulate, bf16* dqkv, bf16* dx) {
  const int c = config_.hidden_size;
  const int q_width = config_.q_width();
  const int width = config_.qkv_width();
  const int n = b_ * t_;
  const auto weight = [&](int tensor) { return block + block_offsets_[tensor]; };
  const auto grad = [&](int tensor) { return block_grad + block_offsets_[tensor]; };
  const Saved& s = saved_[l];
  // res2 = x + attn_out(attention(rope(qkvw(attn_norm(x))))).
  WEFT_RETURN_IF_ERROR(LinearBackward(dx, grad(kLlamaAttnOut), accumulate, dres_, s.atty,
                                      weight(kLlamaAttnOut), n, q_width, c));
  // dq, dk (of the rotated q, k) and dv land in dqkv at their places in qkv; then rotated back.
  const int nh = config_.num_heads;
  const int nkv = config_.num_kv_heads;
  const int d = config_.head_size();
  WEFT_RETURN_IF_ERROR(FlashAttentionBackward(dqkv, dx, s.atty, s.lse, s.qkv, DocStarts(),
                                              config_.sliding_window, flash_scratch_, b_, nh, nkv,
                                              t_, d, stream_));
  WEFT_RETURN_IF_ERROR(
      RopeBackward(dqkv, Positions(), rope_cos_, rope_sin_, b_, t_, nh, nkv, d, stream_));
  if (config_.qk_norm()) {
    WEFT_RETURN_IF_ERROR(QkNormBackward(dqkv, grad(kLlamaQNorm), grad(kLlamaKNorm), s.qk_raw,
                                        weight(kLlamaQNorm), weight(kLlamaKNorm), reduce_scratch_,
                                        n, nh, nkv, d, static_cast<float>(config_.rms_norm_eps),
                                        stream_));
  }
  if (config_.qkv_bias()) {
    WEFT_RETURN_IF_ERROR(BiasBackward(grad(kLlamaQkvb), dqkv, reduce_scratch_, n, width, stream_));
  }
  WEFT_RETURN_IF_ERROR(LinearBackward(dx, grad(kLlamaQkvw), accumulate, dqkv, s.attn_norm,
                                      weight(kLlamaQkvw), n, c, width));
  return RmsNormBackward(dres_, grad(kLlamaAttnNorm), dx, res_[l], weight(kLlamaAttnNorm),
                         s.attn_rstd, reduce_scratch_, n, c, stream_);
}

absl::Status LlamaCuda::EncoderBackward(float* head_grad) {
  return EmbeddingBackward(head_grad + head_tensors_[kLlamaEmbed].offset, dres_, embedding_plan_,
                           embedding_plan_device_, embedding_scratch_, b_, t_,
                           config_.hidden_size, stream_);
}

}  // namespace weft::engine::cuda
