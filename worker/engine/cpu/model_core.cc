#include "worker/engine/cpu/model_core.h"

#include <cstdio>
#include <cstdlib>

#include "worker/engine/documents.h"

namespace weft::engine::cpu {

void CheckOrDie(bool ok, const char* model, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "weft::engine::%s: %s\n", model, what);
  std::abort();
}

MicroBatch::MicroBatch(const char* model, int num_layers, int vocab_size, int max_b, int max_t,
                       int context)
    : model_(model),
      num_layers_(num_layers),
      vocab_size_(vocab_size),
      max_b_(max_b),
      max_t_(max_t),
      b_(max_b),
      t_(max_t) {
  Check(max_b >= 1 && max_t >= 1 && max_t <= context, "bad max_b/max_t");
  tokens_.assign(static_cast<size_t>(max_b) * max_t, 0);
  doc_starts_.assign(tokens_.size(), 0);
  positions_.assign(tokens_.size(), 0);
}

void MicroBatch::SetShape(int b, int t) {
  Check(b >= 1 && b <= max_b_ && t >= 1 && t <= max_t_, "SetShape outside [1, max_b] x [1, max_t]");
  b_ = b;
  t_ = t;
  has_documents_ = false;
  reset_positions_ = false;
  stage_ = Stage::kIdle;
}

void MicroBatch::SetDocuments(const int32_t* doc_starts, bool reset_positions) {
  Check(stage_ == Stage::kIdle, "SetDocuments after SetShape, before EncoderForward");
  has_documents_ = doc_starts != nullptr;
  reset_positions_ = has_documents_ && reset_positions;
  if (!has_documents_) return;
  std::memcpy(doc_starts_.data(), doc_starts, sizeof(int32_t) * n());
  Check(DocumentPositions(doc_starts_.data(), b_, t_, positions_.data()) < 0,
        "doc_starts do not segment the row (each is t or the previous one's)");
}

void MicroBatch::EncoderForward(const int32_t* tokens) {
  std::memcpy(tokens_.data(), tokens, sizeof(int32_t) * n());
  // The data layer validates tokens; this O(B*T) scan only turns a bug into a clear abort
  // instead of a read outside the embedding.
  for (int i = 0; i < n(); ++i) {
    Check(tokens_[i] >= 0 && tokens_[i] < vocab_size_, "token outside [0, vocab_size)");
  }
  stage_ = Stage::kForward;
  next_layer_ = 0;
}

void MicroBatch::BlockForward(int layer) {
  Check(stage_ == Stage::kForward && layer == next_layer_,
        "BlockForward out of order (EncoderForward, then layers 0..L-1)");
  ++next_layer_;
}

void MicroBatch::ClassifierForward(const int32_t* targets) {
  Check(stage_ == Stage::kForward && next_layer_ == num_layers_,
        "ClassifierForward before every BlockForward");
  if (targets == nullptr) {
    stage_ = Stage::kInference;
    return;
  }
  for (int i = 0; i < n(); ++i) {
    Check(targets[i] < vocab_size_, "target outside [0, vocab_size) (negative: ignored)");
  }
  stage_ = Stage::kBackwardReady;
}

void MicroBatch::Logits() const {
  Check(stage_ == Stage::kInference, "Logits() needs an inference ClassifierForward");
}

void MicroBatch::ClassifierBackward() {
  Check(stage_ == Stage::kBackwardReady, "ClassifierBackward needs a training ClassifierForward");
  stage_ = Stage::kBackward;
  next_layer_ = num_layers_ - 1;
}

void MicroBatch::BlockBackward(int layer) {
  Check(stage_ == Stage::kBackward && layer == next_layer_,
        "BlockBackward out of order (ClassifierBackward, then layers L-1..0)");
  --next_layer_;
}

void MicroBatch::EncoderBackward() {
  Check(stage_ == Stage::kBackward && next_layer_ == -1,
        "EncoderBackward before every BlockBackward");
  stage_ = Stage::kIdle;
}

}  // namespace weft::engine::cpu
