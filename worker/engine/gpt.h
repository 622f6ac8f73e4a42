// GPT-2 on the CPU in fp32: parameter layout (units), initialisation, and the model's forward
// and backward one unit at a time, for the ZeRO layer to drive.
//
// Parameters are grouped into UNITS, each one flat float buffer (the unit of ZeRO-3 sharding):
//   unit 0 ("head"):  wte (Vp, C), wpe (maxT, C), lnfw (C), lnfb (C) — the LM head is tied to wte
//   unit 1+l (block l): ln1w (C), ln1b (C), qkvw (3C, C), qkvb (3C), attprojw (C, C),
//                       attprojb (C), ln2w (C), ln2b (C), fcw (4C, C), fcb (4C),
//                       fcprojw (C, 4C), fcprojb (C)
// Weights are (out, in) like PyTorch's Linear and llm.c.
//
// A training micro-step, with every backward ACCUMULATING (+=) into the unit's gradient:
//   model.SetShape(B, T);
//   model.EncoderForward(head, tokens);
//   for l = 0 .. L-1: model.BlockForward(l, block[l]);
//   loss = model.ClassifierForward(head, targets, 1.0f / (world * accum));
//   model.ClassifierBackward(head, head_grad);
//   for l = L-1 .. 0: model.BlockBackward(l, block[l], block_grad[l]);
//   model.EncoderBackward(head_grad);
// The parameter buffers passed to a backward must hold the same values as in its forward.
#ifndef WEFT_WORKER_ENGINE_GPT_H_
#define WEFT_WORKER_ENGINE_GPT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "weft/v1/job.pb.h"

namespace weft::engine {

struct GptConfig {
  int num_layers = 0;
  int hidden_size = 0;        // C
  int num_heads = 0;          // NH; divides C
  int vocab_size = 0;         // V: token ids are in [0, V)
  int padded_vocab_size = 0;  // Vp >= V: rows of wte allocated
  int context_length = 0;     // maxT: rows of wpe
};

// Sizes from a (validated) ModelSpec; padded_vocab_size 0 takes the proto's default (V rounded
// up to a multiple of 128).
GptConfig ConfigFromSpec(const weft::v1::ModelSpec& spec);

// How a tensor of a unit is initialised (GPT-2).
enum class TensorInit {
  kNormal,          // N(0, 0.02)
  kResidualNormal,  // N(0, 0.02 / sqrt(2 * num_layers)): projections into the residual stream
  kZeros,           // biases
  kOnes,            // LayerNorm weights
};

// One tensor inside a unit's flat buffer. The table drives init, the decay mask and the
// model's parameter views, and names tensors for checkpoints.
struct TensorInfo {
  std::string name;            // "wte", "wpe", "lnfw", "lnfb"; "h.<l>.qkvw" etc. for blocks
  size_t offset = 0;           // floats from the start of the unit
  std::vector<int64_t> shape;  // row-major
  size_t size = 0;             // floats
  bool decay = false;          // AdamW weight decay applies
  TensorInit init = TensorInit::kZeros;
};

// Index of each tensor in UnitTensors(config, 0), the head, and UnitTensors(config, 1 + l), a
// block: the layout order.
enum HeadTensor : int { kWte, kWpe, kLnfw, kLnfb, kNumHeadTensors };
enum BlockTensor : int {
  kLn1w,
  kLn1b,
  kQkvw,
  kQkvb,
  kAttprojw,
  kAttprojb,
  kLn2w,
  kLn2b,
  kFcw,
  kFcb,
  kFcprojw,
  kFcprojb,
  kNumBlockTensors
};

int NumUnits(const GptConfig& config);               // num_layers + 1
size_t UnitSize(const GptConfig& config, int unit);  // floats
// The tensors of `unit` in layout order, contiguous, covering UnitSize floats.
std::vector<TensorInfo> UnitTensors(const GptConfig& config, int unit);
// 1 where AdamW weight decay applies (2-D weight matrices and the embeddings), 0 for biases and
// LayerNorm parameters. `mask` holds UnitSize(config, unit) bytes.
void UnitDecayMask(const GptConfig& config, int unit, uint8_t* mask);
// GPT-2 init of `params` (UnitSize floats), a pure function of (config, seed, unit) — never of
// the world size, so any sharding starts from the same model. Each element's value depends only
// on (seed, unit, its index in the unit). Padding rows of wte (>= V) are 0: they are never read
// as embeddings and never receive gradient.
void InitUnit(const GptConfig& config, int unit, uint64_t seed, float* params);

// Sets the threads OpenBLAS uses for every GEMM of this process (openblas_set_num_threads;
// n < 1 means 1). Results are bit-identical run to run at a fixed count but NOT across counts
// (worker/engine/cpu/blas.h), so a job's replays and restarts must use the same count on
// every rank: pin it from a flag, never from the machine's core count.
void SetBlasThreads(int n);
int BlasThreads();

namespace cpu {
template <typename T>
class GptModel;
}  // namespace cpu

// Activations for micro-batches up to (max_B, max_T); parameters and their gradients are NOT
// owned (the ZeRO layer passes each unit's gathered buffer to each call). Not thread-safe: one
// thread drives one GptCpu. Deterministic: the same inputs give bit-identical outputs at a fixed
// BLAS thread count.
class GptCpu {
 public:
  GptCpu(const GptConfig& config, int max_b, int max_t);
  ~GptCpu();
  GptCpu(GptCpu&&) noexcept;
  GptCpu& operator=(GptCpu&&) noexcept;

  const GptConfig& config() const;
  int b() const;
  int t() const;

  // B in [1, max_B], T in [1, max_T] (sampling uses B = 1 and a growing T). Takes effect for
  // the next EncoderForward; the forward and backward of one micro-batch use one shape.
  void SetShape(int b, int t);

  // Forward, unit by unit. `head` is unit 0, `block` unit 1 + layer (UnitSize floats).
  void EncoderForward(const float* head, const int32_t* tokens /* (B, T) */);
  void BlockForward(int layer, const float* block);
  // Final LayerNorm + tied LM head + softmax + mean cross-entropy over the B*T positions.
  // targets == nullptr: inference; returns 0 and keeps the logits (Logits()). Otherwise returns
  // the mean loss and prepares d(loss_scale * mean_loss)/dlogits for the backward, overwriting
  // the logits.
  float ClassifierForward(const float* head, const int32_t* targets /* (B, T) */, float loss_scale);
  // (B, T, Vp) after an inference ClassifierForward; only the first V columns are meaningful.
  const float* Logits() const;
  // Per-position losses (B, T) after a training ClassifierForward.
  const float* Losses() const;

  // Backward, in reverse order; every call ACCUMULATES (+=) into the unit's gradient buffer.
  void ClassifierBackward(const float* head, float* head_grad);
  void BlockBackward(int layer, const float* block, float* block_grad);
  void EncoderBackward(float* head_grad);  // uses no parameter values, only the tokens

  // Bytes of activations and scratch allocated for (max_B, max_T).
  size_t ActivationBytes() const;

 private:
  std::unique_ptr<cpu::GptModel<float>> model_;
};

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_GPT_H_
