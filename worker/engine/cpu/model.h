// What the CPU ZeRO engine (worker/zero/zero_cpu.h) and sampling (worker/model_io/model_file.h)
// drive: one architecture's model in fp32, unit by unit (unit 0 the head, unit 1 + l block l: see
// engine/model_arch.h). Implemented per architecture (engine/cpu/gpt2_model.h for GPT-2) and
// found by FindCpuModel, the CPU's one registry (engine/cpu/model_factory.cc).
//
// Activations for micro-batches up to (max_B, max_T) are owned; parameters and their gradients
// are NOT (the ZeRO layer passes each unit's gathered buffer to each call). Not thread-safe: one
// thread drives one model. Deterministic: the same inputs give bit-identical outputs at a fixed
// BLAS thread count (engine/cpu/blas.h).
//
// A training micro-step, with every backward ACCUMULATING (+=) into the unit's gradient:
//   model.SetShape(B, T);
//   model.SetDocuments(doc_starts, reset_positions);   // packed documents; optional
//   model.EncoderForward(head, tokens);
//   for l = 0 .. L-1: model.BlockForward(l, block[l]);
//   loss = model.ClassifierForward(head, targets, 1.0f / (world * accum));
//   model.ClassifierBackward(head, head_grad);
//   for l = L-1 .. 0: model.BlockBackward(l, block[l], block_grad[l]);
//   model.EncoderBackward(head_grad);
// The parameter buffers passed to a backward must hold the same values as in its forward (at
// kSelective and kFull the backward first recomputes from them what the forward did not keep).
// Calls out of this order are programmer errors and abort with a message.
#ifndef WEFT_WORKER_ENGINE_CPU_MODEL_H_
#define WEFT_WORKER_ENGINE_CPU_MODEL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "worker/engine/checkpointing.h"
#include "worker/engine/model_arch.h"

namespace weft::engine::cpu {

class CpuModel {
 public:
  virtual ~CpuModel() = default;

  // What the model keeps per block (engine/checkpointing.h); fixed at creation.
  virtual Checkpointing checkpointing() const = 0;
  virtual int b() const = 0;
  virtual int t() const = 0;

  // B in [1, max_B], T in [1, max_T] (sampling uses B = 1 and a growing T). Takes effect for
  // the next EncoderForward; the forward and backward of one micro-batch use one shape.
  virtual void SetShape(int b, int t) = 0;
  // Packed sequences (after SetShape, before EncoderForward; SetShape clears them): row b holds
  // documents starting where doc_starts (B, T) says (doc_starts[b, t] = the position its
  // document begins at: t itself or doc_starts[b, t - 1]); attention never crosses a document,
  // and with reset_positions a position counts from its document's start (rotary angle or
  // position embedding). nullptr: one document a row.
  virtual void SetDocuments(const int32_t* doc_starts /* (B, T) */, bool reset_positions) = 0;

  // Forward, unit by unit. `head` is unit 0, `block` unit 1 + layer (UnitSize floats).
  // Token embeddings of the (B, T) tokens into the residual stream.
  virtual void EncoderForward(const float* head, const int32_t* tokens /* (B, T) */) = 0;
  virtual void BlockForward(int layer, const float* block) = 0;
  // Final norm + LM head + softmax + cross-entropy summed over the B*T positions and divided by
  // B*T; a negative target is ignored (loss 0, no gradient: Hugging Face's labels = -100).
  // targets == nullptr: inference; returns 0 and keeps the logits (Logits()). Otherwise returns
  // the mean loss and prepares d(loss_scale * mean_loss)/dlogits for the backward, overwriting
  // the logits.
  virtual float ClassifierForward(const float* head, const int32_t* targets /* (B, T) */,
                                  float loss_scale) = 0;
  // (B, T, padded vocab) after an inference ClassifierForward; only the first vocab_size
  // columns are meaningful.
  virtual const float* Logits() const = 0;
  // Per-position losses (B, T) after a training ClassifierForward.
  virtual const float* Losses() const = 0;

  // Backward, in reverse order; every call ACCUMULATES (+=) into the unit's gradient buffer.
  virtual void ClassifierBackward(const float* head, float* head_grad) = 0;
  virtual void BlockBackward(int layer, const float* block, float* block_grad) = 0;
  virtual void EncoderBackward(float* head_grad) = 0;  // needs only the tokens, no parameters

  // Bytes of activations and scratch allocated for (max_B, max_T) at the model's checkpointing
  // level (the per-position formulas are in each model's header).
  virtual size_t ActivationBytes() const = 0;
};

// One architecture's CPU model, found once by FindCpuModel, so that nothing after that can
// meet an architecture without one. Refers to the ModelArch it was found for, which must
// outlive it.
struct CpuModelEntry {
  // The fp32 model for micro-batches up to (max_b, max_t); max_t <= context length; keeping
  // per block what `level` says.
  std::function<std::unique_ptr<CpuModel>(int max_b, int max_t, Checkpointing level)> create;
  // create(max_b, max_t, level)->ActivationBytes(), counted without allocating the activations
  // (the CPU memory plan: worker/zero/zero_cpu.h's PlanCpuMemory).
  std::function<size_t(int max_b, int max_t, Checkpointing level)> activation_bytes;
};

// The CPU model of `arch`: INVALID_ARGUMENT naming the architecture when none is registered
// (engine/cpu/model_factory.cc, the CPU's one registration point: a line per architecture).
absl::StatusOr<CpuModelEntry> FindCpuModel(const ModelArch& arch);

// FindCpuModel(arch)->create(max_b, max_t, level).
absl::StatusOr<std::unique_ptr<CpuModel>> CreateCpuModel(const ModelArch& arch, int max_b,
                                                         int max_t, Checkpointing level);

// FindCpuModel(arch)->activation_bytes(max_b, max_t, level).
absl::StatusOr<size_t> PlanCpuActivationBytes(const ModelArch& arch, int max_b, int max_t,
                                              Checkpointing level);

// Sets the threads OpenBLAS uses for every GEMM of this process (openblas_set_num_threads;
// n < 1 means 1). Results are bit-identical run to run at a fixed count but NOT across counts
// (engine/cpu/blas.h), so a job's replays and restarts must use the same count on every rank:
// pin it from a flag, never from the machine's core count.
void SetBlasThreads(int n);
int BlasThreads();

}  // namespace weft::engine::cpu

#endif  // WEFT_WORKER_ENGINE_CPU_MODEL_H_
