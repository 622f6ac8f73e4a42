// Chat with a trained model: `trainctl sample --chat`. A conversation is rendered by a chat
// template (worker/data/chat_template.h) up to the assistant's header, tokenized whole by the
// model's tokenizer exactly as `trainctl data prepare --chat` tokenizes training conversations,
// and continued until the template's end-of-turn token, the tokenizer's EOS or the token
// budget. The reply is the assistant's message alone: the prompt and the end-of-turn token are
// not part of it.
//
// The template is the one the model file records (weft.chat.template, worker/model_io/
// model_file.h) unless the caller names another; a model trained on text records none.
#ifndef WEFT_WORKER_MODEL_IO_CHAT_SAMPLE_H_
#define WEFT_WORKER_MODEL_IO_CHAT_SAMPLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/data/chat_template.h"
#include "worker/data/tokenizer.h"
#include "worker/model_io/model_file.h"

namespace weft::model_io {

// The template to chat with: `requested` (a --template flag) when not empty, else the one
// `model` records. INVALID_ARGUMENT for an unknown requested name (naming the known ones), a
// recorded name this build does not know, or neither (saying to pass --template).
absl::StatusOr<data::ChatTemplate> ChooseChatTemplate(absl::string_view requested,
                                                      const LoadedModel& model);

// A conversation ready to continue: the rendered generation prompt, its ids, and the ids that
// end the assistant's turn.
struct ChatPrompt {
  std::string text;  // RenderGenerationPrompt(messages).Text()
  std::vector<int32_t> ids;
  int32_t end_of_turn_id = -1;
  std::vector<int32_t> stop_ids;  // end_of_turn_id, then the tokenizer's EOS if another
};

// Renders `messages` with `chat_template` and tokenizes the result with `tokenizer` (named
// `tokenizer_name` in errors). INVALID_ARGUMENT for a conversation that does not end with a
// user message (the reply is the assistant's) or that the template refuses;
// FAILED_PRECONDITION naming the token when the tokenizer lacks one of the template's special
// tokens as a single token (ChatTokenizer::Create).
absl::StatusOr<ChatPrompt> BuildChatPrompt(const data::ChatTemplate& chat_template,
                                           const data::Tokenizer& tokenizer,
                                           absl::string_view tokenizer_name,
                                           absl::Span<const data::ChatMessage> messages);

enum class ChatStop { kEndOfTurn, kEos, kMaxTokens };
// "end_of_turn", "eos", "max_tokens".
absl::string_view ChatStopName(ChatStop stop);

struct ChatReply {
  std::string text;          // the reply, decoded
  std::vector<int32_t> ids;  // its ids, without the token that ended it
  ChatStop stop = ChatStop::kMaxTokens;
  int prompt_tokens = 0;
};

// The assistant's reply to `messages` by `model`, sampled with `options` among the tokenizer's
// ids. BuildChatPrompt's errors (`model_name` names the model file's tokenizer in them);
// FAILED_PRECONDITION for a model that records no tokenizer; INVALID_ARGUMENT for a prompt
// longer than the model's context (the model could not see the whole conversation) and for bad
// sampling options.
absl::StatusOr<ChatReply> GenerateChatReply(const LoadedModel& model,
                                            const data::ChatTemplate& chat_template,
                                            absl::Span<const data::ChatMessage> messages,
                                            const SampleOptions& options,
                                            absl::string_view model_name);

}  // namespace weft::model_io

#endif  // WEFT_WORKER_MODEL_IO_CHAT_SAMPLE_H_
