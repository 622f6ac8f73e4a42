// What every CPU model (gpt2_model.h, llama_model.h) keeps besides its own layers: the
// micro-batch in flight (shape, tokens, the call order of engine/cpu/model.h), the arena its
// activations live in and where the checkpointing level puts each block's activations. A call
// out of order would silently read stale activations and a shape or token out of range would
// read out of bounds, so both are programmer errors that abort with a message naming the model.
#ifndef WEFT_WORKER_ENGINE_CPU_MODEL_CORE_H_
#define WEFT_WORKER_ENGINE_CPU_MODEL_CORE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "worker/engine/checkpointing.h"

namespace weft::engine::cpu {

// Aborts with "weft::engine::<model>: <what>" unless `ok`.
void CheckOrDie(bool ok, const char* model, const char* what);

template <typename T>
void Zero(T* x, size_t n) {
  std::memset(x, 0, n * sizeof(T));
}

class MicroBatch {
 public:
  // For micro-batches up to (max_b, max_t), max_t <= context; `model` names it in aborts.
  MicroBatch(const char* model, int num_layers, int vocab_size, int max_b, int max_t, int context);

  int b() const { return b_; }
  int t() const { return t_; }
  int n() const { return b_ * t_; }  // positions
  int max_b() const { return max_b_; }
  int max_t() const { return max_t_; }
  const int32_t* tokens() const { return tokens_.data(); }  // (B, T), kept for the backward

  void Check(bool ok, const char* what) const { CheckOrDie(ok, model_, what); }

  // The model's calls, each checked against the order and recorded.
  void SetShape(int b, int t);  // any time: abandons the micro-batch in flight; no documents
  // After SetShape, before EncoderForward: the rows hold packed documents starting where
  // doc_starts (B, T) says (copied; engine/cpu/attention.cc states what it must hold), and with
  // reset_positions each position counts from its document's start. nullptr: one document a
  // row, positions 0..T-1.
  void SetDocuments(const int32_t* doc_starts, bool reset_positions);
  // (B, T) or nullptr (no documents).
  const int32_t* doc_starts() const { return has_documents_ ? doc_starts_.data() : nullptr; }
  // (B, T) or nullptr (positions are 0..T-1).
  const int32_t* positions() const { return reset_positions_ ? positions_.data() : nullptr; }
  // Keeps a copy of the (B, T) tokens: EncoderBackward needs them after the caller's buffer
  // may be gone.
  void EncoderForward(const int32_t* tokens);
  void BlockForward(int layer);
  // targets (B, T) or nullptr (inference).
  void ClassifierForward(const int32_t* targets);
  void Logits() const;
  void ClassifierBackward();
  void BlockBackward(int layer);
  void EncoderBackward();

 private:
  enum class Stage { kIdle, kForward, kInference, kBackwardReady, kBackward };

  const char* model_;
  int num_layers_;
  int vocab_size_;
  int max_b_;
  int max_t_;
  int b_;
  int t_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> doc_starts_;  // (max_B, max_T)
  std::vector<int32_t> positions_;   // (max_B, max_T)
  bool has_documents_ = false;
  bool reset_positions_ = false;
  Stage stage_ = Stage::kIdle;
  int next_layer_ = 0;  // next BlockForward (counting up) or BlockBackward (counting down)
};

// One allocation for all of a model's activations and scratch. Build runs the model's
// `take_all` (which Takes every buffer, in order, and stores the pointers) twice: once to count,
// once over the allocated memory, so no total is ever computed by hand. Without `allocate` it
// only counts (every pointer stays null): the bytes a model of that shape would allocate, for
// the memory plan (PlanCpuActivationBytes) to read from the same list the model allocates by.
template <typename T>
class ActivationArena {
 public:
  template <typename TakeAll>
  void Build(TakeAll take_all, bool allocate = true) {
    counting_ = true;
    count_ = 0;
    take_all();
    if (!allocate) return;
    buffer_.assign(count_, T(0));
    next_ = buffer_.data();
    counting_ = false;
    take_all();
  }
  // `count` elements (nullptr while counting).
  T* Take(size_t count) {
    if (counting_) {
      count_ += count;
      return nullptr;
    }
    T* p = next_;
    next_ += count;
    return p;
  }
  // What Build allocated, or without `allocate` would have.
  size_t bytes() const { return count_ * sizeof(T); }

 private:
  std::vector<T> buffer_;
  T* next_ = nullptr;
  bool counting_ = false;
  size_t count_ = 0;
};

// One pointer of a model's per-block activation struct Acts, its element count and kind
// (engine/checkpointing.h). What a level does not keep per layer lives in ONE shared set that
// each block's forward overwrites and its backward recomputes first, by re-running the forward's
// own op calls on the same inputs (so the recomputed values are bit-identical).
template <typename T, typename Acts>
struct ActSlot {
  T* Acts::*field;
  size_t count;
  ActKind kind;
};

// The part of a CPU model's CpuModel-shaped interface that is not about its layers, and the
// state behind it. A model derives from it and allocates logits_ and losses_ in arena_.
template <typename T>
class CpuModelBase {
 public:
  Checkpointing checkpointing() const { return level_; }
  int b() const { return mb_.b(); }
  int t() const { return mb_.t(); }
  void SetShape(int b, int t) { mb_.SetShape(b, t); }
  void SetDocuments(const int32_t* doc_starts, bool reset_positions) {
    mb_.SetDocuments(doc_starts, reset_positions);
  }
  const T* Logits() const {
    mb_.Logits();
    return logits_;
  }
  const T* Losses() const { return losses_; }
  size_t ActivationBytes() const {
    // The tokens, document starts and positions the micro-batch keeps.
    return arena_.bytes() + 3 * sizeof(int32_t) * mb_.max_b() * mb_.max_t();
  }

 protected:
  CpuModelBase(const char* model, int num_layers, int vocab_size, int max_b, int max_t, int context,
               Checkpointing level)
      : mb_(model, num_layers, vocab_size, max_b, max_t, context), level_(level) {}

  // Inside arena_.Build: takes every layer's Acts, each slot per layer where the level keeps it
  // there and otherwise pointing into the one shared set.
  template <typename Acts>
  std::vector<Acts> TakeBlockActs(int layers, const std::vector<ActSlot<T, Acts>>& slots) {
    Acts shared{};
    for (const ActSlot<T, Acts>& s : slots) {
      if (!KeptPerLayer(level_, s.kind)) shared.*(s.field) = arena_.Take(s.count);
    }
    std::vector<Acts> acts(layers, shared);
    for (Acts& a : acts) {
      for (const ActSlot<T, Acts>& s : slots) {
        if (KeptPerLayer(level_, s.kind)) a.*(s.field) = arena_.Take(s.count);
      }
    }
    return acts;
  }

  // Whether a block's op whose output is of `kind` runs: always in the forward; in the
  // backward's recomputation only when that output is not kept per layer.
  bool Runs(bool recompute, ActKind kind) const {
    return !recompute || !KeptPerLayer(level_, kind);
  }

  MicroBatch mb_;
  ActivationArena<T> arena_;  // every activation and scratch buffer of the model
  T* logits_ = nullptr;       // (B, T, Vp): logits, then (training) dlogits in place
  T* losses_ = nullptr;       // (B, T)

 private:
  Checkpointing level_;
};

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_MODEL_CORE_H_
