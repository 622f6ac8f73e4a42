// Shared by the tests of worker/hf: tiny GPT-2 and Llama specs, parameters exactly representable
// in every dtype, and Hugging Face directories written from them.
#ifndef WEFT_TESTS_WORKER_HF_HF_TEST_UTIL_H_
#define WEFT_TESTS_WORKER_HF_HF_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "worker/engine/model_arch.h"
#include "worker/hf/hf_export.h"
#include "weft/v1/job.pb.h"

namespace weft::hf::testing {

// vocab 61 pads to 64 (a padding row in the head), 2 layers.
inline weft::v1::ModelSpec TinyGpt2() {
  weft::v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(4);
  m->set_vocab_size(61);
  m->set_padded_vocab_size(64);
  m->set_context_length(8);
  ApplyJobSpecDefaults(&spec);
  return spec.model();
}

// Grouped-query attention (4 heads, 2 KV heads), rotary with llama3 scaling.
inline weft::v1::ModelSpec TinyLlama(bool tied) {
  weft::v1::JobSpec spec;
  auto* m = spec.mutable_model();
  m->set_architecture(weft::v1::LLAMA);
  m->set_num_layers(2);
  m->set_hidden_size(16);
  m->set_num_heads(4);
  m->set_num_kv_heads(2);
  m->set_intermediate_size(24);
  m->set_vocab_size(61);
  m->set_padded_vocab_size(64);
  m->set_context_length(8);
  m->set_rope_theta(500000);
  m->set_rms_norm_eps(1e-5);
  m->set_tie_word_embeddings(tied);
  auto* r = m->mutable_rope_scaling();
  r->set_kind(weft::v1::RopeScaling::LLAMA3);
  r->set_factor(8);
  r->set_low_freq_factor(1);
  r->set_high_freq_factor(4);
  r->set_original_context_length(16);
  ApplyJobSpecDefaults(&spec);
  return spec.model();
}

inline std::unique_ptr<const engine::ModelArch> ArchOf(const weft::v1::ModelSpec& spec) {
  auto arch = engine::MakeModelArch(spec);
  EXPECT_TRUE(arch.ok()) << arch.status();
  return std::move(*arch);
}

// Every unit's parameters: k / 64 for k in [-127, 127] (exact in F32, BF16 and F16), distinct
// along each tensor, 0 in the vocabulary padding rows (which an import leaves 0).
inline std::vector<std::vector<float>> ExactUnits(const engine::ModelArch& arch, uint32_t seed) {
  std::vector<std::vector<float>> units;
  uint32_t x = seed * 2654435761u + 1;
  for (int u = 0; u < arch.NumUnits(); ++u) {
    std::vector<float> unit(arch.UnitSize(u), 0.0f);
    for (const engine::TensorInfo& t : arch.UnitTensors(u)) {
      for (size_t i = 0; i < t.live_size; ++i) {
        x = x * 1664525u + 1013904223u;
        unit[t.offset + i] = static_cast<float>(static_cast<int>((x >> 8) % 255) - 127) / 64.0f;
      }
    }
    units.push_back(std::move(unit));
  }
  return units;
}

// Writes `units` of `spec` as a Hugging Face directory `dir` (which must not exist).
inline void WriteHfDir(const std::string& dir, const weft::v1::ModelSpec& spec,
                       const std::vector<std::vector<float>>& units, model_io::Dtype dtype,
                       uint64_t max_shard_bytes = 5'000'000'000) {
  HfExportOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = max_shard_bytes;
  const absl::Status s = ExportHf(dir, spec, units, options);
  ASSERT_TRUE(s.ok()) << s;
}

}  // namespace weft::hf::testing

#endif  // WEFT_TESTS_WORKER_HF_HF_TEST_UTIL_H_
