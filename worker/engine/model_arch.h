// A model architecture, device-independent: how its parameters are grouped into UNITS (the
// unit of ZeRO-3 sharding, of checkpoint tensors and of the per-unit forward/backward), which
// tensors each unit holds, and how they are initialised. Every device's model
// (engine/cpu/model.h, engine/cuda/model.h) and every ZeRO engine reads the layout from here,
// so checkpoints and initial weights are the same on every device and world size.
//
// Unit convention, for every architecture:
//   unit 0      the "head": token (and any position) embeddings, the final norm and the LM
//               head (tied to the embedding or not: the architecture says)
//   unit 1 + l  transformer block l, for l in [0, num_layers)
//
// MakeModelArch is the one place an architecture is registered (engine/model_arch.cc); each
// architecture's layout lives in its own folder (engine/gpt2/ for GPT-2).
#ifndef WEFT_WORKER_ENGINE_MODEL_ARCH_H_
#define WEFT_WORKER_ENGINE_MODEL_ARCH_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "weft/v1/job.pb.h"

namespace weft::engine {

// How a tensor of a unit is initialised. Architectures pick from these; InitUnit applies them.
enum class TensorInit {
  kNormal,          // N(0, 0.02)
  kResidualNormal,  // N(0, 0.02 / sqrt(2 * num_layers)): projections into the residual stream
  kZeros,           // biases
  kOnes,            // norm weights
};

// One tensor inside a unit's flat buffer. The table drives init, the decay mask and the
// models' parameter views, and names tensors in model files.
struct TensorInfo {
  std::string name;            // unique in the model, e.g. "wte", "h.<l>.qkvw"
  size_t offset = 0;           // floats from the start of the unit
  std::vector<int64_t> shape;  // row-major
  size_t size = 0;             // floats
  bool decay = false;          // AdamW weight decay applies
  TensorInit init = TensorInit::kZeros;
  // Elements [live_size, size) are vocabulary padding: 0 at init, never read as an input and
  // never a target, so they stay 0. AppendTensor sets live_size = size.
  size_t live_size = 0;
};

// Appends a tensor right after the last one of `tensors` (units are tiled without gaps).
void AppendTensor(std::vector<TensorInfo>* tensors, std::string name, std::vector<int64_t> shape,
                  bool decay, TensorInit init);
// Writes 1 where `tensors` says weight decay applies, 0 elsewhere, over the unit they tile.
void FillDecayMask(const std::vector<TensorInfo>& tensors, uint8_t* mask);
// The same for elements [begin, end) of the unit only: mask[0] is element `begin`.
void FillDecayMaskRange(const std::vector<TensorInfo>& tensors, size_t begin, size_t end,
                        uint8_t* mask);

// Fills `params`, the unit `tensors` tile, by each tensor's TensorInit: noise drawn through
// StandardNormalAt(key, offset in the unit), kResidualNormal scaled for `num_layers` blocks, and
// 0 past each tensor's live_size.
void InitTensors(const std::vector<TensorInfo>& tensors, uint64_t key, int num_layers,
                 float* params);
// Elements [begin, end) of what InitTensors writes (end at most the unit's size), into
// out[0, end - begin), bit for bit the same values. The range is cut into `threads` chunks run
// on their own threads (0: as many as the hardware has, fewer for a small range); each element
// is a function of (key, index) alone, so the result never depends on the thread count.
void InitTensorRange(const std::vector<TensorInfo>& tensors, uint64_t key, int num_layers,
                     size_t begin, size_t end, float* out, int threads = 0);

// Counter-based initialisation noise: a standard normal that is a function of (seed, unit,
// index in the unit) alone, so a unit's values never depend on how it is split across ranks
// or threads. Architectures draw every random init through these two.
uint64_t InitStreamKey(uint64_t seed, int unit);
double StandardNormalAt(uint64_t key, uint64_t index);

class ModelArch {
 public:
  virtual ~ModelArch() = default;

  // Short lowercase name ("gpt2"): messages and the model file's format tag.
  virtual std::string name() const = 0;

  virtual int num_layers() const = 0;
  int NumUnits() const { return num_layers() + 1; }
  // Token ids are in [0, vocab_size()); the logits rows hold padded_vocab_size() >= vocab
  // columns, of which only the first vocab_size() are meaningful.
  virtual int vocab_size() const = 0;
  virtual int padded_vocab_size() const = 0;
  // Longest sequence the model takes.
  virtual int context_length() const = 0;

  // Floats in `unit`. Aborts for a unit outside [0, NumUnits()) (a programmer error).
  virtual size_t UnitSize(int unit) const = 0;
  // The tensors of `unit` in layout order, contiguous, covering UnitSize(unit) floats.
  virtual std::vector<TensorInfo> UnitTensors(int unit) const = 0;
  // Initial values of `unit` (UnitSize floats): a pure function of (architecture, seed, unit),
  // never of the world size or device, so any sharding starts from the same model. Each
  // tensor's TensorInit (its UnitTensors entry) says how it starts, noise through
  // InitStreamKey(seed, unit) and StandardNormalAt.
  void InitUnit(int unit, uint64_t seed, float* params) const {
    InitUnitRange(unit, seed, 0, UnitSize(unit), params);
  }
  // Elements [begin, end) of InitUnit's values (end <= UnitSize(unit)) into out[0, end - begin),
  // identical bit for bit: how a rank initialises only the part of a unit it keeps. `threads`
  // as InitTensorRange (0: the hardware's count).
  void InitUnitRange(int unit, uint64_t seed, size_t begin, size_t end, float* out,
                     int threads = 0) const;

  // 1 where AdamW weight decay applies, per UnitTensors; `mask` holds UnitSize(unit) bytes.
  void UnitDecayMask(int unit, uint8_t* mask) const { FillDecayMask(UnitTensors(unit), mask); }
  // Elements [begin, end) of UnitDecayMask into mask[0, end - begin).
  void UnitDecayMaskRange(int unit, size_t begin, size_t end, uint8_t* mask) const {
    FillDecayMaskRange(UnitTensors(unit), begin, end, mask);
  }
  // Parameters of the whole model (sum of the unit sizes).
  size_t ParameterCount() const;

  // Where unit 0 splits into what the two ends of the model read: the embedding reads elements
  // [0, HeadOutputBegin()) only, the final norm and LM head [HeadOutputBegin(), UnitSize(0))
  // only, so an engine need never hold both at once. 0 (the default) when one tensor serves
  // both ends (a tied head): every part of the unit is read at both.
  virtual size_t HeadOutputBegin() const { return 0; }
};

// The architecture of `spec`: INVALID_ARGUMENT for sizes no architecture can take (specs that
// passed ValidateJobSpec never fail). Registering a new architecture is one case here.
absl::StatusOr<std::unique_ptr<const ModelArch>> MakeModelArch(const weft::v1::ModelSpec& spec);

}  // namespace weft::engine

#endif  // WEFT_WORKER_ENGINE_MODEL_ARCH_H_
