// A ModelArch no device registers, as a new family is until its models are: the registries
// (engine/cpu/model_factory.cc, engine/cuda/model_factory.cc) must refuse it by name.
#ifndef WEFT_TESTS_WORKER_ENGINE_UNREGISTERED_ARCH_H_
#define WEFT_TESTS_WORKER_ENGINE_UNREGISTERED_ARCH_H_

#include <cstddef>
#include <string>
#include <vector>

#include "worker/engine/model_arch.h"

namespace weft::engine::testing {

class UnregisteredArch final : public ModelArch {
 public:
  std::string name() const override { return "unregistered"; }
  int num_layers() const override { return 1; }
  int vocab_size() const override { return 8; }
  int padded_vocab_size() const override { return 8; }
  int context_length() const override { return 4; }
  size_t UnitSize(int) const override { return 8; }
  std::vector<TensorInfo> UnitTensors(int) const override { return {}; }
};

}  // namespace weft::engine::testing

#endif  // WEFT_TESTS_WORKER_ENGINE_UNREGISTERED_ARCH_H_
