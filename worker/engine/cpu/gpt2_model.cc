// GPT-2 forward and backward composed from the CPU ops, one unit at a time.
//
// Block l (pre-LayerNorm):
//   x    = residual[l]                                  // (B, T, C)
//   qkv  = Matmul(LayerNorm1(x), qkvw, qkvb)            // (B, T, 3C)
//   res2 = x + Matmul(Attention(qkv), attprojw, attprojb)
//   res3 = res2 + Matmul(Gelu(Matmul(LayerNorm2(res2), fcw, fcb)), fcprojw, fcprojb)
//   residual[l + 1] = res3
// Head: logits = Matmul(LayerNormF(residual[L]), wte) (tied, no bias), then the fused softmax
// cross-entropy.
//
// Backward keeps ONE buffer, dres_, for the gradient of the residual stream: a residual's
// backward is the identity on both inputs, so each branch's input gradient is accumulated
// straight into dres_ (+=) and dres_ then holds the gradient of the block's input. This is
// why every op's backward accumulates into its input gradient too.
#include "worker/engine/cpu/gpt2_model.h"

#include "worker/engine/cpu/ops.h"

namespace weft::engine::cpu {

template <typename T>
GptModel<T>::GptModel(const GptConfig& config, int max_b, int max_t, Checkpointing level,
                      bool allocate)
    : CpuModelBase<T>("GptModel", config.num_layers, config.vocab_size, max_b, max_t,
                      config.context_length, level),
      config_(config) {
  mb_.Check(config.num_layers >= 1 && config.hidden_size >= 1 && config.num_heads >= 1 &&
                config.hidden_size % config.num_heads == 0,
            "bad layer/width/head counts");
  mb_.Check(config.vocab_size >= 1 && config.padded_vocab_size >= config.vocab_size,
            "bad vocabulary sizes");
  for (const TensorInfo& info : UnitTensors(config, 0)) head_offsets_.push_back(info.offset);
  for (const TensorInfo& info : UnitTensors(config, 1)) block_offsets_.push_back(info.offset);

  const size_t n = static_cast<size_t>(max_b) * max_t;  // positions
  const size_t c = config.hidden_size;
  const size_t layers = config.num_layers;
  const size_t att = static_cast<size_t>(max_b) * config.num_heads * max_t * max_t;
  arena_.Build([&] {
    auto take = [this](size_t count) { return arena_.Take(count); };
    residual_.clear();
    for (size_t l = 0; l <= layers; ++l) residual_.push_back(take(n * c));
    const ActKind saved = ActKind::kSaved, cheap = ActKind::kCheap;
    acts_ = this->template TakeBlockActs<BlockActs>(static_cast<int>(layers), {
        {&BlockActs::ln1, n * c, cheap},
        {&BlockActs::ln1_mean, n, saved},
        {&BlockActs::ln1_rstd, n, saved},
        {&BlockActs::qkv, n * 3 * c, saved},
        {&BlockActs::atty, n * c, cheap},
        {&BlockActs::att, att, cheap},
        {&BlockActs::res2, n * c, saved},
        {&BlockActs::ln2, n * c, cheap},
        {&BlockActs::ln2_mean, n, saved},
        {&BlockActs::ln2_rstd, n, saved},
        {&BlockActs::fch, n * 4 * c, saved},
        {&BlockActs::fch_gelu, n * 4 * c, cheap},
    });
    lnf_ = take(n * c);
    lnf_mean_ = take(n);
    lnf_rstd_ = take(n);
    logits_ = take(n * config.padded_vocab_size);
    losses_ = take(n);
    proj_ = take(n * c);
    dres_ = take(n * c);
    dln_ = take(n * c);
    datty_ = take(n * c);
    dqkv_ = take(n * 3 * c);
    dfch_ = take(n * 4 * c);
    dgelu_ = take(n * 4 * c);
    datt_ = take(static_cast<size_t>(max_t) * max_t);
  }, allocate);
}

template <typename T>
void GptModel<T>::EncoderForward(const T* head, const int32_t* tokens) {
  const int c = config_.hidden_size;
  mb_.EncoderForward(tokens);
  // Qualified: the member of the same name would hide the op.
  cpu::EncoderForward(residual_[0], mb_.tokens(), head + head_offsets_[kWte],
                      head + head_offsets_[kWpe], mb_.positions(), mb_.b(), mb_.t(), c);
}

template <typename T>
void GptModel<T>::BlockForward(int layer, const T* block) {
  mb_.BlockForward(layer);
  RunBlock(layer, block, /*recompute=*/false);
}

template <typename T>
void GptModel<T>::RunBlock(int layer, const T* block, bool recompute) {
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const std::vector<size_t>& off = block_offsets_;
  const BlockActs& a = acts_[layer];
  const T* x = residual_[layer];  // (B, T, C)
  // Each op is guarded by the kind of the output its backward reads.
  if (this->Runs(recompute, ActKind::kCheap)) {
    LayerNormForward(a.ln1, a.ln1_mean, a.ln1_rstd, x, block + off[kLn1w], block + off[kLn1b], n,
                     c);
  }
  if (this->Runs(recompute, ActKind::kSaved)) {
    MatmulForward(a.qkv, a.ln1, block + off[kQkvw], block + off[kQkvb], n, c, 3 * c);
  }
  if (this->Runs(recompute, ActKind::kCheap)) {
    AttentionForward(a.atty, a.att, a.qkv, mb_.doc_starts(), mb_.b(), mb_.t(), c,
                     config_.num_heads);
  }
  if (this->Runs(recompute, ActKind::kSaved)) {
    MatmulForward(proj_, a.atty, block + off[kAttprojw], block + off[kAttprojb], n, c, c);
    ResidualForward(a.res2, x, proj_, static_cast<int64_t>(n) * c);
  }
  if (this->Runs(recompute, ActKind::kCheap)) {
    LayerNormForward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, block + off[kLn2w], block + off[kLn2b],
                     n, c);
  }
  if (this->Runs(recompute, ActKind::kSaved)) {
    MatmulForward(a.fch, a.ln2, block + off[kFcw], block + off[kFcb], n, c, 4 * c);
  }
  if (this->Runs(recompute, ActKind::kCheap)) {
    GeluForward(a.fch_gelu, a.fch, static_cast<int64_t>(n) * 4 * c);
  }
  if (recompute) return;  // the block's output, residual_[layer + 1], is always kept
  MatmulForward(proj_, a.fch_gelu, block + off[kFcprojw], block + off[kFcprojb], n, 4 * c, c);
  ResidualForward(residual_[layer + 1], a.res2, proj_, static_cast<int64_t>(n) * c);
}

template <typename T>
double GptModel<T>::ClassifierForward(const T* head, const int32_t* targets, T loss_scale) {
  mb_.ClassifierForward(targets);
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const std::vector<size_t>& off = head_offsets_;
  LayerNormForward(lnf_, lnf_mean_, lnf_rstd_, residual_[config_.num_layers], head + off[kLnfw],
                   head + off[kLnfb], n, c);
  // Tied LM head: logits (N, Vp) = lnf (N, C) @ wte^T (C, Vp).
  return LmHeadForward(logits_, losses_, lnf_, head + off[kWte], targets, n, c, config_.vocab_size,
                       config_.padded_vocab_size, loss_scale);
}

template <typename T>
void GptModel<T>::ClassifierBackward(const T* head, T* head_grad) {
  mb_.ClassifierBackward();
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const int vp = config_.padded_vocab_size;
  const std::vector<size_t>& off = head_offsets_;
  const T* dlogits = logits_;  // (N, Vp), left in place by the fused softmax cross-entropy
  Zero(dln_, static_cast<size_t>(n) * c);
  MatmulBackward(dln_, head_grad + off[kWte], static_cast<T*>(nullptr), dlogits, lnf_,
                 head + off[kWte], n, c, vp);
  // dres_ starts the backward: the gradient w.r.t. residual_[L].
  Zero(dres_, static_cast<size_t>(n) * c);
  LayerNormBackward(dres_, head_grad + off[kLnfw], head_grad + off[kLnfb], dln_,
                    residual_[config_.num_layers], head + off[kLnfw], lnf_mean_, lnf_rstd_, n, c);
}

template <typename T>
void GptModel<T>::BlockBackward(int layer, const T* block, T* block_grad) {
  mb_.BlockBackward(layer);
  RunBlock(layer, block, /*recompute=*/true);
  const int n = mb_.n();
  const int c = config_.hidden_size;
  const size_t nc = static_cast<size_t>(n) * c;
  const std::vector<size_t>& off = block_offsets_;
  const BlockActs& a = acts_[layer];
  const T* w = block;
  T* g = block_grad;
  // dres_ holds d/d(res3). MLP branch: res3 = res2 + fcproj(gelu(fc(ln2(res2)))).
  Zero(dgelu_, 4 * nc);
  MatmulBackward(dgelu_, g + off[kFcprojw], g + off[kFcprojb], dres_, a.fch_gelu, w + off[kFcprojw],
                 n, 4 * c, c);
  Zero(dfch_, 4 * nc);
  GeluBackward(dfch_, a.fch, dgelu_, static_cast<int64_t>(4 * nc));
  Zero(dln_, nc);
  MatmulBackward(dln_, g + off[kFcw], g + off[kFcb], dfch_, a.ln2, w + off[kFcw], n, c, 4 * c);
  // += into dres_: it becomes d/d(res2) (identity path plus the MLP branch).
  LayerNormBackward(dres_, g + off[kLn2w], g + off[kLn2b], dln_, a.res2, w + off[kLn2w], a.ln2_mean,
                    a.ln2_rstd, n, c);
  // Attention branch: res2 = x + attproj(attention(qkv(ln1(x)))).
  Zero(datty_, nc);
  MatmulBackward(datty_, g + off[kAttprojw], g + off[kAttprojb], dres_, a.atty, w + off[kAttprojw],
                 n, c, c);
  Zero(dqkv_, 3 * nc);
  AttentionBackward(dqkv_, datt_, datty_, a.qkv, a.att, mb_.doc_starts(), mb_.b(), mb_.t(), c,
                    config_.num_heads);
  Zero(dln_, nc);
  MatmulBackward(dln_, g + off[kQkvw], g + off[kQkvb], dqkv_, a.ln1, w + off[kQkvw], n, c, 3 * c);
  // += into dres_: it becomes d/dx, the gradient flowing into block layer - 1.
  LayerNormBackward(dres_, g + off[kLn1w], g + off[kLn1b], dln_, residual_[layer], w + off[kLn1w],
                    a.ln1_mean, a.ln1_rstd, n, c);
}

template <typename T>
void GptModel<T>::EncoderBackward(T* head_grad) {
  mb_.EncoderBackward();
  cpu::EncoderBackward(head_grad + head_offsets_[kWte], head_grad + head_offsets_[kWpe], dres_,
                       mb_.tokens(), mb_.positions(), mb_.b(), mb_.t(), config_.hidden_size);
}

template class GptModel<float>;
template class GptModel<double>;

}  // namespace weft::engine::cpu
