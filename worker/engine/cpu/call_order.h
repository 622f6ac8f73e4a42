// The call order every CPU model enforces (engine/cpu/model.h): a micro-batch's forward and
// backward visit the units in a fixed sequence, and a call out of it would silently read stale
// activations, so it is a programmer error that aborts with a message naming the model.
#ifndef WEFT_WORKER_ENGINE_CPU_CALL_ORDER_H_
#define WEFT_WORKER_ENGINE_CPU_CALL_ORDER_H_

namespace weft::engine::cpu {

// Aborts with "weft::engine::<model>: <what>" unless `ok`.
void CheckOrDie(bool ok, const char* model, const char* what);

class CallOrder {
 public:
  CallOrder(const char* model, int num_layers) : model_(model), num_layers_(num_layers) {}

  // Each checks that the call may come now, then records it.
  void SetShape();  // any time: abandons the micro-batch in flight
  void EncoderForward();
  void BlockForward(int layer);
  void ClassifierForward(bool training);
  void Logits() const;
  void ClassifierBackward();
  void BlockBackward(int layer);
  void EncoderBackward();

 private:
  enum class Stage { kIdle, kForward, kInference, kBackwardReady, kBackward };

  const char* model_;
  int num_layers_;
  Stage stage_ = Stage::kIdle;
  int next_layer_ = 0;  // next BlockForward (counting up) or BlockBackward (counting down)
};

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_CALL_ORDER_H_
