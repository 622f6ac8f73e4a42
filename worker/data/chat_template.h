// Chat templates: conversations rendered the way a model family's published Hugging Face chat
// template renders them, and tokenized into the ids and per-token flags of supervised
// fine-tuning data (worker/data/token_flags.h). `trainctl data prepare --chat` writes datasets
// with them; a sampler renders prompts with RenderGenerationPrompt and stops at end_of_turn().
//
// Built in, by name (docs/data.md), each reproducing byte for byte what transformers'
// `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` gives with the
// template that model publishes (tests/fixtures/chat holds those templates and checks it):
//   "llama3"    Meta-Llama-3-8B-Instruct: <|begin_of_text|>, then every message as
//               <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>, its content
//               trimmed; the prompt ends in the assistant's header.
//   "llama3.1"  Meta-Llama-3.1-8B-Instruct without tools: the same, after a system header that
//               always comes first, holding "Cutting Knowledge Date: December 2023", "Today
//               Date: 26 Jul 2024" (the template's default date) and the first message when it
//               is a system message (trimmed); tool calls, tool results and the template's
//               date_string/tools arguments are not supported.
//   "chatml"    Qwen2.5-Instruct: <|im_start|>ROLE\nCONTENT<|im_end|>\n per message, content as
//               it is; with no system message first, Qwen's default one ("You are Qwen,
//               created by Alibaba Cloud. You are a helpful assistant.") is rendered in its
//               place.
//   "mistral"   Mistral-7B-Instruct-v0.3: <s>, then [INST] USER[/INST] and " ASSISTANT</s>"
//               (assistant content trimmed). The roles after an optional first system message
//               must alternate user, assistant, user... (the template raises otherwise), and
//               the system message is put before the LAST message when that is a user message
//               ("[INST] SYSTEM\n\nUSER[/INST]") and dropped otherwise: a training conversation
//               that ends with the assistant's answer renders without its system message.
//               There is no generation prompt: the prompt ends in [/INST].
// "Trimmed" is Python's str.strip(): the Unicode whitespace of str.isspace() at both ends.
// Only the roles system, user and assistant exist; llama3, llama3.1 and chatml take them in
// any order, as their templates do.
//
// Special tokens are spelled in the text (as the Hugging Face templates do), so a tokenizer
// must encode each of the template's special_tokens() as one token: a tokenizer.json that has
// them as added tokens. Text in a message that spells one (a user quoting "<|im_end|>") becomes
// that token too, exactly as with transformers.
#ifndef WEFT_WORKER_DATA_CHAT_TEMPLATE_H_
#define WEFT_WORKER_DATA_CHAT_TEMPLATE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/data/tokenizer.h"

namespace weft::data {

enum class ChatRole { kSystem, kUser, kAssistant };

// "system", "user", "assistant"; ParseChatRole is its inverse (nullopt for any other name).
absl::string_view ChatRoleName(ChatRole role);
std::optional<ChatRole> ParseChatRole(absl::string_view name);

struct ChatMessage {
  ChatRole role = ChatRole::kUser;
  std::string content;  // UTF-8
};

// A piece of a rendered conversation.
struct ChatSegment {
  std::string text;
  // The message this text renders or frames. Text the template adds on its own before the
  // messages (a BOS, Qwen's default system message, Llama 3.1's date header) is kSystem.
  ChatRole role = ChatRole::kSystem;
  // What the model must learn to emit: an assistant message's content and the end-of-turn
  // token after it (<|eot_id|>, <|im_end|>, </s>), nothing of the header before it. Mistral's
  // space before the content is part of it (the model emits it with the first word).
  bool assistant_output = false;
  // The text is exactly one of the template's special tokens.
  bool special = false;
};

struct RenderedChat {
  std::vector<ChatSegment> segments;  // in order; none is empty

  // The segments' text, concatenated: what apply_chat_template returns.
  std::string Text() const;
};

// Which tokens of a conversation are targets (kTokenFlagLoss): "assistant" (the assistant's
// output only, what SFT usually trains) or "all".
enum class LossMask { kAssistant, kAll };
absl::string_view LossMaskName(LossMask mask);
std::optional<LossMask> ParseLossMask(absl::string_view name);

class ChatTemplate {
 public:
  // The built-in template `name`; INVALID_ARGUMENT naming the known ones otherwise.
  static absl::StatusOr<ChatTemplate> Named(absl::string_view name);
  // "chatml", "llama3", "llama3.1", "mistral".
  static std::vector<std::string> Names();

  absl::string_view name() const { return name_; }

  // The conversation for training (add_generation_prompt=False). INVALID_ARGUMENT for no
  // messages, or an order of roles the template refuses (mistral), naming the message's index.
  absl::StatusOr<RenderedChat> Render(absl::Span<const ChatMessage> messages) const;
  // The conversation followed by the assistant's header, for sampling the next message
  // (add_generation_prompt=True); the header's segments have role kAssistant and are not
  // assistant output (mistral has no header: its prompt is Render's). The same errors.
  absl::StatusOr<RenderedChat> RenderGenerationPrompt(absl::Span<const ChatMessage> messages) const;

  // The special token that ends an assistant message: sampling stops at it.
  absl::string_view end_of_turn() const;
  // Every special token the template writes, BOS included.
  absl::Span<const std::string> special_tokens() const;

 private:
  enum class Kind { kLlama3, kLlama31, kChatml, kMistral };
  ChatTemplate(Kind kind, std::string name) : kind_(kind), name_(std::move(name)) {}

  absl::StatusOr<RenderedChat> RenderWith(absl::Span<const ChatMessage> messages,
                                          bool generation_prompt) const;

  Kind kind_;
  std::string name_;
};

// A conversation's tokens and their flags (token_flags.h), one each.
struct TokenizedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> flags;
};

// Tokenizes rendered conversations for one template and tokenizer.
//
// The ids are exactly tokenizer.Encode(rendered.Text()): the whole text at once, never
// segment by segment (byte-level BPE can merge across a segment boundary). The flags:
// kTokenFlagDocStart on the first token; kTokenFlagLoss on every token under LossMask::kAll,
// and under kAssistant on every token that holds at least one byte of assistant output. A
// token that straddles a boundary between a header and an assistant's content (ChatML's
// "assistant\n" before content that starts with a newline can merge into one "\n\n" token)
// is therefore a target: it is the first thing the assistant says, and transformers'
// return_assistant_tokens_mask counts it too. Where a token's bytes cannot be located (a
// normalizer changed the text, or the text spells a special token of no template), the run of
// such tokens between located ones is taken as one, by the same rule.
//
// Immutable after Create: Tokenize may run on any number of threads.
class ChatTokenizer {
 public:
  // Checks that `tokenizer` encodes each of the template's special tokens as one token:
  // FAILED_PRECONDITION naming the token, the template and `tokenizer_name` otherwise.
  // `tokenizer` must outlive the result.
  static absl::StatusOr<ChatTokenizer> Create(const ChatTemplate& chat_template,
                                              const Tokenizer* tokenizer,
                                              absl::string_view tokenizer_name);

  const ChatTemplate& chat_template() const { return template_; }

  // Renders `messages` (ChatTemplate::Render's errors) and tokenizes them.
  absl::StatusOr<TokenizedChat> Tokenize(absl::Span<const ChatMessage> messages,
                                         LossMask mask) const;
  // Tokenizes an already rendered conversation: the tokenizer's errors.
  absl::StatusOr<TokenizedChat> TokenizeRendered(const RenderedChat& rendered, LossMask mask) const;

 private:
  ChatTokenizer(ChatTemplate chat_template, const Tokenizer* tokenizer)
      : template_(std::move(chat_template)), tokenizer_(tokenizer) {}

  // The bytes token `id` stands for: a special token's text, an ordinary token's decoded
  // bytes; empty when unknown (a special token of no template decodes to nothing).
  std::string TokenBytes(int32_t id) const;

  ChatTemplate template_;
  const Tokenizer* tokenizer_;
  absl::flat_hash_map<std::string, int32_t> special_ids_;  // special token text -> id
  absl::flat_hash_map<int32_t, std::string> special_texts_;
};

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_CHAT_TEMPLATE_H_
