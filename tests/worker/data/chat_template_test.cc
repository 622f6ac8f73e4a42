// Chat templates (worker/data/chat_template.h) against transformers: the fixtures in
// tests/fixtures/chat (make_chat_fixtures.py there) hold, for every built-in template and a set
// of conversations (multi-turn, with and without a system message, unicode, whitespace to trim,
// empty messages, a system message late, text that spells special tokens, non-NFC text, role
// orders Mistral refuses), what apply_chat_template renders with the model's published
// template, and the ids and assistant mask of that text under a fixture tokenizer. Weft must
// render the same bytes, give the same ids and flag the same tokens.
#include "worker/data/chat_template.h"

#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/token_flags.h"

namespace weft::data {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::json;

std::string SourcePath(const std::string& relative) {
  return std::string(WEFT_SOURCE_DIR) + "/" + relative;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const Json& Expected() {
  static const Json* const kExpected =
      new Json(Json::parse(ReadAll(SourcePath("tests/fixtures/chat/expected.json"))));
  return *kExpected;
}

std::vector<ChatMessage> Messages(const Json& json) {
  std::vector<ChatMessage> messages;
  for (const Json& m : json) {
    std::optional<ChatRole> role = ParseChatRole(m.at("role").get<std::string>());
    EXPECT_TRUE(role.has_value()) << m;
    messages.push_back(ChatMessage{role.value_or(ChatRole::kUser), m.at("content")});
  }
  return messages;
}

std::unique_ptr<Tokenizer> LoadFixtureTokenizer(const std::string& relative) {
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadBpeTokenizerFile(SourcePath(relative));
  EXPECT_TRUE(tokenizer.ok()) << tokenizer.status();
  return tokenizer.ok() ? *std::move(tokenizer) : nullptr;
}

class ChatFixtureTest : public ::testing::TestWithParam<std::string> {
 protected:
  const Json& fixture() const { return Expected().at("templates").at(GetParam()); }
};

TEST_P(ChatFixtureTest, RendersWhatTransformersRendersByteForByte) {
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Named(GetParam());
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->name(), GetParam());
  EXPECT_EQ(chat->end_of_turn(), fixture().at("end_of_turn").get<std::string>());
  int rendered = 0;
  for (const auto& [name, expected] : fixture().at("cases").items()) {
    SCOPED_TRACE(name);
    const std::vector<ChatMessage> messages = Messages(Expected().at("conversations").at(name));
    absl::StatusOr<RenderedChat> text = chat->Render(messages);
    absl::StatusOr<RenderedChat> prompt = chat->RenderGenerationPrompt(messages);
    if (expected.contains("error")) {
      // The published template raises: Weft refuses the conversation too.
      EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument) << text.status();
      EXPECT_THAT(text.status().message(), HasSubstr("alternate"));
      EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ASSERT_TRUE(text.ok()) << text.status();
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    EXPECT_EQ(text->Text(), expected.at("text").get<std::string>());
    EXPECT_EQ(prompt->Text(), expected.at("generation_prompt").get<std::string>());
    for (const RenderedChat* r : {&*text, &*prompt}) {
      for (const ChatSegment& s : r->segments) {
        EXPECT_FALSE(s.text.empty());
        if (s.special) {
          EXPECT_THAT(chat->special_tokens(), ::testing::Contains(s.text));
        }
        // Only an assistant message's own text is output.
        if (s.assistant_output) {
          EXPECT_EQ(s.role, ChatRole::kAssistant) << s.text;
        }
      }
    }
    ++rendered;
  }
  EXPECT_GE(rendered, 10);
}

TEST_P(ChatFixtureTest, TokenizesToTheIdsAndAssistantMaskOfTransformers) {
  absl::StatusOr<ChatTemplate> chat = ChatTemplate::Named(GetParam());
  ASSERT_TRUE(chat.ok()) << chat.status();
  const std::string tokenizer_file = fixture().at("tokenizer").get<std::string>();
  std::unique_ptr<Tokenizer> tokenizer = LoadFixtureTokenizer(tokenizer_file);
  ASSERT_NE(tokenizer, nullptr);
  absl::StatusOr<ChatTokenizer> encoder =
      ChatTokenizer::Create(*chat, tokenizer.get(), tokenizer_file);
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  for (const auto& [name, expected] : fixture().at("cases").items()) {
    if (expected.contains("error")) continue;
    SCOPED_TRACE(name);
    const std::vector<ChatMessage> messages = Messages(Expected().at("conversations").at(name));
    absl::StatusOr<TokenizedChat> chat_tokens = encoder->Tokenize(messages, LossMask::kAssistant);
    ASSERT_TRUE(chat_tokens.ok()) << chat_tokens.status();
    EXPECT_EQ(chat_tokens->ids, expected.at("ids").get<std::vector<int32_t>>());
    const std::vector<int> mask = expected.at("assistant_mask").get<std::vector<int>>();
    ASSERT_EQ(chat_tokens->flags.size(), mask.size());
    for (size_t i = 0; i < mask.size(); ++i) {
      const uint8_t want = (mask[i] ? kTokenFlagLoss : 0) | (i == 0 ? kTokenFlagDocStart : 0);
      EXPECT_EQ(chat_tokens->flags[i], want)
          << "token " << i << " (id " << chat_tokens->ids[i] << ")";
    }
    absl::StatusOr<TokenizedChat> all = encoder->Tokenize(messages, LossMask::kAll);
    ASSERT_TRUE(all.ok()) << all.status();
    EXPECT_EQ(all->ids, chat_tokens->ids);
    for (size_t i = 0; i < all->flags.size(); ++i) {
      EXPECT_EQ(all->flags[i], kTokenFlagLoss | (i == 0 ? kTokenFlagDocStart : 0));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatFixtureTest,
                         ::testing::Values("llama3", "llama3.1", "chatml", "mistral"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '.' ? '_' : c;
                           return name;
                         });

TEST(ChatTemplateTest, KnownNamesAndTheirErrors) {
  EXPECT_THAT(ChatTemplate::Names(), ElementsAre("chatml", "llama3", "llama3.1", "mistral"));
  for (const std::string& name : ChatTemplate::Names()) {
    EXPECT_TRUE(ChatTemplate::Named(name).ok()) << name;
  }
  absl::StatusOr<ChatTemplate> unknown = ChatTemplate::Named("vicuna");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("unknown chat template \"vicuna\" (known: chatml, llama3, llama3.1, "
                        "mistral)"));
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::Named("chatml");
  ASSERT_TRUE(chatml.ok());
  EXPECT_EQ(chatml->Render({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RolesAndLossMasksByName) {
  for (ChatRole role : {ChatRole::kSystem, ChatRole::kUser, ChatRole::kAssistant}) {
    EXPECT_EQ(ParseChatRole(ChatRoleName(role)), role);
  }
  EXPECT_EQ(ParseChatRole("tool"), std::nullopt);
  EXPECT_EQ(ParseChatRole("User"), std::nullopt);
  EXPECT_EQ(ParseLossMask("assistant"), LossMask::kAssistant);
  EXPECT_EQ(ParseLossMask("all"), LossMask::kAll);
  EXPECT_EQ(ParseLossMask("none"), std::nullopt);
  EXPECT_EQ(LossMaskName(LossMask::kAll), "all");
}

TEST(ChatTemplateTest, MistralNamesTheMessageOutOfTurn) {
  absl::StatusOr<ChatTemplate> mistral = ChatTemplate::Named("mistral");
  ASSERT_TRUE(mistral.ok());
  absl::StatusOr<RenderedChat> r =
      mistral->Render({{ChatRole::kSystem, "s"}, {ChatRole::kUser, "u"}, {ChatRole::kUser, "u2"}});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("messages[2] is a user message"));
}

TEST(ChatTemplateTest, SegmentsTagRolesAndAssistantOutput) {
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::Named("chatml");
  ASSERT_TRUE(chatml.ok());
  absl::StatusOr<RenderedChat> r =
      chatml->Render({{ChatRole::kUser, "hi"}, {ChatRole::kAssistant, "hello"}});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> output;
  for (const ChatSegment& s : r->segments) {
    if (s.assistant_output) output.push_back(s.text);
  }
  // The content and the end-of-turn token; not the header, not the newline after.
  EXPECT_THAT(output, ElementsAre("hello", "<|im_end|>"));
  EXPECT_EQ(r->segments.front().role, ChatRole::kSystem);  // Qwen's default system message
  EXPECT_EQ(r->segments.front().text, "<|im_start|>");
  EXPECT_TRUE(r->segments.front().special);
}

// The fixture tokenizer for chatml has a "\n\n" token, so an assistant message starting with a
// newline shares a token with the header's newline. Tokenizing segment by segment would not
// give the whole text's ids; the fixture's mask (transformers') makes that token a target.
TEST(ChatTokenizerTest, ATokenAcrossHeaderAndContentIsATarget) {
  std::unique_ptr<Tokenizer> tokenizer =
      LoadFixtureTokenizer("tests/fixtures/chat/chatml.tokenizer.json");
  ASSERT_NE(tokenizer, nullptr);
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::Named("chatml");
  ASSERT_TRUE(chatml.ok());
  absl::StatusOr<RenderedChat> r =
      chatml->Render({{ChatRole::kUser, "q"}, {ChatRole::kAssistant, "\nanswer"}});
  ASSERT_TRUE(r.ok());
  std::vector<int32_t> by_segment;
  for (const ChatSegment& s : r->segments) {
    ASSERT_TRUE(tokenizer->EncodeTo(s.text, &by_segment).ok());
  }
  absl::StatusOr<std::vector<int32_t>> whole = tokenizer->Encode(r->Text());
  ASSERT_TRUE(whole.ok());
  EXPECT_NE(by_segment, *whole);

  absl::StatusOr<ChatTokenizer> encoder =
      ChatTokenizer::Create(*chatml, tokenizer.get(), "chatml.tokenizer.json");
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  absl::StatusOr<TokenizedChat> t = encoder->TokenizeRendered(*r, LossMask::kAssistant);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->ids, *whole);
  // "...<|im_start|>assistant", then "\n\n" (header and content), "answer", <|im_end|>, "\n".
  const size_t n = t->ids.size();
  size_t straddler = n;
  for (size_t i = 0; i < n; ++i) {
    if (tokenizer->Decode({t->ids[i]}) == "\n\n") straddler = i;
  }
  ASSERT_LT(straddler, n - 2);
  ASSERT_GT(straddler, 0u);
  EXPECT_EQ(t->flags[straddler - 1], 0) << "the header before it";
  for (size_t i = straddler; i + 1 < n; ++i) {
    EXPECT_EQ(t->flags[i], kTokenFlagLoss) << "token " << i << " of " << n;
  }
  EXPECT_EQ(t->flags[n - 1], 0) << "the template's newline after <|im_end|>";
}

// An added token across a special token's edge ("<|im_end|>\n" as one token) makes the pieces
// between special tokens tokenize differently from the whole text: the ids are still the
// whole text's, and that token, half assistant output, is a target.
TEST(ChatTokenizerTest, AnAddedTokenAcrossASpecialTokenEdge) {
  Json spec = Json::parse(ReadAll(SourcePath("tests/fixtures/chat/chatml.tokenizer.json")));
  int max_id = 0;
  for (const auto& [text, id] : spec["model"]["vocab"].items()) {
    max_id = std::max(max_id, id.get<int>());
  }
  for (const Json& a : spec["added_tokens"]) max_id = std::max(max_id, a["id"].get<int>());
  const int joined = max_id + 1;
  spec["added_tokens"].push_back({{"id", joined},
                                  {"content", "<|im_end|>\n"},
                                  {"single_word", false},
                                  {"lstrip", false},
                                  {"rstrip", false},
                                  {"normalized", false},
                                  {"special", false}});
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer =
      LoadBpeTokenizerJson(spec.dump(), "joined.tokenizer.json");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::Named("chatml");
  ASSERT_TRUE(chatml.ok());
  absl::StatusOr<ChatTokenizer> encoder =
      ChatTokenizer::Create(*chatml, tokenizer->get(), "joined.tokenizer.json");
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  absl::StatusOr<RenderedChat> r = chatml->Render(
      {{ChatRole::kUser, "Caf\u00e9?"}, {ChatRole::kAssistant, "Oui, un caf\u00e9."}});
  ASSERT_TRUE(r.ok());
  absl::StatusOr<TokenizedChat> t = encoder->TokenizeRendered(*r, LossMask::kAssistant);
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<std::vector<int32_t>> whole = (*tokenizer)->Encode(r->Text());
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(t->ids, *whole);
  ASSERT_EQ(t->ids.back(), joined);
  EXPECT_EQ(t->flags.back(), kTokenFlagLoss);
  // The system and user turns end with the same token, and it is no target there.
  int joined_seen = 0;
  for (size_t i = 0; i + 1 < t->ids.size(); ++i) {
    if (t->ids[i] != joined) continue;
    ++joined_seen;
    EXPECT_EQ(t->flags[i] & kTokenFlagLoss, 0) << "token " << i;
  }
  EXPECT_EQ(joined_seen, 2);
  EXPECT_EQ(t->flags[0], kTokenFlagDocStart);
  // "Oui" follows the assistant header's newline: a target; the header is not.
  int targets = 0;
  for (uint8_t f : t->flags) targets += (f & kTokenFlagLoss) ? 1 : 0;
  absl::StatusOr<std::vector<int32_t>> content = (*tokenizer)->Encode("Oui, un caf\u00e9.");
  ASSERT_TRUE(content.ok());
  EXPECT_EQ(targets, static_cast<int>(content->size()) + 1);
}

TEST(ChatTokenizerTest, ATokenizerWithoutTheTemplatesSpecialTokens) {
  std::unique_ptr<Tokenizer> gpt2 =
      LoadFixtureTokenizer("tests/fixtures/tokenizers/gpt2.tokenizer.json");
  ASSERT_NE(gpt2, nullptr);
  absl::StatusOr<ChatTemplate> chatml = ChatTemplate::Named("chatml");
  ASSERT_TRUE(chatml.ok());
  absl::StatusOr<ChatTokenizer> encoder =
      ChatTokenizer::Create(*chatml, gpt2.get(), "/data/gpt2/tokenizer.json");
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(encoder.status().message(),
              HasSubstr("/data/gpt2/tokenizer.json: no token \"<|im_start|>\", which chat "
                        "template chatml needs (it encodes as"));

  std::unique_ptr<Tokenizer> bytes = MakeByteTokenizer();
  absl::StatusOr<ChatTemplate> llama3 = ChatTemplate::Named("llama3");
  ASSERT_TRUE(llama3.ok());
  encoder = ChatTokenizer::Create(*llama3, bytes.get(), "bytes");
  EXPECT_EQ(encoder.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(encoder.status().message(), HasSubstr("no token \"<|begin_of_text|>\""));
  EXPECT_THAT(encoder.status().message(), HasSubstr("a bytes tokenizer cannot spell special"));
}

}  // namespace
}  // namespace weft::data
