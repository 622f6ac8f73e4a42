#include "trainctl/trainctl_chat.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/status.h"
#include "nlohmann/json.hpp"
#include "trainctl/data_inputs.h"
#include "trainctl/trainctl_output.h"
#include "worker/model_io/chat_sample.h"

namespace weft::trainctl {
namespace {

// "an array", "a string": what a JSON value is, for errors.
std::string TypeOf(const nlohmann::json& value) {
  const absl::string_view name = value.type_name();
  const bool vowel =
      !name.empty() && absl::string_view("aeiou").find(name[0]) != absl::string_view::npos;
  return absl::StrCat(vowel ? "an " : "a ", name);
}

}  // namespace

void ChatSampleFlags::AddTo(CLI::App* sample) {
  CLI::Option* chat_flag = sample->add_flag(
      "--chat", chat,
      "Answer PROMPT as the assistant: render the conversation with the chat template, print "
      "only the reply");
  sample
      ->add_option("--template", chat_template,
                   "Chat template (chatml, llama3, llama3.1, mistral); default: the one the "
                   "model file records")
      ->needs(chat_flag);
  CLI::Option* system_option =
      sample->add_option("--system", system, "A system message before PROMPT")->needs(chat_flag);
  sample
      ->add_option("--messages", messages_path,
                   "JSON file of the conversation so far: [{\"role\": ..., \"content\": ...}, "
                   "...]; PROMPT, if given, is added as the last user message")
      ->needs(chat_flag)
      ->excludes(system_option);
}

absl::StatusOr<std::vector<data::ChatMessage>> ReadChatMessagesFile(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--messages: ", path, ": no such file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    return absl::InvalidArgumentError(absl::StrCat("--messages: ", path, ": cannot read"));
  }
  std::ostringstream bytes;
  bytes << in.rdbuf();
  const std::string text = bytes.str();
  WEFT_RETURN_IF_ERROR(dataprep::CheckUtf8(text, path, 1));
  const auto error = [&](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--messages: ", path, ": ", field, field.empty() ? "" : ": ", what));
  };
  const nlohmann::json value = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return error("", "not JSON");
  // Either the array itself or a chat data line's object around it; fields are named as in
  // the file, so that an error points at what to fix.
  const nlohmann::json* list = &value;
  std::string prefix;
  if (value.is_object()) {
    auto it = value.find("messages");
    if (it == value.end()) return error("", "an object without \"messages\"");
    list = &*it;
    prefix = "messages";
  }
  if (!list->is_array()) {
    return error(prefix, absl::StrCat(TypeOf(*list),
                                      ", not an array of {\"role\", \"content\"} messages"));
  }
  if (list->empty()) return error(prefix, "no message");
  std::vector<data::ChatMessage> messages;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& m = (*list)[i];
    const std::string name = absl::StrCat(prefix, "[", i, "]");
    if (!m.is_object()) {
      return error(name, absl::StrCat(TypeOf(m), ", not an object with role and content"));
    }
    for (const auto& [key, unused] : m.items()) {
      if (key != "role" && key != "content") {
        return error(absl::StrCat(name, ".", key),
                     "unknown field (a message has only role and content)");
      }
    }
    std::string fields[2];
    const char* keys[2] = {"role", "content"};
    for (int k = 0; k < 2; ++k) {
      auto it = m.find(keys[k]);
      const std::string field = absl::StrCat(name, ".", keys[k]);
      if (it == m.end()) return error(field, "missing");
      if (!it->is_string()) return error(field, absl::StrCat(TypeOf(*it), ", not a string"));
      fields[k] = it->get<std::string>();
    }
    const std::optional<data::ChatRole> role = data::ParseChatRole(fields[0]);
    if (!role) {
      return error(absl::StrCat(name, ".role"),
                   absl::StrCat("\"", fields[0], "\" is not a role (system, user or assistant)"));
    }
    messages.push_back({*role, std::move(fields[1])});
  }
  return messages;
}

absl::StatusOr<std::vector<data::ChatMessage>> ChatConversation(const ChatSampleFlags& flags,
                                                                const std::string& prompt) {
  std::vector<data::ChatMessage> messages;
  if (!flags.messages_path.empty()) {
    WEFT_ASSIGN_OR_RETURN(messages, ReadChatMessagesFile(flags.messages_path));
  } else {
    if (prompt.empty()) {
      return absl::InvalidArgumentError(
          "--chat: no message to answer: give PROMPT (or --prompt, or --messages FILE)");
    }
    if (!flags.system.empty()) messages.push_back({data::ChatRole::kSystem, flags.system});
  }
  if (!prompt.empty()) messages.push_back({data::ChatRole::kUser, prompt});
  return messages;
}

int SampleChat(const model_io::LoadedModel& model, const std::string& job_id,
               const std::string& model_path, const ChatSampleFlags& flags,
               const std::string& prompt, const model_io::SampleOptions& options, bool json) {
  absl::StatusOr<data::ChatTemplate> chat_template =
      model_io::ChooseChatTemplate(flags.chat_template, model);
  if (!chat_template.ok()) return Fail(chat_template.status());
  if (!model.chat_template.empty() && model.chat_template != chat_template->name()) {
    // Allowed (a model file exported before templates were recorded, an experiment), but a
    // model answers best in the format it was trained on.
    std::cerr << "trainctl: warning: " << model_path << " was trained on chat template "
              << model.chat_template << "; rendering with " << chat_template->name() << "\n";
  }
  absl::StatusOr<std::vector<data::ChatMessage>> messages = ChatConversation(flags, prompt);
  if (!messages.ok()) return Fail(messages.status());
  absl::StatusOr<model_io::ChatReply> reply =
      model_io::GenerateChatReply(model, *chat_template, *messages, options, model_path);
  if (!reply.ok()) return Fail(reply.status());
  if (!json) {
    std::cout << reply->text << "\n";
    return 0;
  }
  nlohmann::json conversation = nlohmann::json::array();
  for (const data::ChatMessage& m : *messages) {
    conversation.push_back({{"role", std::string(data::ChatRoleName(m.role))},
                            {"content", m.content}});
  }
  return PrintJsonObject({{"job_id", job_id},
                          {"model_path", model_path},
                          {"tokenizer", std::string(model.tokenizer->kind())},
                          {"template", std::string(chat_template->name())},
                          {"messages", conversation},
                          {"prompt_tokens", reply->prompt_tokens},
                          {"text", reply->text},
                          {"tokens", reply->ids.size()},
                          {"stop", std::string(model_io::ChatStopName(reply->stop))}});
}

}  // namespace weft::trainctl
