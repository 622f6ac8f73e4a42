// Chatting with a model file (worker/model_io/chat_sample.h), and the chat template the file
// records: the template is chosen from the flag or the file, with clear errors for neither or
// an unknown one; the prompt fed to the model is exactly the tokenizer's ids of the template's
// generation prompt; generation stops at the end-of-turn token (or EOS, or the budget) and the
// reply holds neither; a tokenizer without the template's special tokens is named.
#include "worker/model_io/chat_sample.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"
#include "tests/worker/model_io/scripted_model.h"
#include "worker/data/chat_template.h"
#include "worker/data/manifest.h"
#include "worker/data/tokenizer.h"
#include "worker/model_io/model_file.h"
#include "worker/model_io/safetensors.h"

namespace weft::model_io {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kSource[] = WEFT_SOURCE_DIR;

// A fixture tokenizer.json of tests/fixtures; `eos_id` as a tokenizer_config.json would say.
std::shared_ptr<const data::Tokenizer> FixtureTokenizer(const std::string& relative,
                                                        int eos_id = -1) {
  const std::string path = std::string(kSource) + "/tests/fixtures/" + relative;
  auto tok = data::LoadTokenizerFromBytes("tokenizer.json", weft::testing::ReadFile(path), path,
                                          /*bos_id=*/-1, eos_id);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::shared_ptr<const data::Tokenizer>(std::move(*tok)) : nullptr;
}

std::shared_ptr<const data::Tokenizer> Chatml(int eos_id = -1) {
  return FixtureTokenizer("chat/chatml.tokenizer.json", eos_id);
}

data::ChatTemplate Template(const std::string& name) { return *data::ChatTemplate::Named(name); }

// The one id `text` encodes as.
int32_t IdOf(const data::Tokenizer& tok, const std::string& text) {
  std::vector<int32_t> ids = *tok.Encode(text);
  EXPECT_EQ(ids.size(), 1u) << text;
  return ids.at(0);
}

const std::vector<data::ChatMessage> kQuestion = {{data::ChatRole::kSystem, "Be brief."},
                                                  {data::ChatRole::kUser, "What is up?"}};

class ChatSampleTest : public ::testing::Test {
 protected:
  // A scripted model (tests/worker/model_io/scripted_model.h) saved with `tok` and
  // `chat_template`, loaded back.
  LoadedModel Scripted(std::shared_ptr<const data::Tokenizer> tok,
                       const std::vector<std::pair<int32_t, int32_t>>& next,
                       const std::string& chat_template = "chatml", int context = 256) {
    const weft::testing::ScriptedModel m =
        weft::testing::MakeScriptedModel(tok->vocab_size(), context, next);
    const std::string path = dir_.File("scripted.safetensors");
    EXPECT_TRUE(SaveModel(path, m.spec, m.units, tok.get(), chat_template).ok());
    auto loaded = LoadModel(path);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    return *std::move(loaded);
  }

  // The last id of the generation prompt of kQuestion under `chat_template`: what the model
  // answers from.
  int32_t PromptEnd(const data::Tokenizer& tok, const std::string& chat_template) {
    auto prompt = BuildChatPrompt(Template(chat_template), tok, "tok", kQuestion);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    return prompt->ids.back();
  }

  weft::testing::TempDir dir_;
};

TEST_F(ChatSampleTest, ModelFileRecordsTheChatTemplate) {
  const auto tok = Chatml();
  const weft::testing::ScriptedModel m = weft::testing::MakeScriptedModel(tok->vocab_size(), 8, {});
  const std::string chat = dir_.File("chat.safetensors");
  ASSERT_TRUE(SaveModel(chat, m.spec, m.units, tok.get(), "chatml").ok());
  auto file = ReadSafetensors(chat);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata.at("weft.chat.template"), "chatml");
  EXPECT_EQ(LoadModel(chat)->chat_template, "chatml");

  // Text data records none.
  const std::string text = dir_.File("text.safetensors");
  ASSERT_TRUE(SaveModel(text, m.spec, m.units, tok.get()).ok());
  EXPECT_EQ(ReadSafetensors(text)->metadata.count("weft.chat.template"), 0u);
  EXPECT_EQ(LoadModel(text)->chat_template, "");

  // A name this build does not know still loads: plain sampling must not depend on it.
  auto edited = *file;
  edited.metadata["weft.chat.template"] = "vicuna";
  const std::string unknown = dir_.File("unknown.safetensors");
  ASSERT_TRUE(WriteSafetensors(unknown, edited.tensors, edited.metadata).ok());
  auto loaded = LoadModel(unknown);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->chat_template, "vicuna");

  auto metadata = ModelFileMetadata(tok.get(), tok->vocab_size(), "llama3");
  ASSERT_TRUE(metadata.ok()) << metadata.status();
  EXPECT_EQ(metadata->at("weft.chat.template"), "llama3");
  EXPECT_EQ(metadata->at("weft.tokenizer.kind"), "tokenizer.json");
}

// The worker records what the job's manifest says: its chat.template, nothing for text data
// or without a manifest.
TEST_F(ChatSampleTest, JobChatTemplateComesFromTheManifest) {
  data::DatasetManifest m;
  m.token_format = weft::v1::DATA_FORMAT_UINT16_BIN;
  m.tokenizer = {"bytes", "", 0, 256, -1, -1};
  m.document_separator = "none";
  m.train = {{"train-00000.bin", 4, 1024 + 8, 1, "train-00000.flags", 1024 + 4, 2}};
  m.train_documents = 1;
  m.chat_template = "mistral";
  m.loss_mask = "assistant";
  ASSERT_TRUE(data::WriteManifest(m, dir_.path()).ok());
  weft::v1::JobSpec spec;
  spec.mutable_data()->set_manifest_path(dir_.File(data::kManifestFileName));
  EXPECT_EQ(LoadJobChatTemplate(spec).value(), "mistral");

  m.chat_template.clear();
  m.loss_mask.clear();
  for (data::ManifestShard& s : m.train) s.flags_file.clear();
  const absl::Status written = data::WriteManifest(m, dir_.path());
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_EQ(LoadJobChatTemplate(spec).value(), "");

  EXPECT_EQ(LoadJobChatTemplate(weft::v1::JobSpec()).value(), "");
  spec.mutable_data()->set_manifest_path(dir_.File("nothing/manifest.json"));
  EXPECT_THAT(LoadJobChatTemplate(spec).status().message(), HasSubstr("data.manifest_path"));
}

TEST_F(ChatSampleTest, TemplateComesFromTheFlagElseTheModel) {
  LoadedModel model;
  model.chat_template = "chatml";
  EXPECT_EQ(ChooseChatTemplate("", model)->name(), "chatml");
  EXPECT_EQ(ChooseChatTemplate("llama3.1", model)->name(), "llama3.1");

  auto unknown = ChooseChatTemplate("vicuna", model);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(),
              AllOf(HasSubstr("--template"), HasSubstr("unknown chat template \"vicuna\""),
                    HasSubstr("chatml, llama3, llama3.1, mistral")));

  model.chat_template = "";
  auto none = ChooseChatTemplate("", model);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(none.status().message(),
              AllOf(HasSubstr("records no chat template"), HasSubstr("pass --template")));

  model.chat_template = "vicuna";
  EXPECT_THAT(ChooseChatTemplate("", model).status().message(),
              AllOf(HasSubstr("records chat template \"vicuna\""), HasSubstr("pass --template")));
  EXPECT_EQ(ChooseChatTemplate("mistral", model)->name(), "mistral");
}

// The prompt is the template's generation prompt, tokenized whole: the text transformers'
// apply_chat_template(add_generation_prompt=True) gives, and the ids of that text.
TEST_F(ChatSampleTest, PromptIsTheTokenizedGenerationPrompt) {
  const auto chatml = Chatml(/*eos_id=*/0);
  auto prompt = BuildChatPrompt(Template("chatml"), *chatml, "chatml.tokenizer.json", kQuestion);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  const std::string expected =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is up?<|im_end|>\n"
      "<|im_start|>assistant\n";
  EXPECT_EQ(prompt->text, expected);
  EXPECT_EQ(prompt->ids, chatml->Encode(expected).value());
  auto chat = data::ChatTokenizer::Create(Template("chatml"), chatml.get(), "chatml");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(prompt->ids,
            chat->TokenizeRendered(*Template("chatml").RenderGenerationPrompt(kQuestion),
                                   data::LossMask::kAll)
                ->ids);
  EXPECT_EQ(prompt->end_of_turn_id, IdOf(*chatml, "<|im_end|>"));
  EXPECT_THAT(prompt->stop_ids, ElementsAre(IdOf(*chatml, "<|im_end|>"), 0));

  // Mistral: the system message goes before the last user message, no header after [/INST];
  // its end of turn is its EOS, stopped at once.
  const auto mistral = FixtureTokenizer("chat/mistral.tokenizer.json", /*eos_id=*/1201);
  prompt = BuildChatPrompt(Template("mistral"), *mistral, "mistral.tokenizer.json", kQuestion);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text, "<s>[INST] Be brief.\n\nWhat is up?[/INST]");
  EXPECT_EQ(prompt->ids, mistral->Encode(prompt->text).value());
  EXPECT_THAT(prompt->stop_ids, ElementsAre(1201));

  // A multi-turn conversation with llama3.
  const auto llama3 = FixtureTokenizer("tokenizers/llama3.tokenizer.json");
  const std::vector<data::ChatMessage> turns = {{data::ChatRole::kUser, "hi"},
                                                {data::ChatRole::kAssistant, "Hello!"},
                                                {data::ChatRole::kUser, "2+2?"}};
  prompt = BuildChatPrompt(Template("llama3"), *llama3, "llama3", turns);
  ASSERT_TRUE(prompt.ok()) << prompt.status();
  EXPECT_EQ(prompt->text,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(prompt->ids, llama3->Encode(prompt->text).value());
  EXPECT_THAT(prompt->stop_ids, ElementsAre(IdOf(*llama3, "<|eot_id|>")));
}

TEST_F(ChatSampleTest, PromptErrorsNameTheCause) {
  // The chatml tokenizer has no [INST]: named, with the template and the tokenizer.
  auto missing = BuildChatPrompt(Template("mistral"), *Chatml(), "model.safetensors's tokenizer",
                                 kQuestion);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("model.safetensors's tokenizer"), HasSubstr("chat template mistral"),
                    HasSubstr("no token \"<s>\"")));
  auto bytes = BuildChatPrompt(Template("chatml"), *data::MakeByteTokenizer(), "bytes", kQuestion);
  EXPECT_THAT(bytes.status().message(), HasSubstr("no token \"<|im_start|>\""));

  auto answered = BuildChatPrompt(
      Template("chatml"), *Chatml(),
      "tok", {{data::ChatRole::kUser, "hi"}, {data::ChatRole::kAssistant, "hello"}});
  EXPECT_EQ(answered.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(answered.status().message(),
              AllOf(HasSubstr("must end with a user message"), HasSubstr("its last is assistant")));
  EXPECT_THAT(BuildChatPrompt(Template("chatml"), *Chatml(), "tok", {}).status().message(),
              HasSubstr("it has none"));
  // Mistral refuses a conversation whose roles do not alternate.
  auto twice = BuildChatPrompt(
      Template("mistral"), *FixtureTokenizer("chat/mistral.tokenizer.json"), "tok",
      {{data::ChatRole::kUser, "a"}, {data::ChatRole::kUser, "b"}});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
}

// The model answers "ab" and ends its turn: the reply is those two tokens, without the
// end-of-turn token, with any sampling settings that follow the model.
TEST_F(ChatSampleTest, ReplyStopsAtTheEndOfTurn) {
  const auto tok = Chatml();
  const int32_t a = IdOf(*tok, "a"), b = IdOf(*tok, "b"), end = IdOf(*tok, "<|im_end|>");
  const int32_t from = PromptEnd(*tok, "chatml");
  ASSERT_NE(from, a);
  ASSERT_NE(from, b);
  const LoadedModel model = Scripted(tok, {{from, a}, {a, b}, {b, end}});
  for (float temperature : {0.0f, 0.8f}) {
    SampleOptions options;
    options.temperature = temperature;
    options.tokens = 20;
    auto reply = GenerateChatReply(model, Template("chatml"), kQuestion, options, "m");
    ASSERT_TRUE(reply.ok()) << reply.status();
    EXPECT_THAT(reply->ids, ElementsAre(a, b)) << temperature;
    EXPECT_EQ(reply->text, "ab");
    EXPECT_EQ(reply->stop, ChatStop::kEndOfTurn);
    EXPECT_EQ(reply->prompt_tokens,
              static_cast<int>(tok->Encode(Template("chatml")
                                               .RenderGenerationPrompt(kQuestion)
                                               ->Text())
                                   ->size()));
  }

  // The budget runs out first.
  SampleOptions two;
  two.tokens = 2;
  auto cut = GenerateChatReply(model, Template("chatml"), kQuestion, two, "m");
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_THAT(cut->ids, ElementsAre(a, b));
  EXPECT_EQ(cut->stop, ChatStop::kMaxTokens);

  // The end of turn right away: an empty reply.
  const LoadedModel silent = Scripted(tok, {{from, end}});
  auto empty = GenerateChatReply(silent, Template("chatml"), kQuestion, SampleOptions(), "m");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->ids.empty());
  EXPECT_EQ(empty->text, "");
  EXPECT_EQ(empty->stop, ChatStop::kEndOfTurn);
}

TEST_F(ChatSampleTest, ReplyStopsAtEosAndKeepsGoingWithoutAStop) {
  const auto tok = Chatml(/*eos_id=*/0);
  const int32_t a = IdOf(*tok, "a");
  const int32_t from = PromptEnd(*tok, "chatml");
  auto eos = GenerateChatReply(Scripted(tok, {{from, a}, {a, 0}}), Template("chatml"), kQuestion,
                               SampleOptions(), "m");
  ASSERT_TRUE(eos.ok()) << eos.status();
  EXPECT_THAT(eos->ids, ElementsAre(a));
  EXPECT_EQ(eos->stop, ChatStop::kEos);

  SampleOptions options;
  options.tokens = 5;
  auto looping = GenerateChatReply(Scripted(tok, {{from, a}, {a, a}}), Template("chatml"),
                                   kQuestion, options, "m");
  ASSERT_TRUE(looping.ok()) << looping.status();
  EXPECT_EQ(looping->text, "aaaaa");
  EXPECT_EQ(looping->stop, ChatStop::kMaxTokens);
}

// Mistral's answer starts with the template's space after [/INST], which is not the message's.
TEST_F(ChatSampleTest, MistralReplyLosesTheTemplatesSpace) {
  const auto tok = FixtureTokenizer("chat/mistral.tokenizer.json", /*eos_id=*/1201);
  const std::vector<int32_t> ok = *tok->Encode(" ok");
  ASSERT_FALSE(ok.empty());
  ASSERT_EQ(tok->Decode({ok[0]}).front(), ' ');
  const int32_t from = PromptEnd(*tok, "mistral");
  auto reply = GenerateChatReply(Scripted(tok, {{from, ok[0]}, {ok[0], 1201}}, "mistral"),
                                 Template("mistral"), kQuestion, SampleOptions(), "m");
  ASSERT_TRUE(reply.ok()) << reply.status();
  EXPECT_EQ(reply->text, tok->Decode({ok[0]}).substr(1));
  EXPECT_EQ(reply->stop, ChatStop::kEndOfTurn);
}

TEST_F(ChatSampleTest, ReplyErrors) {
  const auto tok = Chatml();
  LoadedModel none = Scripted(tok, {});
  none.tokenizer = nullptr;
  auto no_tokenizer = GenerateChatReply(none, Template("chatml"), kQuestion, SampleOptions(),
                                        "/m/model.safetensors");
  EXPECT_EQ(no_tokenizer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_tokenizer.status().message(),
              AllOf(HasSubstr("/m/model.safetensors records no tokenizer"), HasSubstr("chatml")));

  // The tokenizer of the model file is named in a missing special token's error.
  auto missing = GenerateChatReply(Scripted(tok, {}), Template("llama3"), kQuestion,
                                   SampleOptions(), "/m/model.safetensors");
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("/m/model.safetensors's tokenizer"),
                    HasSubstr("no token \"<|begin_of_text|>\"")));

  auto too_long = GenerateChatReply(Scripted(tok, {}, "chatml", /*context=*/8),
                                    Template("chatml"), kQuestion, SampleOptions(), "m");
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(too_long.status().message(), HasSubstr("longer than the model's context of 8"));

  SampleOptions bad;
  bad.top_k = -1;
  EXPECT_EQ(
      GenerateChatReply(Scripted(tok, {}), Template("chatml"), kQuestion, bad, "m").status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace weft::model_io
