// Llama forward and backward composed from the CPU ops, one unit at a time.
//
// Block l (pre-norm):
//   x    = residual[l]                                       // (B, T, C)
//   qkv  = Rope([QkNorm](Matmul(RmsNorm1(x), qkvw) [+ qkvb]))  // (B, T, QKV), rotary on q, k
//   res2 = x + Matmul(GqaAttention(qkv), attn_out)
//   res3 = res2 + Matmul(SwiGlu(Matmul(RmsNorm2(res2), gate_up)), down)
//   residual[l + 1] = res3
// Head: embed lookup (no position embedding); logits = Matmul(RmsNormF(residual[L]), lm_head or
// embed when tied), then the fused softmax cross-entropy over the first V columns.
//
// As in gpt2_model.cc, ONE buffer dres_ carries the gradient of the residual stream: each
// branch's input gradient is accumulated straight into it.
#include "worker/engine/cpu/llama_model.h"

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
LlamaModel<T>::LlamaModel(const LlamaConfig& config, int max_b, int max_t,
                          Checkpointing level, bool allocate)
    : CpuModelBase<T>("LlamaModel", config.num_layers, config.vocab_size, max_b, max_t,
                      config.context_length, level),
      config_(config) {
  mb_.Check(LlamaConfigProblems(config).empty(), "bad LlamaConfig (LlamaConfigProblems says what)");
  const LlamaArch arch(config);
  for (const TensorInfo& info : arch.UnitTensors(0)) head_offsets_.push_back(info.offset);
  block_offsets_ = arch.BlockOffsets();

  const size_t n = static_cast<size_t>(max_b) * max_t;  // positions
  const size_t c = config.hidden_size;
  const size_t q = config.q_width();
  const size_t qkv = config.qkv_width();
  const size_t inter = config.intermediate_size;
  const size_t half = config.head_size() / 2;
  const size_t layers = config.num_layers;
  const size_t qk_heads = config.num_heads + config.num_kv_heads;
  const size_t att = static_cast<size_t>(max_b) * config.num_heads * max_t * max_t;
  arena_.Build([&] {
    auto take = [this](size_t count) { return arena_.Take(count); };
    residual_.clear();
    for (size_t l = 0; l <= layers; ++l) residual_.push_back(take(n * c));
    const ActKind saved = ActKind::kSaved, cheap = ActKind::kCheap;
    acts_ = this->template TakeBlockActs<BlockActs>(
        static_cast<int>(layers),
        {
            {&BlockActs::norm1, n * c, cheap},
            {&BlockActs::rrms1, n, saved},
            {&BlockActs::qkv, n * qkv, saved},
            {&BlockActs::qk_raw, config.qk_norm() ? n * qk_heads * config.head_size() : 0, saved},
            {&BlockActs::qk_rrms, config.qk_norm() ? n * qk_heads : 0, saved},
            {&BlockActs::atty, n * q, cheap},
            {&BlockActs::att, att, cheap},
            {&BlockActs::res2, n * c, saved},
            {&BlockActs::norm2, n * c, cheap},
            {&BlockActs::rrms2, n, saved},
            {&BlockActs::gate_up, n * 2 * inter, saved},
            {&BlockActs::swiglu, n * inter, cheap},
        });
    rope_cos_ = take(max_t * half);
    rope_sin_ = take(max_t * half);
    normf_ = take(n * c);
    normf_rrms_ = take(n);
    logits_ = take(n * config.padded_vocab_size);
    losses_ = take(n);
    proj_ = take(n * c);
    dres_ = take(n * c);
    dnorm_ = take(n * c);
    datty_ = take(n * q);
    dqkv_ = take(n * qkv);
    dswiglu_ = take(n * inter);
    dgate_up_ = take(n * 2 * inter);
    datt_ = take(static_cast<size_t>(max_t) * max_t);
  }, allocate);
  if (!allocate) return;

  const std::vector<double> inv_freq = RopeInverseFrequencies(config);
  RopeTables(rope_cos_, rope_sin_, inv_freq.data(), max_t, config.head_size());
}

template <typename T>
size_t LlamaModel<T>::LmHeadOffset() const {
  return head_offsets_[config_.tie_word_embeddings ? kLlamaEmbed : kLlamaLmHead];
}

template <typename T>
void LlamaModel<T>::EncoderForward(const T* head, const int32_t* tokens) {
  mb_.EncoderForward(tokens);
  // Qualified: the member of the same name would hide the op. No position embedding.
  cpu::EncoderForward(residual_[0], mb_.tokens(), head + head_offsets_[kLlamaEmbed],
                      static_cast<const T*>(nullptr), nullptr, mb_.b(), mb_.t(),
                      config_.hidden_size);
}

template <typename T>
void LlamaModel<T>::BlockForward(int layer, const T* block) {
  mb_.BlockForward(layer);
  RunBlock(layer, block, /*recompute=*/false);
}

template <typename T>
void LlamaModel<T>::RunBlock(int layer, const T* block, bool recompute) {
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const int nh = config_.num_heads;
  const int nkv = config_.num_kv_heads;
  const int d = config_.head_size();
  const int inter = config_.intermediate_size;
  const double eps = config_.rms_norm_eps;
  const LlamaBlockOffsets& off = block_offsets_;
  const BlockActs& a = acts_[layer];
  const T* x = residual_[layer];  // (B, T, C)
  const T* no_bias = nullptr;
  const T* qkv_bias = config_.qkv_bias() ? block + off[kLlamaQkvb] : no_bias;
  // Each op is guarded by the kind of the output its backward reads.
  if (this->Runs(recompute, ActKind::kCheap)) {
    RmsNormForward(a.norm1, a.rrms1, x, block + off[kLlamaAttnNorm], n, c, eps);
  }
  if (this->Runs(recompute, ActKind::kSaved)) {
    MatmulForward(a.qkv, a.norm1, block + off[kLlamaQkvw], qkv_bias, n, c, config_.qkv_width());
    if (config_.qk_norm()) {
      QkNormForward(a.qkv, a.qk_raw, a.qk_rrms, block + off[kLlamaQNorm], block + off[kLlamaKNorm],
                    n, nh, nkv, d, eps);
    }
    RopeForward(a.qkv, rope_cos_, rope_sin_, mb_.positions(), mb_.b(), mb_.t(), nh, nkv, d);
  }
  if (this->Runs(recompute, ActKind::kCheap)) {
    GqaAttentionForward(a.atty, a.att, a.qkv, mb_.doc_starts(), config_.sliding_window, mb_.b(),
                        mb_.t(), nh, nkv, d);
  }
  if (this->Runs(recompute, ActKind::kSaved)) {
    MatmulForward(proj_, a.atty, block + off[kLlamaAttnOut], no_bias, n, config_.q_width(), c);
    ResidualForward(a.res2, x, proj_, static_cast<int64_t>(n) * c);
  }
  if (this->Runs(recompute, ActKind::kCheap)) {
    RmsNormForward(a.norm2, a.rrms2, a.res2, block + off[kLlamaMlpNorm], n, c, eps);
  }
  if (this->Runs(recompute, ActKind::kSaved)) {
    MatmulForward(a.gate_up, a.norm2, block + off[kLlamaGateUp], no_bias, n, c, 2 * inter);
  }
  if (this->Runs(recompute, ActKind::kCheap)) SwiGluForward(a.swiglu, a.gate_up, n, inter);
  if (recompute) return;  // the block's output, residual_[layer + 1], is always kept
  MatmulForward(proj_, a.swiglu, block + off[kLlamaDown], no_bias, n, inter, c);
  ResidualForward(residual_[layer + 1], a.res2, proj_, static_cast<int64_t>(n) * c);
}

template <typename T>
double LlamaModel<T>::ClassifierForward(const T* head, const int32_t* targets, T loss_scale) {
  mb_.ClassifierForward(targets);
  const int n = mb_.n();
  const int c = config_.hidden_size;
  RmsNormForward(normf_, normf_rrms_, residual_[config_.num_layers],
                 head + head_offsets_[kLlamaNorm], n, c, config_.rms_norm_eps);
  return LmHeadForward(logits_, losses_, normf_, head + LmHeadOffset(), targets, n, c,
                       config_.vocab_size, config_.padded_vocab_size, loss_scale);
}

template <typename T>
void LlamaModel<T>::ClassifierBackward(const T* head, T* head_grad) {
  mb_.ClassifierBackward();
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const T* dlogits = logits_;  // (N, Vp), left in place by the fused softmax cross-entropy
  Zero(dnorm_, static_cast<size_t>(n) * c);
  MatmulBackward(dnorm_, head_grad + LmHeadOffset(), static_cast<T*>(nullptr), dlogits, normf_,
                 head + LmHeadOffset(), n, c, config_.padded_vocab_size);
  // dres_ starts the backward: the gradient w.r.t. residual_[L].
  Zero(dres_, static_cast<size_t>(n) * c);
  RmsNormBackward(dres_, head_grad + head_offsets_[kLlamaNorm], dnorm_,
                  residual_[config_.num_layers], head + head_offsets_[kLlamaNorm], normf_rrms_, n,
                  c);
}

template <typename T>
void LlamaModel<T>::BlockBackward(int layer, const T* block, T* block_grad) {
  mb_.BlockBackward(layer);
  RunBlock(layer, block, /*recompute=*/true);
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const int q = config_.q_width();
  const int qkv = config_.qkv_width();
  const int inter = config_.intermediate_size;
  const size_t nn = static_cast<size_t>(n);
  const LlamaBlockOffsets& off = block_offsets_;
  const BlockActs& a = acts_[layer];
  const T* w = block;
  T* g = block_grad;
  T* no_bias = nullptr;
  T* dqkv_bias = config_.qkv_bias() ? g + off[kLlamaQkvb] : no_bias;
  // dres_ holds d/d(res3). MLP branch: res3 = res2 + down(swiglu(gate_up(norm2(res2)))).
  Zero(dswiglu_, nn * inter);
  MatmulBackward(dswiglu_, g + off[kLlamaDown], no_bias, dres_, a.swiglu, w + off[kLlamaDown], n,
                 inter, c);
  Zero(dgate_up_, nn * 2 * inter);
  SwiGluBackward(dgate_up_, dswiglu_, a.gate_up, n, inter);
  Zero(dnorm_, nn * c);
  MatmulBackward(dnorm_, g + off[kLlamaGateUp], no_bias, dgate_up_, a.norm2, w + off[kLlamaGateUp],
                 n, c, 2 * inter);
  // += into dres_: it becomes d/d(res2) (identity path plus the MLP branch).
  RmsNormBackward(dres_, g + off[kLlamaMlpNorm], dnorm_, a.res2, w + off[kLlamaMlpNorm], a.rrms2, n,
                  c);
  // Attention branch: res2 = x + attn_out(attention(rope(qkv(norm1(x))))).
  Zero(datty_, nn * q);
  MatmulBackward(datty_, g + off[kLlamaAttnOut], no_bias, dres_, a.atty, w + off[kLlamaAttnOut], n,
                 q, c);
  Zero(dqkv_, nn * qkv);
  GqaAttentionBackward(dqkv_, datt_, datty_, a.qkv, a.att, mb_.doc_starts(), config_.sliding_window,
                       mb_.b(), mb_.t(), config_.num_heads, config_.num_kv_heads,
                       config_.head_size());
  // Now the gradient w.r.t. the rotated q, k: rotate it back to the projection's output.
  RopeBackward(dqkv_, rope_cos_, rope_sin_, mb_.positions(), mb_.b(), mb_.t(), config_.num_heads,
               config_.num_kv_heads, config_.head_size());
  if (config_.qk_norm()) {  // and back through the head norms to the projection's output
    QkNormBackward(dqkv_, g + off[kLlamaQNorm], g + off[kLlamaKNorm], a.qk_raw, a.qk_rrms,
                   w + off[kLlamaQNorm], w + off[kLlamaKNorm], n, config_.num_heads,
                   config_.num_kv_heads, config_.head_size());
  }
  Zero(dnorm_, nn * c);
  MatmulBackward(dnorm_, g + off[kLlamaQkvw], dqkv_bias, dqkv_, a.norm1, w + off[kLlamaQkvw], n, c,
                 qkv);
  // += into dres_: it becomes d/dx, the gradient flowing into block layer - 1.
  RmsNormBackward(dres_, g + off[kLlamaAttnNorm], dnorm_, residual_[layer], w + off[kLlamaAttnNorm],
                  a.rrms1, n, c);
}

template <typename T>
void LlamaModel<T>::EncoderBackward(T* head_grad) {
  mb_.EncoderBackward();
  cpu::EncoderBackward(head_grad + head_offsets_[kLlamaEmbed], static_cast<T*>(nullptr), dres_,
                       mb_.tokens(), nullptr, mb_.b(), mb_.t(), config_.hidden_size);
}

template class LlamaModel<float>;
template class LlamaModel<double>;

}  // namespace weft::engine::cpu
