#include "worker/engine/cpu/call_order.h"

#include <cstdio>
#include <cstdlib>

namespace weft::engine::cpu {

void CheckOrDie(bool ok, const char* model, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "weft::engine::%s: %s\n", model, what);
  std::abort();
}

void CallOrder::SetShape() { stage_ = Stage::kIdle; }

void CallOrder::EncoderForward() {
  stage_ = Stage::kForward;
  next_layer_ = 0;
}

void CallOrder::BlockForward(int layer) {
  CheckOrDie(stage_ == Stage::kForward && layer == next_layer_, model_,
             "BlockForward out of order (EncoderForward, then layers 0..L-1)");
  ++next_layer_;
}

void CallOrder::ClassifierForward(bool training) {
  CheckOrDie(stage_ == Stage::kForward && next_layer_ == num_layers_, model_,
             "ClassifierForward before every BlockForward");
  stage_ = training ? Stage::kBackwardReady : Stage::kInference;
}

void CallOrder::Logits() const {
  CheckOrDie(stage_ == Stage::kInference, model_, "Logits() needs an inference ClassifierForward");
}

void CallOrder::ClassifierBackward() {
  CheckOrDie(stage_ == Stage::kBackwardReady, model_,
             "ClassifierBackward needs a training ClassifierForward");
  stage_ = Stage::kBackward;
  next_layer_ = num_layers_ - 1;
}

void CallOrder::BlockBackward(int layer) {
  CheckOrDie(stage_ == Stage::kBackward && layer == next_layer_, model_,
             "BlockBackward out of order (ClassifierBackward, then layers L-1..0)");
  --next_layer_;
}

void CallOrder::EncoderBackward() {
  CheckOrDie(stage_ == Stage::kBackward && next_layer_ == -1, model_,
             "EncoderBackward before every BlockBackward");
  stage_ = Stage::kIdle;
}

}  // namespace weft::engine::cpu
