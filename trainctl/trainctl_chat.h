// `trainctl sample --chat`: the assistant's reply to a conversation, from a trained model
// (worker/model_io/chat_sample.h).
//   trainctl sample JOB --chat [--template NAME] [--system TEXT] PROMPT...
//   trainctl sample JOB --chat [--template NAME] --messages FILE.json [PROMPT...]
// The conversation is [system?, user: PROMPT], or FILE's messages followed by PROMPT as a user
// message when one is given. FILE holds a JSON array of {"role", "content"} objects (roles
// system, user, assistant), or an object with that array as "messages", as one line of
// `trainctl data prepare --chat` input has it.
#ifndef WEFT_TRAINCTL_TRAINCTL_CHAT_H_
#define WEFT_TRAINCTL_TRAINCTL_CHAT_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/statusor.h"
#include "worker/data/chat_template.h"
#include "worker/model_io/model_file.h"

namespace weft::trainctl {

struct ChatSampleFlags {
  bool chat = false;
  std::string chat_template;  // empty: the model's
  std::string system;
  std::string messages_path;

  // Adds --chat, --template, --system and --messages to `sample`. The last three need --chat;
  // --system and --messages exclude each other (a file says its own system message).
  void AddTo(CLI::App* sample);
};

// The messages of a --messages file, in order. INVALID_ARGUMENT naming the file and the field
// (e.g. `[2].role`) for a file that is not valid UTF-8, not JSON, neither form, holds no
// message, or a message with a missing, non-string or unknown field or an unknown role;
// NOT_FOUND for a file that does not exist.
absl::StatusOr<std::vector<data::ChatMessage>> ReadChatMessagesFile(const std::string& path);

// The conversation the flags and `prompt` (the user's message; may be empty with --messages)
// describe. ReadChatMessagesFile's errors; INVALID_ARGUMENT for no prompt without --messages.
absl::StatusOr<std::vector<data::ChatMessage>> ChatConversation(const ChatSampleFlags& flags,
                                                                const std::string& prompt);

// Renders the conversation, samples the reply with `options` and prints it (-o json when
// `json`: job_id, model_path, tokenizer, template, messages, prompt_tokens, text, tokens,
// stop). `model_path` names the model in messages. Returns the exit status.
int SampleChat(const model_io::LoadedModel& model, const std::string& job_id,
               const std::string& model_path, const ChatSampleFlags& flags,
               const std::string& prompt, const model_io::SampleOptions& options, bool json);

}  // namespace weft::trainctl

#endif  // WEFT_TRAINCTL_TRAINCTL_CHAT_H_
