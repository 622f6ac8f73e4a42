// config.json <-> ModelSpec: derivation with transformers' defaults, the round trip through
// HfConfigJson, and a named refusal for every unsupported key and every mismatching field.
#include "worker/hf/hf_config.h"

#include <string>

#include "common/job_spec.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/hf/hf_test_util.h"

namespace weft::hf {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TinyGpt2;
using testing::TinyLlama;
using Json = nlohmann::json;

// A Llama-3.2-1B-like config.json as transformers writes it.
Json LlamaConfig() {
  return Json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0", "use_cache": true, "vocab_size": 128256})");
}

Json Gpt2Config() {
  return Json::parse(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.0,
    "bos_token_id": 50256, "embd_pdrop": 0.0, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_inner": null, "n_layer": 12, "n_positions": 1024,
    "reorder_and_upcast_attn": false, "resid_pdrop": 0.0, "scale_attn_by_inverse_layer_idx": false,
    "scale_attn_weights": true, "summary_activation": null, "summary_first_dropout": 0.1,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "use_cache": true, "vocab_size": 50257})");
}

TEST(HfConfigTest, DerivesLlamaSpec) {
  auto spec = ModelSpecFromHfConfig(LlamaConfig().dump(), "config.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->architecture(), weft::v1::LLAMA);
  EXPECT_EQ(spec->num_layers(), 16);
  EXPECT_EQ(spec->hidden_size(), 2048);
  EXPECT_EQ(spec->num_heads(), 32);
  EXPECT_EQ(spec->num_kv_heads(), 8);
  EXPECT_EQ(spec->intermediate_size(), 8192);
  EXPECT_EQ(spec->vocab_size(), 128256);
  EXPECT_EQ(spec->context_length(), 131072);
  EXPECT_EQ(spec->rope_theta(), 500000.0);
  EXPECT_EQ(spec->rms_norm_eps(), 1e-5);
  EXPECT_TRUE(spec->tie_word_embeddings());
  EXPECT_EQ(spec->rope_scaling().kind(), weft::v1::RopeScaling::LLAMA3);
  EXPECT_EQ(spec->rope_scaling().factor(), 32.0);
  EXPECT_EQ(spec->rope_scaling().low_freq_factor(), 1.0);
  EXPECT_EQ(spec->rope_scaling().high_freq_factor(), 4.0);
  EXPECT_EQ(spec->rope_scaling().original_context_length(), 8192);
}

TEST(HfConfigTest, DerivesGpt2SpecAndAppliesTransformersDefaults) {
  auto spec = ModelSpecFromHfConfig(Gpt2Config().dump(), "config.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->architecture(), weft::v1::GPT2);
  EXPECT_EQ(spec->num_layers(), 12);
  EXPECT_EQ(spec->vocab_size(), 50257);
  EXPECT_EQ(spec->context_length(), 1024);
  // Llama keys left out take LlamaConfig's defaults (rms_norm_eps 1e-6, untied, rope 10000).
  auto llama = ModelSpecFromHfConfig(
      R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
          "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 100})",
      "config.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->num_kv_heads(), 4);
  EXPECT_EQ(llama->rms_norm_eps(), 1e-6);
  EXPECT_FALSE(llama->tie_word_embeddings());
  EXPECT_EQ(llama->rope_theta(), 10000.0);
  EXPECT_EQ(llama->context_length(), 2048);
  EXPECT_EQ(llama->rope_scaling().kind(), weft::v1::RopeScaling::NONE);
}

TEST(HfConfigTest, ReadsTheNewerRopeParametersForm) {
  Json c = LlamaConfig();
  c.erase("rope_theta");
  c["rope_parameters"] = c["rope_scaling"];
  c["rope_parameters"]["rope_theta"] = 250000.0;
  c.erase("rope_scaling");
  auto spec = ModelSpecFromHfConfig(c.dump(), "config.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->rope_theta(), 250000.0);
  EXPECT_EQ(spec->rope_scaling().kind(), weft::v1::RopeScaling::LLAMA3);
}

TEST(HfConfigTest, WrittenConfigDescribesTheSpecExactly) {
  for (const weft::v1::ModelSpec& spec : {TinyGpt2(), TinyLlama(false), TinyLlama(true)}) {
    const std::string text = HfConfigJson(spec, model_io::Dtype::kBF16);
    EXPECT_EQ(Json::parse(text)["torch_dtype"], "bfloat16");
    EXPECT_TRUE(CheckHfConfig(text, "config.json", spec).ok()) << text;
    auto back = ModelSpecFromHfConfig(text, "config.json");
    ASSERT_TRUE(back.ok()) << back.status();
    back->set_padded_vocab_size(spec.padded_vocab_size());  // not Hugging Face's to know
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, spec))
        << back->DebugString() << "\nvs\n" << spec.DebugString();
  }
}

struct BadKey {
  bool llama;
  const char* key;
  const char* value;  // JSON
  const char* why;    // part of the message
};

class HfConfigBadKeyTest : public ::testing::TestWithParam<BadKey> {};

TEST_P(HfConfigBadKeyTest, RefusedNamingTheKey) {
  const BadKey b = GetParam();
  const weft::v1::ModelSpec spec = b.llama ? TinyLlama(false) : TinyGpt2();
  Json c = Json::parse(HfConfigJson(spec, model_io::Dtype::kF32));
  c[b.key] = Json::parse(b.value);
  const absl::Status s = CheckHfConfig(c.dump(), "/m/config.json", spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << b.key;
  EXPECT_THAT(s.message(), AllOf(HasSubstr("/m/config.json"),
                                 HasSubstr(std::string("\"") + b.key + "\""), HasSubstr(b.why)));
  EXPECT_FALSE(ModelSpecFromHfConfig(c.dump(), "/m/config.json").ok()) << b.key;
}

INSTANTIATE_TEST_SUITE_P(
    Keys, HfConfigBadKeyTest,
    ::testing::Values(
        BadKey{true, "attention_bias", "true", "no biases"},
        BadKey{true, "mlp_bias", "true", "no biases"},
        BadKey{true, "sliding_window", "4096", "every earlier position"},
        BadKey{true, "rope_scaling", R"({"rope_type": "linear", "factor": 2.0})",
               "rope type \"linear\" is not supported"},
        BadKey{true, "rope_scaling", R"({"type": "dynamic", "factor": 2.0})", "\"dynamic\""},
        BadKey{true, "rope_scaling", R"({"rope_type": "llama3", "factor": 2.0})",
               "needs a number \"low_freq_factor\""},
        BadKey{true, "hidden_act", "\"gelu\"", "silu only"},
        BadKey{true, "pretraining_tp", "2", "only 1"},
        BadKey{true, "attention_dropout", "1.5", "in [0, 1)"},
        BadKey{true, "quantization_config", R"({"quant_method": "gptq"})", "not a key Weft knows"},
        BadKey{true, "hidden_size", "\"16\"", "must be an integer"},
        BadKey{false, "activation_function", "\"relu\"", "gelu_new only"},
        BadKey{false, "scale_attn_by_inverse_layer_idx", "true", "not supported"},
        BadKey{false, "reorder_and_upcast_attn", "true", "not supported"},
        BadKey{false, "n_inner", "32", "4 * n_embd"},
        BadKey{false, "scale_attn_weights", "false", "1/sqrt"},
        BadKey{false, "layer_norm_epsilon", "1e-6", "1e-05"},
        BadKey{false, "tie_word_embeddings", "false", "ties"},
        BadKey{false, "resid_pdrop", "-0.1", "in [0, 1)"},
        BadKey{false, "n_ctx", "4", "must equal n_positions"},
        BadKey{false, "add_cross_attention", "true", "cross-attention"},
        BadKey{false, "some_new_option", "1", "not a key Weft knows"},
        // Weights saved from another model's class under a supported model_type.
        BadKey{true, "architectures", R"(["MistralForCausalLM"])",
               "for model_type \"llama\" Weft implements LlamaForCausalLM"},
        BadKey{true, "architectures", R"(["LlamaForCausalLM", "Qwen2ForCausalLM"])",
               "Weft implements LlamaForCausalLM"},
        BadKey{false, "architectures", R"(["GPT2ForSequenceClassification"])",
               "for model_type \"gpt2\" Weft implements GPT2DoubleHeadsModel or GPT2LMHeadModel"},
        BadKey{false, "architectures", R"("GPT2LMHeadModel")", "Weft implements"}));

TEST(HfConfigTest, HarmlessKeysAndAFullWidthMlpAreAccepted) {
  Json c = Json::parse(HfConfigJson(TinyGpt2(), model_io::Dtype::kF32));
  c["n_inner"] = 64;  // = 4 * n_embd
  c["bos_token_id"] = 1;
  c["_name_or_path"] = "somewhere";
  c["id2label"] = {{"0", "LABEL_0"}};
  EXPECT_TRUE(CheckHfConfig(c.dump(), "config.json", TinyGpt2()).ok());
}

// OpenAI's released GPT-2 configs say dropout 0.1 (and transformers' default is 0.1 when the
// key is absent): dropout regularised their training and is no part of the weights, so they
// import (Weft continues without dropout).
TEST(HfConfigTest, TrainingDropoutOfReleasedModelsIsAccepted) {
  Json c = Json::parse(HfConfigJson(TinyGpt2(), model_io::Dtype::kF32));
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) c[key] = 0.1;
  EXPECT_TRUE(CheckHfConfig(c.dump(), "config.json", TinyGpt2()).ok());
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) c.erase(key);
  EXPECT_TRUE(CheckHfConfig(c.dump(), "config.json", TinyGpt2()).ok());
  Json l = Json::parse(HfConfigJson(TinyLlama(false), model_io::Dtype::kF32));
  l["attention_dropout"] = 0.1;
  EXPECT_TRUE(CheckHfConfig(l.dump(), "config.json", TinyLlama(false)).ok());
}

TEST(HfConfigTest, EveryMismatchingFieldIsNamedWithBothValues) {
  const weft::v1::ModelSpec spec = TinyLlama(false);
  Json c = Json::parse(HfConfigJson(spec, model_io::Dtype::kF32));
  c["num_key_value_heads"] = 4;
  c["intermediate_size"] = 32;
  c["rope_theta"] = 10000.0;
  c["tie_word_embeddings"] = true;
  c["rope_scaling"]["factor"] = 4.0;
  const absl::Status s = CheckHfConfig(c.dump(), "config.json", spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("model.num_kv_heads is 2 but config.json num_key_value_heads is 4"),
                    HasSubstr("model.intermediate_size is 24 but config.json intermediate_size is 32"),
                    HasSubstr("model.rope_theta is 500000 but config.json rope_theta is 10000"),
                    HasSubstr("model.tie_word_embeddings is false but config.json "
                              "tie_word_embeddings is true"),
                    HasSubstr("model.rope_scaling.factor is 8 but config.json "
                              "rope_scaling.factor is 4")));
  c = Json::parse(HfConfigJson(TinyGpt2(), model_io::Dtype::kF32));
  const absl::Status arch = CheckHfConfig(c.dump(), "config.json", spec);
  EXPECT_THAT(arch.message(), HasSubstr("model.architecture is LLAMA but config.json model_type "
                                        "is \"gpt2\""));
}

TEST(HfConfigTest, ContextLengthUpToMaxPositionsForLlamaExactlyNPositionsForGpt2) {
  weft::v1::ModelSpec llama = TinyLlama(false);
  Json c = Json::parse(HfConfigJson(llama, model_io::Dtype::kF32));
  c["max_position_embeddings"] = 4096;
  EXPECT_TRUE(CheckHfConfig(c.dump(), "config.json", llama).ok());
  llama.set_context_length(8192);
  EXPECT_THAT(CheckHfConfig(c.dump(), "config.json", llama).message(),
              HasSubstr("model.context_length is 8192 but config.json max_position_embeddings "
                        "is 4096"));
  const weft::v1::ModelSpec gpt2 = TinyGpt2();
  c = Json::parse(HfConfigJson(gpt2, model_io::Dtype::kF32));
  c["n_positions"] = 16;
  EXPECT_THAT(CheckHfConfig(c.dump(), "config.json", gpt2).message(),
              HasSubstr("model.context_length is 8 but config.json n_positions is 16"));
}

// The Llama family's other members: a spec written out as config.json reads back as itself
// (architecture, head_dim, window), and a config of one family does not pass for another.
weft::v1::ModelSpec TinyFamily(weft::v1::Architecture architecture, int head_dim, int window) {
  weft::v1::ModelSpec spec = TinyLlama(false);
  spec.set_architecture(architecture);
  if (head_dim > 0) spec.set_head_dim(head_dim);
  spec.set_sliding_window(window);
  weft::v1::JobSpec job;
  *job.mutable_model() = spec;
  ApplyJobSpecDefaults(&job);
  return job.model();
}

TEST(HfConfigTest, FamiliesRoundTripThroughConfigJson) {
  for (const weft::v1::ModelSpec& spec :
       {TinyFamily(weft::v1::QWEN2, 0, 0), TinyFamily(weft::v1::QWEN3, 32, 0),
        TinyFamily(weft::v1::MISTRAL, 0, 8), TinyFamily(weft::v1::MISTRAL, 0, 0),
        TinyFamily(weft::v1::LLAMA, 32, 0)}) {
    const std::string text = HfConfigJson(spec, model_io::Dtype::kBF16);
    EXPECT_TRUE(CheckHfConfig(text, "config.json", spec).ok()) << text;
    auto back = ModelSpecFromHfConfig(text, "config.json");
    ASSERT_TRUE(back.ok()) << back.status();
    back->set_padded_vocab_size(spec.padded_vocab_size());
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*back, spec))
        << back->DebugString() << "\nvs\n"
        << spec.DebugString();
  }
  const Json mistral =
      Json::parse(HfConfigJson(TinyFamily(weft::v1::MISTRAL, 0, 0), model_io::Dtype::kF32));
  EXPECT_TRUE(mistral["sliding_window"].is_null());  // transformers' "no window"
  EXPECT_EQ(mistral["architectures"][0], "MistralForCausalLM");
  const Json qwen3 =
      Json::parse(HfConfigJson(TinyFamily(weft::v1::QWEN3, 32, 0), model_io::Dtype::kF32));
  EXPECT_EQ(qwen3["model_type"], "qwen3");
  EXPECT_EQ(qwen3["head_dim"], 32);
}

TEST(HfConfigTest, FamiliesTakeTransformersDefaultsAndRefuseWhatWeftLacks) {
  // Absent keys: MistralConfig's window of 4096 and 8 kv heads, Qwen3Config's head_dim 128.
  auto mistral = ModelSpecFromHfConfig(R"({"model_type": "mistral"})", "c");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->architecture(), weft::v1::MISTRAL);
  EXPECT_EQ(mistral->sliding_window(), 4096);
  EXPECT_EQ(mistral->num_kv_heads(), 8);
  auto qwen3 = ModelSpecFromHfConfig(R"({"model_type": "qwen3", "hidden_size": 1024,
                                        "num_attention_heads": 16})",
                                     "c");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->head_dim(), 128);
  // Qwen2 with its window left off imports whatever sliding_window says.
  EXPECT_TRUE(ModelSpecFromHfConfig(
                  R"({"model_type": "qwen2", "use_sliding_window": false,
                      "sliding_window": 131072, "max_window_layers": 28})",
                  "c")
                  .ok());
  struct Refused {
    const char* config;
    const char* key;
    const char* why;
  };
  for (const Refused& r : {
           Refused{R"({"model_type": "qwen2", "use_sliding_window": true})", "use_sliding_window",
                   "per-layer windows"},
           Refused{R"({"model_type": "qwen3", "num_hidden_layers": 2,
                       "layer_types": ["full_attention", "sliding_attention"]})",
                   "layer_types", "full_attention"},
           Refused{R"({"model_type": "qwen3", "attention_bias": true})", "attention_bias",
                   "no biases"},
           Refused{R"({"model_type": "qwen2", "attention_bias": false})", "attention_bias",
                   "not a key Weft knows"},
           Refused{R"({"model_type": "mistral", "architectures": ["LlamaForCausalLM"]})",
                   "architectures", "MistralForCausalLM"},
           Refused{R"({"model_type": "llama", "architectures": ["Qwen2ForCausalLM"]})",
                   "architectures", "LlamaForCausalLM"},
           Refused{R"({"model_type": "llama", "sliding_window": 4096})", "sliding_window",
                   "model_type \"mistral\""},
           Refused{R"({"model_type": "mistral", "sliding_window": -1})", "sliding_window",
                   "must be >= 0 or null"},
       }) {
    const absl::Status s = ModelSpecFromHfConfig(r.config, "/m/config.json").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << r.config;
    EXPECT_THAT(s.message(), AllOf(HasSubstr(std::string("\"") + r.key + "\""), HasSubstr(r.why)))
        << r.config;
  }
  // A Qwen3 job against a Qwen2 checkpoint, and a Mistral job whose window differs.
  const weft::v1::ModelSpec qwen2_spec = TinyFamily(weft::v1::QWEN2, 0, 0);
  EXPECT_THAT(CheckHfConfig(HfConfigJson(qwen2_spec, model_io::Dtype::kF32), "config.json",
                            TinyFamily(weft::v1::QWEN3, 0, 0))
                  .message(),
              HasSubstr("model.architecture is QWEN3 but config.json model_type is \"qwen2\""));
  EXPECT_THAT(
      CheckHfConfig(HfConfigJson(TinyFamily(weft::v1::MISTRAL, 0, 8), model_io::Dtype::kF32),
                    "config.json", TinyFamily(weft::v1::MISTRAL, 0, 16))
          .message(),
      HasSubstr("model.sliding_window is 16 but config.json sliding_window is 8"));
}

TEST(HfConfigTest, NotJsonOrAnotherModelType) {
  EXPECT_THAT(ModelSpecFromHfConfig("{", "/x/config.json").status().message(),
              AllOf(HasSubstr("/x/config.json"), HasSubstr("not valid JSON")));
  EXPECT_THAT(ModelSpecFromHfConfig("[1]", "/x/config.json").status().message(),
              HasSubstr("not a JSON object"));
  EXPECT_THAT(ModelSpecFromHfConfig(R"({"model_type": "falcon"})", "c").status().message(),
              AllOf(HasSubstr("key \"model_type\" is \"falcon\""),
                    HasSubstr("\"qwen2\", \"qwen3\" and \"mistral\"")));
}

}  // namespace
}  // namespace weft::hf
