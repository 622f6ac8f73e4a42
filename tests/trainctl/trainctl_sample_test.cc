// `trainctl sample --chat` through the binary, on model files made here (no daemon): a model
// whose next token is scripted (tests/worker/model_io/scripted_model.h) answers "ab" and ends
// its turn after the chat prompt, so what trainctl prints shows where it stopped and what of the
// generation it kept. The template comes from the model file or --template; the conversation
// from PROMPT, --system and --messages; every refusal names its cause.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"
#include "tests/worker/model_io/scripted_model.h"
#include "worker/data/chat_template.h"
#include "worker/data/tokenizer.h"
#include "worker/model_io/chat_sample.h"
#include "worker/model_io/model_file.h"

namespace weft {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::CommandResult;

CommandResult Trainctl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::BinDir() + "/trainctl",
                                   // No coordinator is running: a model file needs none.
                                   "--coordinator=127.0.0.1:1"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::RunCommand(argv);
}

class TrainctlSampleChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path =
        std::string(WEFT_SOURCE_DIR) + "/tests/fixtures/chat/chatml.tokenizer.json";
    auto tok = data::LoadTokenizerFile(path);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = std::move(*tok);
    a_ = tok_->Encode("a")->at(0);
    b_ = tok_->Encode("b")->at(0);
    end_ = tok_->Encode("<|im_end|>")->at(0);
    // Every chatml generation prompt ends in the assistant's header, whatever the messages.
    auto prompt = model_io::BuildChatPrompt(*data::ChatTemplate::Named("chatml"), *tok_, "tok",
                                            {{data::ChatRole::kUser, "x"}});
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    from_ = prompt->ids.back();
    ASSERT_NE(from_, a_);
    ASSERT_NE(from_, b_);
  }

  // A model file answering "ab" then <|im_end|>, recording `chat_template` ("": none).
  std::string ModelFile(const std::string& chat_template) {
    const testing::ScriptedModel m = testing::MakeScriptedModel(
        tok_->vocab_size(), 256, {{from_, a_}, {a_, b_}, {b_, end_}});
    const std::string path = dir_.File(absl::StrCat("model-", chat_template, ".safetensors"));
    EXPECT_TRUE(model_io::SaveModel(path, m.spec, m.units, tok_.get(), chat_template).ok());
    return path;
  }

  // The number of ids of `messages`' chatml generation prompt.
  size_t PromptTokens(const std::vector<data::ChatMessage>& messages) {
    auto prompt = model_io::BuildChatPrompt(*data::ChatTemplate::Named("chatml"), *tok_, "tok",
                                            messages);
    EXPECT_TRUE(prompt.ok()) << prompt.status();
    return prompt.ok() ? prompt->ids.size() : 0;
  }

  testing::TempDir dir_;
  std::shared_ptr<const data::Tokenizer> tok_;
  int32_t a_ = -1, b_ = -1, end_ = -1, from_ = -1;
};

TEST_F(TrainctlSampleChatTest, PrintsOnlyTheRepliesTextWithTheRecordedTemplate) {
  const std::string model = ModelFile("chatml");
  CommandResult r = Trainctl({"sample", "job-1", "--model", model, "--chat", "--system",
                              "Be brief.", "What", "is", "up?"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "ab\n");  // no prompt, no end-of-turn token
  EXPECT_EQ(r.err, "");

  r = Trainctl({"-o", "json", "sample", "job-1", "--model", model, "--chat", "--system",
                "Be brief.", "--prompt", "What is up?", "--temperature", "0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(json.is_object()) << r.out;
  EXPECT_EQ(json.value("job_id", ""), "job-1");
  EXPECT_EQ(json.value("model_path", ""), model);
  EXPECT_EQ(json.value("tokenizer", ""), "tokenizer.json");
  EXPECT_EQ(json.value("template", ""), "chatml");
  EXPECT_EQ(json["messages"], nlohmann::json::parse(R"([
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is up?"}])"));
  EXPECT_EQ(json.value("prompt_tokens", 0u),
            PromptTokens({{data::ChatRole::kSystem, "Be brief."},
                          {data::ChatRole::kUser, "What is up?"}}));
  EXPECT_EQ(json.value("text", ""), "ab");
  EXPECT_EQ(json.value("tokens", 0), 2);
  EXPECT_EQ(json.value("stop", ""), "end_of_turn");

  // Out of budget before the end of the turn.
  r = Trainctl({"-o", "json", "sample", "job-1", "--model", model, "--chat", "--tokens", "1",
                "hi"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("\"text\": \"a\""), HasSubstr("\"stop\": \"max_tokens\"")));
}

TEST_F(TrainctlSampleChatTest, MessagesFileHoldsTheConversation) {
  const std::string model = ModelFile("chatml");
  const std::string file = dir_.File("conversation.json");
  std::ofstream(file) << R"([
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime."},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "Another?"}
  ])";
  CommandResult r = Trainctl({"-o", "json", "sample", "j", "--model", model, "--chat",
                              "--messages", file});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json json = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(json.is_object()) << r.out;
  EXPECT_EQ(json["messages"].size(), 4u) << r.out;
  EXPECT_EQ(json.value("prompt_tokens", 0u),
            PromptTokens({{data::ChatRole::kSystem, "You are terse."},
                          {data::ChatRole::kUser, "Name a prime."},
                          {data::ChatRole::kAssistant, "7"},
                          {data::ChatRole::kUser, "Another?"}}));
  EXPECT_EQ(json.value("text", ""), "ab");

  // A chat data line's object, with PROMPT as the next user message.
  std::ofstream(file) << R"({"messages": [{"role": "user", "content": "hi"},
                                          {"role": "assistant", "content": "hello"}]})";
  r = Trainctl({"-o", "json", "sample", "j", "--model", model, "--chat", "--messages", file,
                "and", "now?"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  json = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(json.is_object()) << r.out;
  EXPECT_EQ(json["messages"].back(),
            nlohmann::json::parse(R"({"role": "user", "content": "and now?"})"));

  // Without PROMPT it must end with the user's turn.
  r = Trainctl({"sample", "j", "--model", model, "--chat", "--messages", file});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("must end with a user message"));

  const struct {
    std::string text, says;
  } bad[] = {
      {R"([{"role": "robot", "content": "x"}])", "[0].role: \"robot\" is not a role"},
      {R"([{"role": "user"}])", "[0].content: missing"},
      {R"([{"role": "user", "content": "x", "name": "bob"}])", "[0].name: unknown field"},
      {R"({"messages": [{"role": "user", "content": 7}]})", "messages[0].content: a number"},
      {R"([])", "no message"},
      {R"("hi")", "a string, not an array"},
      {"[{", "not JSON"},
  };
  for (const auto& c : bad) {
    std::ofstream(file) << c.text;
    r = Trainctl({"sample", "j", "--model", model, "--chat", "--messages", file});
    EXPECT_EQ(r.exit_code, 1) << c.text;
    EXPECT_THAT(r.err, AllOf(HasSubstr("--messages: " + file), HasSubstr(c.says))) << c.text;
  }
  r = Trainctl({"sample", "j", "--model", model, "--chat", "--messages", dir_.File("none.json")});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("none.json: no such file"));
}

TEST_F(TrainctlSampleChatTest, TemplateFlagAndItsErrors) {
  // Text data recorded no template: --template is needed, and then it works.
  const std::string untagged = ModelFile("");
  CommandResult r = Trainctl({"sample", "j", "--model", untagged, "--chat", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr("records no chat template"), HasSubstr("pass --template")));
  r = Trainctl({"sample", "j", "--model", untagged, "--chat", "--template", "chatml", "hi"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "ab\n");

  const std::string model = ModelFile("chatml");
  r = Trainctl({"sample", "j", "--model", model, "--chat", "--template", "vicuna", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("--template: unknown chat template \"vicuna\""));

  // The chatml tokenizer has none of mistral's special tokens: the first is named, with the
  // model file whose tokenizer it is; the template it was trained on is pointed out.
  r = Trainctl({"sample", "j", "--model", model, "--chat", "--template", "mistral", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr(model + "'s tokenizer: no token \"<s>\""),
                           HasSubstr("chat template mistral"),
                           HasSubstr("was trained on chat template chatml")));

  r = Trainctl({"sample", "j", "--model", model, "--chat"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("no message to answer"));

  // The chat flags need --chat; --messages carries its own system message.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--template", "chatml"}, {"--system", "s"},
        {"--chat", "--messages", "f.json", "--system", "s"}, {"--prompt", "a", "b"}}) {
    std::vector<std::string> argv = {"sample", "j", "--model", model};
    argv.insert(argv.end(), args.begin(), args.end());
    r = Trainctl(argv);
    EXPECT_NE(r.exit_code, 0) << args[0];
    EXPECT_EQ(r.out, "") << args[0];
  }
}

// Without --chat the positional PROMPT is --prompt: the model continues the text.
TEST_F(TrainctlSampleChatTest, PlainSampleTakesThePromptAsWords) {
  const std::string model = ModelFile("chatml");
  CommandResult r = Trainctl({"-o", "json", "sample", "j", "--model", model, "--tokens", "3",
                              "once", "upon"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(json.is_object()) << r.out;
  EXPECT_EQ(json.value("prompt", ""), "once upon");
}

}  // namespace
}  // namespace weft
