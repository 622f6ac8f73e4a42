#include "common/job_spec.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace weft {
namespace {

using weft::v1::JobSpec;

// Larger vocabularies exist in no GPT-2 family model and would overflow padding arithmetic.
constexpr int32_t kMaxVocabSize = 1 << 24;

class CollectingErrors : public google::protobuf::io::ErrorCollector {
 public:
  explicit CollectingErrors(std::string_view filename) : filename_(filename) {}
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    // The parser counts from 0; editors and people count from 1.
    errors_.push_back(absl::StrCat(filename_, ":", line + 1, ":", column + 1, ": ", message));
  }
  void AddWarning(int line, google::protobuf::io::ColumnNumber column,
                  const std::string& message) override {
    AddError(line, column, message);
  }
  const std::vector<std::string>& errors() const { return errors_; }

 private:
  std::string filename_;
  std::vector<std::string> errors_;
};

bool ValidName(const std::string& name, size_t max_len, std::string_view extra_chars) {
  if (name.empty() || name.size() > max_len) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    extra_chars.find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool InUnitInterval(double x, bool include_one) {
  return std::isfinite(x) && x >= 0.0 && (include_one ? x <= 1.0 : x < 1.0);
}

// The architectures engine/llama implements, which share Llama's fields and unit layout.
bool IsLlamaFamily(weft::v1::Architecture architecture) {
  return architecture == weft::v1::LLAMA || architecture == weft::v1::QWEN2 ||
         architecture == weft::v1::QWEN3 || architecture == weft::v1::MISTRAL;
}

// head_dim, or hidden_size / num_heads when unset.
int64_t LlamaHeadDim(const weft::v1::ModelSpec& m) {
  if (m.head_dim() > 0) return m.head_dim();
  return m.num_heads() > 0 ? m.hidden_size() / m.num_heads() : 0;
}

using Complain = std::function<void(const std::string& field, const std::string& problem)>;

// The fields only LLAMA reads; for GPT2 they must be unset, so that a spec never carries a
// number that silently does nothing.
void ValidateLlamaOnlyFieldsUnset(const weft::v1::ModelSpec& m, const Complain& bad) {
  const std::string why = "is a LLAMA field; must be unset for architecture GPT2";
  if (m.num_kv_heads() != 0) bad("model.num_kv_heads", why);
  if (m.intermediate_size() != 0) bad("model.intermediate_size", why);
  if (m.rope_theta() != 0.0) bad("model.rope_theta", why);
  if (m.has_rope_scaling()) bad("model.rope_scaling", why);
  if (m.rms_norm_eps() != 0.0) bad("model.rms_norm_eps", why);
  if (m.head_dim() != 0) bad("model.head_dim", why);
  if (m.sliding_window() != 0) {
    bad("model.sliding_window", "is a MISTRAL field; must be unset for architecture GPT2");
  }
  if (m.has_tie_word_embeddings() && !m.tie_word_embeddings()) {
    bad("model.tie_word_embeddings", "GPT2 always ties the LM head to the token embedding; "
                                     "leave it unset or true");
  }
}

void ValidateRopeScaling(const weft::v1::RopeScaling& r, const Complain& bad) {
  switch (r.kind()) {
    case weft::v1::RopeScaling::KIND_UNSPECIFIED:
    case weft::v1::RopeScaling::NONE:
      if (r.factor() != 0.0 || r.low_freq_factor() != 0.0 || r.high_freq_factor() != 0.0 ||
          r.original_context_length() != 0) {
        bad("model.rope_scaling", "kind NONE takes no factor, low_freq_factor, high_freq_factor "
                                  "or original_context_length");
      }
      return;
    case weft::v1::RopeScaling::LLAMA3:
      if (!(std::isfinite(r.factor()) && r.factor() > 1.0)) {
        bad("model.rope_scaling.factor", absl::StrCat("must be > 1 for LLAMA3, got ", r.factor()));
      }
      if (!(std::isfinite(r.low_freq_factor()) && r.low_freq_factor() > 0.0)) {
        bad("model.rope_scaling.low_freq_factor",
            absl::StrCat("must be > 0 for LLAMA3, got ", r.low_freq_factor()));
      }
      if (!(std::isfinite(r.high_freq_factor()) && r.high_freq_factor() > r.low_freq_factor())) {
        bad("model.rope_scaling.high_freq_factor",
            absl::StrCat("must be > model.rope_scaling.low_freq_factor (", r.low_freq_factor(),
                         ") for LLAMA3, got ", r.high_freq_factor()));
      }
      if (r.original_context_length() < 1) {
        bad("model.rope_scaling.original_context_length",
            absl::StrCat("must be >= 1 for LLAMA3, got ", r.original_context_length()));
      }
      return;
    default:
      bad("model.rope_scaling.kind", absl::StrCat("unknown value ", r.kind(), "; use NONE or LLAMA3"));
  }
}

void ValidateLlamaFields(const weft::v1::ModelSpec& m, const Complain& bad) {
  if (m.num_kv_heads() < 1 || m.num_kv_heads() > m.num_heads()) {
    bad("model.num_kv_heads", absl::StrCat("must be in [1, model.num_heads = ", m.num_heads(),
                                           "], got ", m.num_kv_heads()));
  } else if (m.num_heads() % m.num_kv_heads() != 0) {
    bad("model.num_kv_heads", absl::StrCat("must divide model.num_heads (", m.num_heads(), " % ",
                                           m.num_kv_heads(), " = ",
                                           m.num_heads() % m.num_kv_heads(), ")"));
  }
  if (m.head_dim() != 0) {
    if (m.head_dim() < 2 || m.head_dim() > 1024 || m.head_dim() % 2 != 0) {
      bad("model.head_dim", absl::StrCat("must be even and in [2, 1024] (rotary rotates pairs), "
                                         "got ",
                                         m.head_dim()));
    }
  } else if (m.num_heads() >= 1 && m.hidden_size() >= 1 && m.hidden_size() % m.num_heads() == 0 &&
             (m.hidden_size() / m.num_heads()) % 2 != 0) {
    bad("model.hidden_size", absl::StrCat("the head size hidden_size / num_heads = ",
                                          m.hidden_size() / m.num_heads(),
                                          " must be even for rotary embeddings"));
  }
  if (m.architecture() == weft::v1::MISTRAL) {
    if (m.sliding_window() < 0) {
      bad("model.sliding_window",
          absl::StrCat("must be >= 0 (0: no window), got ", m.sliding_window()));
    }
  } else if (m.sliding_window() != 0) {
    bad("model.sliding_window", absl::StrCat("is a MISTRAL field; must be unset for architecture ",
                                             weft::v1::Architecture_Name(m.architecture())));
  }
  if (m.intermediate_size() < 1 || m.intermediate_size() > 1048576) {
    bad("model.intermediate_size",
        absl::StrCat("must be in [1, 1048576] for ", weft::v1::Architecture_Name(m.architecture()),
                     ", got ", m.intermediate_size()));
  }
  if (!(std::isfinite(m.rope_theta()) && m.rope_theta() > 0.0)) {
    bad("model.rope_theta", absl::StrCat("must be > 0, got ", m.rope_theta()));
  }
  if (!(std::isfinite(m.rms_norm_eps()) && m.rms_norm_eps() > 0.0)) {
    bad("model.rms_norm_eps", absl::StrCat("must be > 0, got ", m.rms_norm_eps()));
  }
  ValidateRopeScaling(m.rope_scaling(), bad);
}

void ValidateModel(const weft::v1::ModelSpec& m, const Complain& bad) {
  if (m.num_layers() < 1) bad("model.num_layers", absl::StrCat("must be >= 1, got ", m.num_layers()));
  if (m.num_layers() > 1024) bad("model.num_layers", absl::StrCat("must be <= 1024, got ", m.num_layers()));
  if (m.hidden_size() < 1) bad("model.hidden_size", absl::StrCat("must be >= 1, got ", m.hidden_size()));
  // Upper bounds far past any real model, so that sizes computed from them (parameter
  // counts, activation plans) cannot overflow.
  if (m.hidden_size() > 65536) {
    bad("model.hidden_size", absl::StrCat("must be <= 65536, got ", m.hidden_size()));
  }
  if (m.num_heads() < 1) {
    bad("model.num_heads", absl::StrCat("must be >= 1, got ", m.num_heads()));
  } else if (m.hidden_size() >= 1 && m.hidden_size() % m.num_heads() != 0 &&
             !(IsLlamaFamily(m.architecture()) && m.head_dim() != 0)) {
    // With its own head_dim, a Llama-family head size is not tied to the width.
    bad("model.hidden_size", absl::StrCat("must be divisible by model.num_heads (", m.hidden_size(),
                                          " % ", m.num_heads(), " = ",
                                          m.hidden_size() % m.num_heads(), ")"));
  }
  if (m.vocab_size() < 2 || m.vocab_size() > kMaxVocabSize) {
    bad("model.vocab_size", absl::StrCat("must be in [2, ", kMaxVocabSize, "], got ", m.vocab_size()));
  }
  if (m.padded_vocab_size() < m.vocab_size()) {
    bad("model.padded_vocab_size", absl::StrCat("must be >= model.vocab_size (", m.vocab_size(),
                                                "), got ", m.padded_vocab_size()));
  } else if (m.padded_vocab_size() > 2 * int64_t{kMaxVocabSize}) {
    bad("model.padded_vocab_size",
        absl::StrCat("must be <= ", 2 * int64_t{kMaxVocabSize}, ", got ", m.padded_vocab_size()));
  }
  if (m.context_length() < 1) bad("model.context_length", absl::StrCat("must be >= 1, got ", m.context_length()));
  if (m.context_length() > 1048576) {
    bad("model.context_length", absl::StrCat("must be <= 1048576, got ", m.context_length()));
  }
  switch (m.architecture()) {
    case weft::v1::ARCHITECTURE_UNSPECIFIED:
    case weft::v1::GPT2:
      ValidateLlamaOnlyFieldsUnset(m, bad);
      break;
    case weft::v1::LLAMA:
    case weft::v1::QWEN2:
    case weft::v1::QWEN3:
    case weft::v1::MISTRAL:
      ValidateLlamaFields(m, bad);
      break;
    default:
      bad("model.architecture", absl::StrCat("unknown value ", m.architecture(),
                                             "; use GPT2, LLAMA, QWEN2, QWEN3 or MISTRAL"));
  }
}


void ValidateDataFormat(const weft::v1::DataSpec& d, const weft::v1::ModelSpec& m,
                        const Complain& bad) {
  switch (d.format()) {
    case weft::v1::DATA_FORMAT_TEXT_BYTES:
      if (m.vocab_size() >= 2 && m.vocab_size() < 256) {
        bad("model.vocab_size", absl::StrCat("must be >= 256 for DATA_FORMAT_TEXT_BYTES, got ",
                                             m.vocab_size()));
      }
      break;
    case weft::v1::DATA_FORMAT_UINT16_BIN:
      if (m.vocab_size() > 65536) {
        bad("model.vocab_size", absl::StrCat("must be <= 65536 for DATA_FORMAT_UINT16_BIN, got ",
                                             m.vocab_size()));
      }
      break;
    case weft::v1::DATA_FORMAT_UINT32_BIN:
      break;  // kMaxVocabSize is far below 2^32
    default:
      bad("data.format",
          "required: DATA_FORMAT_TEXT_BYTES, DATA_FORMAT_UINT16_BIN or DATA_FORMAT_UINT32_BIN");
  }
}

// Hybrid sharding splits ZeRO-3's shards: other stages have nothing to split that way, and a
// generation must consist of whole groups.
void ValidateSharding(const JobSpec& spec, const Complain& bad) {
  const auto& s = spec.sharding();
  if (!weft::v1::ShardingSpec::Scope_IsValid(s.scope())) {
    bad("sharding.scope",
        absl::StrCat("unknown value ", s.scope(), "; use WORLD, HOST, GROUP or AUTO"));
    return;
  }
  if (!weft::v1::ShardingSpec::WireFormat_IsValid(s.replica_reduce_format())) {
    bad("sharding.replica_reduce_format",
        absl::StrCat("unknown value ", s.replica_reduce_format(),
                     "; use WIRE_FP32, WIRE_BF16 or WIRE_INT8"));
  } else if (s.scope() == weft::v1::ShardingSpec::WORLD &&
             s.replica_reduce_format() != weft::v1::ShardingSpec::WIRE_FP32) {
    bad("sharding.replica_reduce_format",
        absl::StrCat(weft::v1::ShardingSpec::WireFormat_Name(s.replica_reduce_format()),
                     " needs scope HOST, GROUP or AUTO: under WORLD the state has one replica, "
                     "and no all-reduce joins replicas"));
  }
  if (!weft::v1::ShardingSpec::ReplicaOptimizer_IsValid(s.replica_optimizer())) {
    bad("sharding.replica_optimizer",
        absl::StrCat("unknown value ", s.replica_optimizer(),
                     "; use OPTIMIZER_REPLICATED or OPTIMIZER_SHARDED"));
  } else if (s.replica_optimizer() == weft::v1::ShardingSpec::OPTIMIZER_SHARDED) {
    if (s.scope() == weft::v1::ShardingSpec::WORLD) {
      bad("sharding.replica_optimizer",
          "OPTIMIZER_SHARDED needs scope HOST, GROUP or AUTO: under WORLD the optimizer state "
          "is sharded over the whole world already");
    }
    if (spec.optimizer().offload() || spec.optimizer().offload_auto()) {
      bad("sharding.replica_optimizer",
          "OPTIMIZER_SHARDED is not with optimizer.offload or offload_auto: an offloaded "
          "optimizer steps whole shards on the host");
    }
  }
  if (s.scope() != weft::v1::ShardingSpec::GROUP && s.group_size() != 0) {
    bad("sharding.group_size",
        absl::StrCat("only for scope GROUP (the group is the world or the host otherwise), got ",
                     s.group_size()));
  }
  if (s.scope() == weft::v1::ShardingSpec::WORLD) return;
  if (spec.zero_stage() != 3) {
    bad("sharding.scope",
        absl::StrCat("HOST, GROUP and AUTO shard ZeRO-3 state: need zero_stage 3, got ",
                     spec.zero_stage()));
  }
  if (s.scope() != weft::v1::ShardingSpec::GROUP) return;
  const int32_t min_workers = spec.resources().min_workers();
  if (s.group_size() < 1) {
    bad("sharding.group_size", absl::StrCat("must be >= 1 for scope GROUP, got ", s.group_size()));
  } else if (min_workers >= 1 && min_workers % s.group_size() != 0) {
    bad("resources.min_workers",
        absl::StrCat("must be a multiple of sharding.group_size (", s.group_size(), "), got ",
                     min_workers, ": a generation is made of whole groups"));
  }
}

// One function per section of the spec, called in the order the violations are listed in
// (people and tests read them in that order). A check across sections sits with the setting
// that imposes it: the data format's limit on model.vocab_size with the data, the device's on
// optimizer.offload with the resources.

void ValidateData(const weft::v1::DataSpec& d, const weft::v1::ModelSpec& m, const Complain& bad) {
  if (!d.manifest_path().empty()) {
    // The manifest names the shards, their format and the tokenizer; the worker checks them
    // against the model when it opens the dataset.
    const std::string why = "must be empty when data.manifest_path is set (the manifest says)";
    if (!d.train_path().empty()) bad("data.train_path", why);
    if (!d.val_path().empty()) bad("data.val_path", why);
    if (!d.tokenizer_path().empty()) bad("data.tokenizer_path", why);
    if (d.format() != weft::v1::DATA_FORMAT_UNSPECIFIED) bad("data.format", why);
  } else {
    if (d.train_path().empty()) bad("data.train_path", "required (or data.manifest_path)");
    ValidateDataFormat(d, m, bad);
  }
  if (!weft::v1::DataSpec::Sampling_IsValid(d.sampling())) {
    bad("data.sampling",
        absl::StrCat("unknown value ", d.sampling(), "; use RANDOM_WINDOWS, SEQUENTIAL or PACKED"));
  }
  // Documents are known only from a prepared dataset (its token flags or EOS separators).
  const bool documents_needed = d.document_masking() || d.sampling() == weft::v1::DataSpec::PACKED;
  if (documents_needed && d.manifest_path().empty()) {
    bad(d.document_masking() ? "data.document_masking" : "data.sampling",
        "needs documents, which only a dataset written by `trainctl data prepare` records: set "
        "data.manifest_path");
  }
  if (d.reset_positions() && !d.document_masking()) {
    bad("data.reset_positions",
        "restarts positions per document, which only makes sense with data.document_masking");
  }
  if (!(std::isfinite(d.val_fraction()) && d.val_fraction() >= 0.0 && d.val_fraction() <= 0.5)) {
    bad("data.val_fraction", absl::StrCat("must be in [0, 0.5], got ", d.val_fraction()));
  }
}

void ValidateOptimizer(const weft::v1::OptimizerSpec& o, const Complain& bad) {
  if (!(std::isfinite(o.learning_rate()) && o.learning_rate() > 0.0)) {
    bad("optimizer.learning_rate", absl::StrCat("must be > 0, got ", o.learning_rate()));
  }
  if (!InUnitInterval(o.beta1(), false)) bad("optimizer.beta1", absl::StrCat("must be in [0, 1), got ", o.beta1()));
  if (!InUnitInterval(o.beta2(), false)) bad("optimizer.beta2", absl::StrCat("must be in [0, 1), got ", o.beta2()));
  if (!(std::isfinite(o.epsilon()) && o.epsilon() > 0.0)) bad("optimizer.epsilon", absl::StrCat("must be > 0, got ", o.epsilon()));
  if (!(std::isfinite(o.weight_decay()) && o.weight_decay() >= 0.0)) {
    bad("optimizer.weight_decay", absl::StrCat("must be >= 0, got ", o.weight_decay()));
  }
  if (!(std::isfinite(o.grad_clip_norm()) && o.grad_clip_norm() >= 0.0)) {
    bad("optimizer.grad_clip_norm", absl::StrCat("must be >= 0, got ", o.grad_clip_norm()));
  }
}

void ValidateTraining(const weft::v1::TrainingSpec& t, const weft::v1::ModelSpec& m,
                      const Complain& bad) {
  if (t.total_steps() < 1) bad("training.total_steps", absl::StrCat("must be >= 1, got ", t.total_steps()));
  if (t.micro_batch_size() < 1) bad("training.micro_batch_size", absl::StrCat("must be >= 1, got ", t.micro_batch_size()));
  if (t.sequence_length() < 1 || (m.context_length() >= 1 && t.sequence_length() > m.context_length())) {
    bad("training.sequence_length", absl::StrCat("must be in [1, model.context_length = ",
                                                 m.context_length(), "], got ", t.sequence_length()));
  }
  if (t.grad_accum_steps() < 1) bad("training.grad_accum_steps", absl::StrCat("must be >= 1, got ", t.grad_accum_steps()));
  if (t.val_interval_steps() < 0) bad("training.val_interval_steps", absl::StrCat("must be >= 0, got ", t.val_interval_steps()));
  if (t.val_interval_steps() > 0 && t.val_batches() < 1) {
    bad("training.val_batches", absl::StrCat("must be >= 1 when validation is enabled, got ", t.val_batches()));
  }
  if (!(std::isfinite(t.device_memory_limit_gib()) && t.device_memory_limit_gib() >= 0.0)) {
    bad("training.device_memory_limit_gib",
        absl::StrCat("must be >= 0 GiB (0: no limit), got ", t.device_memory_limit_gib()));
  }
  if (!weft::v1::ActivationCheckpointing::Level_IsValid(t.activation_checkpointing())) {
    bad("training.activation_checkpointing",
        absl::StrCat("unknown value ", t.activation_checkpointing(), "; use AUTO, NONE, SELECTIVE or FULL"));
  }
}

void ValidateLrSchedule(const weft::v1::LrSchedule& lr, const weft::v1::TrainingSpec& t,
                        const Complain& bad) {
  if (!weft::v1::LrSchedule::Kind_IsValid(lr.kind())) {
    bad("lr_schedule.kind", absl::StrCat("unknown value ", lr.kind(), "; use CONSTANT or COSINE"));
  }
  if (lr.warmup_steps() < 0 || (t.total_steps() >= 1 && lr.warmup_steps() >= t.total_steps())) {
    bad("lr_schedule.warmup_steps", absl::StrCat("must be in [0, training.total_steps = ",
                                                 t.total_steps(), "), got ", lr.warmup_steps()));
  }
  if (!InUnitInterval(lr.min_lr_ratio(), true)) {
    bad("lr_schedule.min_lr_ratio", absl::StrCat("must be in [0, 1], got ", lr.min_lr_ratio()));
  }
}

// Offloading moves optimizer state from the GPU to the host, so it depends on the device.
void ValidateOffload(const JobSpec& spec, const Complain& bad) {
  const auto& o = spec.optimizer();
  const auto& r = spec.resources();
  if (o.offload() && r.device_kind() == weft::v1::DEVICE_KIND_CPU) {
    bad("optimizer.offload", "only for DEVICE_KIND_CUDA jobs: the CPU engine's optimizer state is in host memory already");
  }
  if (o.offload_auto() && r.device_kind() == weft::v1::DEVICE_KIND_CPU) {
    bad("optimizer.offload_auto", "only for DEVICE_KIND_CUDA jobs: the CPU engine's optimizer state is in host memory already");
  } else if (o.offload_auto() && (o.offload() || o.offload_fraction() != 0.0)) {
    bad("optimizer.offload_auto",
        "set with optimizer.offload or offload_fraction: offload_auto chooses the share itself; "
        "set either offload_auto alone or offload (with or without offload_fraction)");
  } else if (o.offload_auto() && spec.sharding().scope() != weft::v1::ShardingSpec::WORLD) {
    // Each rank chooses from its own free memory, and the host and GPU optimizers agree only to
    // rounding: two copies of one shard could drift apart.
    bad("optimizer.offload_auto",
        "not with sharding.scope HOST, GROUP or AUTO: the ranks that hold copies of one shard "
        "could choose different shares; set optimizer.offload with offload_fraction instead");
  }
  if (!InUnitInterval(o.offload_fraction(), true)) {
    bad("optimizer.offload_fraction",
        absl::StrCat("must be in [0, 1] (0: all of it), got ", o.offload_fraction()));
  } else if (o.offload_fraction() > 0.0 && !o.offload()) {
    bad("optimizer.offload_fraction",
        "set without optimizer.offload: true (the share applies to an offloaded optimizer)");
  }
}

// The resources, and what the device decides: the precision and optimizer offload.
void ValidateResources(const JobSpec& spec, const Complain& bad) {
  const auto& r = spec.resources();
  if (r.device_kind() != weft::v1::DEVICE_KIND_CPU && r.device_kind() != weft::v1::DEVICE_KIND_CUDA) {
    bad("resources.device_kind", "required: DEVICE_KIND_CPU or DEVICE_KIND_CUDA");
  }
  if (!weft::v1::Precision_IsValid(spec.precision())) {
    bad("precision", absl::StrCat("unknown value ", spec.precision(), "; use FP32, BF16 or FP8"));
  }
  ValidateOffload(spec, bad);
  if (spec.precision() == weft::v1::BF16 && r.device_kind() == weft::v1::DEVICE_KIND_CPU) {
    bad("precision", "BF16 needs resources.device_kind DEVICE_KIND_CUDA (the CPU engine is FP32)");
  }
  if (spec.precision() == weft::v1::FP8 && r.device_kind() != weft::v1::DEVICE_KIND_CUDA) {
    bad("precision", "FP8 needs resources.device_kind DEVICE_KIND_CUDA (the CPU engine is FP32)");
  }
  // FP8's GEMMs take rows in multiples of 16 (the model refuses widths that are not, by name).
  const int64_t rows =
      static_cast<int64_t>(spec.training().micro_batch_size()) * spec.training().sequence_length();
  if (spec.precision() == weft::v1::FP8 && rows > 0 && rows % 16 != 0) {
    bad("precision",
        absl::StrCat("FP8 needs training.micro_batch_size x training.sequence_length a multiple "
                     "of 16 (its GEMMs' rows), got ",
                     rows));
  }
  // The CUDA engine has no fp32 math: accepting FP32 there would train in bf16 unasked.
  if (spec.precision() == weft::v1::FP32 && r.device_kind() == weft::v1::DEVICE_KIND_CUDA) {
    bad("precision",
        "FP32 is the CPU engine's; DEVICE_KIND_CUDA trains in BF16 (fp32 master weights, "
        "optimizer state and gradient reductions): use BF16 or leave it unset");
  }
  if (r.min_workers() < 1) bad("resources.min_workers", absl::StrCat("must be >= 1, got ", r.min_workers()));
  if (r.max_workers() < r.min_workers()) {
    bad("resources.max_workers", absl::StrCat("must be >= resources.min_workers (", r.min_workers(),
                                              "), got ", r.max_workers()));
  }
  if (r.max_workers() > 65536) bad("resources.max_workers", absl::StrCat("must be <= 65536, got ", r.max_workers()));
}

void ValidateCheckpoint(const weft::v1::CheckpointPolicy& c, const Complain& bad) {
  if (c.interval_steps() < 0) bad("checkpoint.interval_steps", absl::StrCat("must be >= 0, got ", c.interval_steps()));
  if (c.keep_last() < 1) bad("checkpoint.keep_last", absl::StrCat("must be >= 1, got ", c.keep_last()));
}

void ValidateFault(const weft::v1::FaultPolicy& f, const Complain& bad) {
  if (f.heartbeat_interval_ms() < 10) {
    bad("fault.heartbeat_interval_ms", absl::StrCat("must be >= 10, got ", f.heartbeat_interval_ms()));
  }
  if (f.heartbeat_timeout_ms() <= f.heartbeat_interval_ms()) {
    bad("fault.heartbeat_timeout_ms", absl::StrCat("must be > fault.heartbeat_interval_ms (",
                                                   f.heartbeat_interval_ms(), "), got ",
                                                   f.heartbeat_timeout_ms()));
  }
  if (f.max_restarts() < 0) bad("fault.max_restarts", absl::StrCat("must be >= 0, got ", f.max_restarts()));
  if (f.max_skipped_steps() < 0) {
    bad("fault.max_skipped_steps", absl::StrCat("must be >= 0, got ", f.max_skipped_steps()));
  }
  if (f.stall_timeout_ms() <= f.heartbeat_timeout_ms()) {
    bad("fault.stall_timeout_ms", absl::StrCat("must be > fault.heartbeat_timeout_ms (",
                                               f.heartbeat_timeout_ms(), "), got ",
                                               f.stall_timeout_ms()));
  }
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpecText(std::string_view text, std::string_view filename) {
  JobSpec spec;
  CollectingErrors errors(filename);
  google::protobuf::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
  if (!parser.Parse(&input, &spec)) {
    if (errors.errors().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(std::string(filename), ": not a text-format JobSpec"));
    }
    return absl::InvalidArgumentError(absl::StrJoin(errors.errors(), "\n"));
  }
  return spec;
}

absl::StatusOr<JobSpec> ReadJobSpecFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": is a directory, not a job spec file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open job spec: ",
                                            std::strerror(errno)));
  }
  std::stringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat(path, ": read failed: ", std::strerror(errno)));
  }
  return ParseJobSpecText(buffer.str(), path);
}

void ApplyJobSpecDefaults(JobSpec* spec) {
  auto* model = spec->mutable_model();
  if (model->padded_vocab_size() == 0 && model->vocab_size() > 0 &&
      model->vocab_size() <= kMaxVocabSize) {
    model->set_padded_vocab_size((model->vocab_size() + 127) / 128 * 128);
  }
  if (model->architecture() == weft::v1::ARCHITECTURE_UNSPECIFIED) {
    model->set_architecture(weft::v1::GPT2);
  }
  if (IsLlamaFamily(model->architecture())) {
    if (model->num_kv_heads() == 0) model->set_num_kv_heads(model->num_heads());
    // head_dim stays 0 (hidden_size / num_heads) unless set: a default filled in here would go
    // stale when a spec's width or heads change later.
    if (model->rope_theta() == 0.0) model->set_rope_theta(10000.0);
    if (model->rms_norm_eps() == 0.0) model->set_rms_norm_eps(1e-5);
    if (!model->has_tie_word_embeddings()) model->set_tie_word_embeddings(false);
    if (model->rope_scaling().kind() == weft::v1::RopeScaling::KIND_UNSPECIFIED) {
      model->mutable_rope_scaling()->set_kind(weft::v1::RopeScaling::NONE);
    }
  }
  auto* data = spec->mutable_data();
  if (data->val_fraction() == 0.0 && data->val_path().empty()) data->set_val_fraction(0.1);

  auto* opt = spec->mutable_optimizer();
  if (!opt->has_beta1()) opt->set_beta1(0.9);
  if (!opt->has_beta2()) opt->set_beta2(0.95);
  if (!opt->has_epsilon()) opt->set_epsilon(1e-8);
  if (!opt->has_weight_decay()) opt->set_weight_decay(0.1);
  if (!opt->has_grad_clip_norm()) opt->set_grad_clip_norm(1.0);

  auto* lr = spec->mutable_lr_schedule();
  if (lr->kind() == weft::v1::LrSchedule::KIND_UNSPECIFIED) {
    lr->set_kind(weft::v1::LrSchedule::COSINE);
  }
  if (!lr->has_min_lr_ratio()) lr->set_min_lr_ratio(0.1);

  auto* train = spec->mutable_training();
  if (train->sequence_length() == 0) train->set_sequence_length(model->context_length());
  if (train->grad_accum_steps() == 0) train->set_grad_accum_steps(1);
  if (train->val_interval_steps() > 0 && train->val_batches() == 0) train->set_val_batches(8);
  if (train->activation_checkpointing() == weft::v1::ActivationCheckpointing::LEVEL_UNSPECIFIED) {
    train->set_activation_checkpointing(weft::v1::ActivationCheckpointing::AUTO);
  }

  auto* res = spec->mutable_resources();
  if (spec->precision() == weft::v1::PRECISION_UNSPECIFIED) {
    spec->set_precision(res->device_kind() == weft::v1::DEVICE_KIND_CUDA ? weft::v1::BF16
                                                                         : weft::v1::FP32);
  }
  if (res->max_workers() == 0) res->set_max_workers(res->min_workers());

  auto* ckpt = spec->mutable_checkpoint();
  if (ckpt->keep_last() == 0) ckpt->set_keep_last(3);

  auto* fault = spec->mutable_fault();
  if (fault->heartbeat_interval_ms() == 0) fault->set_heartbeat_interval_ms(500);
  if (fault->heartbeat_timeout_ms() == 0) fault->set_heartbeat_timeout_ms(3000);
  if (!fault->has_max_restarts()) fault->set_max_restarts(3);
  if (!fault->has_max_skipped_steps()) fault->set_max_skipped_steps(3);
  if (fault->stall_timeout_ms() == 0) fault->set_stall_timeout_ms(300000);
}

std::vector<std::string> ValidateJobSpec(const JobSpec& spec) {
  std::vector<std::string> v;
  auto bad = [&v](const std::string& field, const std::string& problem) {
    v.push_back(absl::StrCat(field, ": ", problem));
  };

  if (spec.name().empty()) {
    bad("name", "required");
  } else if (!ValidName(spec.name(), 64, "._-")) {
    bad("name", absl::StrCat("\"", spec.name(),
                             "\" must be 1-64 characters of letters, digits, '.', '_', '-'"));
  }

  ValidateModel(spec.model(), bad);
  ValidateData(spec.data(), spec.model(), bad);
  ValidateOptimizer(spec.optimizer(), bad);
  ValidateTraining(spec.training(), spec.model(), bad);
  ValidateLrSchedule(spec.lr_schedule(), spec.training(), bad);
  if (spec.zero_stage() < 0 || spec.zero_stage() > 3) {
    bad("zero_stage", absl::StrCat("must be in [0, 3], got ", spec.zero_stage()));
  }
  ValidateResources(spec, bad);
  ValidateSharding(spec, bad);
  if (!spec.init_from_hf_dir().empty() && !spec.resume_from_job().empty()) {
    bad("init_from_hf_dir", "not together with resume_from_job: a job starts from one of them");
  }
  ValidateCheckpoint(spec.checkpoint(), bad);
  ValidateFault(spec.fault(), bad);
  return v;
}

absl::StatusOr<JobSpec> NormalizeJobSpec(JobSpec spec) {
  ApplyJobSpecDefaults(&spec);
  std::vector<std::string> violations = ValidateJobSpec(spec);
  if (!violations.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid job spec (", violations.size(), " problem",
                     violations.size() == 1 ? "" : "s", "):\n", absl::StrJoin(violations, "\n")));
  }
  return spec;
}

int64_t ModelParameterCount(const weft::v1::ModelSpec& m) {
  const int64_t c = m.hidden_size();
  const int64_t l = m.num_layers();
  const int64_t v = m.padded_vocab_size() > 0 ? m.padded_vocab_size() : m.vocab_size();
  if (IsLlamaFamily(m.architecture())) {
    const int64_t nh = m.num_heads() > 0 ? m.num_heads() : 1;
    const int64_t kv = m.num_kv_heads() > 0 ? m.num_kv_heads() : nh;
    const int64_t d = LlamaHeadDim(m);
    const int64_t q_width = nh * d;
    const int64_t qkv_width = q_width + 2 * kv * d;
    // Per block: 2 RMSNorms (2C), QKV (qkv_width x C), output (C x q_width), gate and up
    // (2 x C x I), down (I x C); QWEN2's q, k, v biases, QWEN3's q and k head norms. Head:
    // embedding, final RMSNorm, and an untied LM head.
    const int64_t i = m.intermediate_size();
    int64_t per_block = 2 * c + c * qkv_width + q_width * c + 3 * c * i;
    if (m.architecture() == weft::v1::QWEN2) per_block += qkv_width;
    if (m.architecture() == weft::v1::QWEN3) per_block += 2 * d;
    const bool tied = m.has_tie_word_embeddings() && m.tie_word_embeddings();
    return v * c * (tied ? 1 : 2) + c + l * per_block;
  }
  const int64_t t = m.context_length();
  // Per block: 2 LayerNorms (4C), QKV (3C^2 + 3C), attention projection (C^2 + C),
  // MLP up (4C^2 + 4C) and down (4C^2 + C).
  const int64_t per_block = 12 * c * c + 13 * c;
  return v * c + t * c + l * per_block + 2 * c;
}

int64_t CheckpointRankBytes(const weft::v1::ModelSpec& model, int world) {
  const int64_t w = std::max(world, 1);
  return 12 * ((ModelParameterCount(model) + w - 1) / w);
}

std::string ModelDifference(const weft::v1::ModelSpec& here_raw,
                            const weft::v1::ModelSpec& there_raw, std::string_view here_name,
                            std::string_view there_name) {
  // With defaults filled in: a manifest written by hand or by an older release may leave
  // derived fields (padded_vocab_size) unset.
  auto normalized = [](const weft::v1::ModelSpec& model) {
    weft::v1::JobSpec spec;
    *spec.mutable_model() = model;
    ApplyJobSpecDefaults(&spec);
    return spec.model();
  };
  const weft::v1::ModelSpec here = normalized(here_raw);
  const weft::v1::ModelSpec there = normalized(there_raw);
  // The fields that shape the parameters; rope_theta, rope_scaling, rms_norm_eps and sliding_window
  // change only what the same tensors compute (a long-context continuation changes rope_theta on
  // purpose), and context_length shapes only GPT-2's position embedding.
  const bool gpt2 = here.architecture() == weft::v1::GPT2 ||
                    here.architecture() == weft::v1::ARCHITECTURE_UNSPECIFIED;
  const std::vector<std::pair<const char*, std::pair<int64_t, int64_t>>> fields = {
      {"architecture",
       {here.architecture() == weft::v1::ARCHITECTURE_UNSPECIFIED ? weft::v1::GPT2
                                                                  : here.architecture(),
        there.architecture() == weft::v1::ARCHITECTURE_UNSPECIFIED ? weft::v1::GPT2
                                                                   : there.architecture()}},
      {"num_layers", {here.num_layers(), there.num_layers()}},
      {"hidden_size", {here.hidden_size(), there.hidden_size()}},
      {"num_heads", {here.num_heads(), there.num_heads()}},
      {"num_kv_heads", {here.num_kv_heads(), there.num_kv_heads()}},
      {"head_dim", {gpt2 ? 0 : LlamaHeadDim(here), gpt2 ? 0 : LlamaHeadDim(there)}},
      {"intermediate_size", {here.intermediate_size(), there.intermediate_size()}},
      {"padded_vocab_size", {here.padded_vocab_size(), there.padded_vocab_size()}},
      {"tie_word_embeddings", {here.tie_word_embeddings(), there.tie_word_embeddings()}},
      {"context_length", {gpt2 ? here.context_length() : 0, gpt2 ? there.context_length() : 0}},
  };
  for (const auto& [name, values] : fields) {
    if (values.first == values.second) continue;
    auto text = [name = std::string_view(name)](int64_t v) {
      if (name == "architecture") {
        return weft::v1::Architecture_Name(static_cast<weft::v1::Architecture>(v));
      }
      if (name == "tie_word_embeddings") return std::string(v ? "true" : "false");
      return absl::StrCat(v);
    };
    return absl::StrCat("model.", name, ": ", text(values.first), " ", std::string(here_name),
                        ", ", text(values.second), " ", std::string(there_name));
  }
  return "";
}

}  // namespace weft
