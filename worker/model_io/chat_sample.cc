#include "worker/model_io/chat_sample.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace weft::model_io {

absl::StatusOr<data::ChatTemplate> ChooseChatTemplate(absl::string_view requested,
                                                      const LoadedModel& model) {
  if (!requested.empty()) {
    absl::StatusOr<data::ChatTemplate> named = data::ChatTemplate::Named(requested);
    if (!named.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--template: ", named.status().message()));
    }
    return named;
  }
  const std::string known = absl::StrJoin(data::ChatTemplate::Names(), ", ");
  if (model.chat_template.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model records no chat template (its job did not train on data prepared with "
        "`trainctl data prepare --chat`): pass --template NAME (", known, ")"));
  }
  absl::StatusOr<data::ChatTemplate> recorded = data::ChatTemplate::Named(model.chat_template);
  if (!recorded.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model records chat template \"", model.chat_template,
        "\", which this trainctl does not know: pass --template NAME (", known, ")"));
  }
  return recorded;
}

absl::StatusOr<ChatPrompt> BuildChatPrompt(const data::ChatTemplate& chat_template,
                                           const data::Tokenizer& tokenizer,
                                           absl::string_view tokenizer_name,
                                           absl::Span<const data::ChatMessage> messages) {
  if (messages.empty() || messages.back().role != data::ChatRole::kUser) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the conversation must end with a user message, which the assistant answers (",
        messages.empty() ? "it has none"
                         : absl::StrCat("its last is ", data::ChatRoleName(messages.back().role)),
        ")"));
  }
  // Checked first, so that a tokenizer without the template's tokens is named as the cause
  // rather than showing up as a prompt the model never saw in training.
  WEFT_ASSIGN_OR_RETURN(const data::ChatTokenizer chat,
                        data::ChatTokenizer::Create(chat_template, &tokenizer, tokenizer_name));
  WEFT_ASSIGN_OR_RETURN(const data::RenderedChat rendered,
                        chat_template.RenderGenerationPrompt(messages));
  // The same ids `prepare --chat` gives a training conversation's text (the flags go unused).
  WEFT_ASSIGN_OR_RETURN(data::TokenizedChat tokenized,
                        chat.TokenizeRendered(rendered, data::LossMask::kAll));
  ChatPrompt prompt;
  prompt.text = rendered.Text();
  prompt.ids = std::move(tokenized.ids);
  // One id: ChatTokenizer::Create checked every special token of the template.
  WEFT_ASSIGN_OR_RETURN(const std::vector<int32_t> end,
                        tokenizer.Encode(chat_template.end_of_turn()));
  prompt.end_of_turn_id = end.at(0);
  prompt.stop_ids.push_back(prompt.end_of_turn_id);
  // A model that ends its turn with EOS instead (Mistral's end of turn is its EOS anyway).
  if (tokenizer.eos_id() >= 0 && tokenizer.eos_id() != prompt.end_of_turn_id) {
    prompt.stop_ids.push_back(tokenizer.eos_id());
  }
  return prompt;
}

absl::string_view ChatStopName(ChatStop stop) {
  switch (stop) {
    case ChatStop::kEndOfTurn:
      return "end_of_turn";
    case ChatStop::kEos:
      return "eos";
    case ChatStop::kMaxTokens:
      return "max_tokens";
  }
  return "";
}

absl::StatusOr<ChatReply> GenerateChatReply(const LoadedModel& model,
                                            const data::ChatTemplate& chat_template,
                                            absl::Span<const data::ChatMessage> messages,
                                            const SampleOptions& options,
                                            absl::string_view model_name) {
  const data::Tokenizer* tokenizer = model.tokenizer.get();
  if (tokenizer == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        model_name, " records no tokenizer: a chat needs one with the special tokens of chat "
                    "template ", chat_template.name()));
  }
  WEFT_ASSIGN_OR_RETURN(
      const ChatPrompt prompt,
      BuildChatPrompt(chat_template, *tokenizer, absl::StrCat(model_name, "'s tokenizer"),
                      messages));
  const int context = model.arch->context_length();
  if (static_cast<int64_t>(prompt.ids.size()) > context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the conversation is ", prompt.ids.size(), " tokens, longer than the model's context of ",
        context, ": it would not see the start of it"));
  }
  WEFT_ASSIGN_OR_RETURN(GeneratedTokens sampled,
                        GenerateTokens(model, prompt.ids, options, tokenizer->vocab_size(),
                                       prompt.stop_ids));
  ChatReply reply;
  reply.prompt_tokens = static_cast<int>(prompt.ids.size());
  reply.stop = sampled.stop_id < 0                         ? ChatStop::kMaxTokens
               : sampled.stop_id == prompt.end_of_turn_id ? ChatStop::kEndOfTurn
                                                           : ChatStop::kEos;
  reply.ids = std::move(sampled.ids);
  // Decoded alone: the prompt ends on a whole token (a header or [/INST]), so nothing of the
  // reply's first character belongs to it.
  reply.text = tokenizer->Decode(reply.ids);
  // Mistral writes an answer as " ANSWER</s>" after [/INST]: the space is the template's
  // separator, which the model emits with the first word, not part of the message.
  if (chat_template.name() == "mistral" && absl::StartsWith(reply.text, " ")) {
    reply.text.erase(0, 1);
  }
  return reply;
}

}  // namespace weft::model_io
