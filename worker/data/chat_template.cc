#include "worker/data/chat_template.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/data/token_flags.h"

namespace weft::data {
namespace {

// Llama 3's special tokens.
constexpr absl::string_view kBeginOfText = "<|begin_of_text|>";
constexpr absl::string_view kStartHeader = "<|start_header_id|>";
constexpr absl::string_view kEndHeader = "<|end_header_id|>";
constexpr absl::string_view kEndOfTurn = "<|eot_id|>";
// ChatML's.
constexpr absl::string_view kImStart = "<|im_start|>";
constexpr absl::string_view kImEnd = "<|im_end|>";
// Mistral's (SentencePiece's BOS and EOS, and the instruction brackets).
constexpr absl::string_view kMistralBos = "<s>";
constexpr absl::string_view kMistralEos = "</s>";
constexpr absl::string_view kInst = "[INST]";
constexpr absl::string_view kInstEnd = "[/INST]";

constexpr absl::string_view kQwenDefaultSystem =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
// Llama 3.1's system header when the caller gives no date_string (the template's default).
constexpr absl::string_view kLlama31DateHeader =
    "\n\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n";

// Python's str.isspace(): what Jinja's trim (str.strip()) removes.
bool IsPythonSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

// The code point of the UTF-8 sequence at the start of `s` and its length; length 0 for
// anything that is not a whole sequence (never whitespace, so trimming stops there).
std::pair<uint32_t, size_t> DecodeUtf8(absl::string_view s) {
  if (s.empty()) return {0, 0};
  const auto b = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = b(0);
  size_t n = lead < 0x80           ? 1
             : (lead >> 5) == 0x6  ? 2
             : (lead >> 4) == 0xe  ? 3
             : (lead >> 3) == 0x1e ? 4
                                   : 0;
  if (n == 0 || n > s.size()) return {0, 0};
  uint32_t c = n == 1 ? lead : lead & (0x7f >> n);
  for (size_t i = 1; i < n; ++i) {
    if ((b(i) & 0xc0) != 0x80) return {0, 0};
    c = (c << 6) | (b(i) & 0x3f);
  }
  return {c, n};
}

absl::string_view PythonStrip(absl::string_view s) {
  while (!s.empty()) {
    const auto [c, n] = DecodeUtf8(s);
    if (n == 0 || !IsPythonSpace(c)) break;
    s.remove_prefix(n);
  }
  while (!s.empty()) {
    size_t start = s.size() - 1;
    while (start > 0 && s.size() - start < 4 &&
           (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) {
      --start;
    }
    const auto [c, n] = DecodeUtf8(s.substr(start));
    if (n != s.size() - start || !IsPythonSpace(c)) break;
    s.remove_suffix(n);
  }
  return s;
}

// Appends segments, merging consecutive text of the same role and kind.
class SegmentWriter {
 public:
  void Special(absl::string_view token, ChatRole role, bool output) {
    chat_.segments.push_back(ChatSegment{std::string(token), role, output, true});
  }
  void Text(absl::string_view text, ChatRole role, bool output) {
    if (text.empty()) return;
    if (!chat_.segments.empty()) {
      ChatSegment& last = chat_.segments.back();
      if (!last.special && last.role == role && last.assistant_output == output) {
        last.text.append(text.data(), text.size());
        return;
      }
    }
    chat_.segments.push_back(ChatSegment{std::string(text), role, output, false});
  }
  RenderedChat Finish() { return std::move(chat_); }

 private:
  RenderedChat chat_;
};

bool IsAssistant(const ChatMessage& m) { return m.role == ChatRole::kAssistant; }

// <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>, content trimmed.
void Llama3Message(const ChatMessage& m, SegmentWriter* out) {
  out->Special(kStartHeader, m.role, false);
  out->Text(ChatRoleName(m.role), m.role, false);
  out->Special(kEndHeader, m.role, false);
  out->Text("\n\n", m.role, false);
  out->Text(PythonStrip(m.content), m.role, IsAssistant(m));
  out->Special(kEndOfTurn, m.role, IsAssistant(m));
}

void Llama3AssistantHeader(SegmentWriter* out) {
  out->Special(kStartHeader, ChatRole::kAssistant, false);
  out->Text("assistant", ChatRole::kAssistant, false);
  out->Special(kEndHeader, ChatRole::kAssistant, false);
  out->Text("\n\n", ChatRole::kAssistant, false);
}

// <|im_start|>ROLE\nCONTENT<|im_end|>\n, content as it is. The assistant's output ends with
// <|im_end|>: the newline after it is the template's, never sampled.
void ChatmlMessage(const ChatMessage& m, SegmentWriter* out) {
  out->Special(kImStart, m.role, false);
  out->Text(absl::StrCat(ChatRoleName(m.role), "\n"), m.role, false);
  out->Text(m.content, m.role, IsAssistant(m));
  out->Special(kImEnd, m.role, IsAssistant(m));
  out->Text("\n", m.role, false);
}

absl::Status MistralRoleError(size_t index, const ChatMessage& m) {
  return absl::InvalidArgumentError(absl::StrCat(
      "chat template mistral: messages[", index, "] is a ", ChatRoleName(m.role),
      " message, but after an optional first system message the roles must alternate user, "
      "assistant, user, ... (the template refuses anything else)"));
}

}  // namespace

absl::string_view ChatRoleName(ChatRole role) {
  switch (role) {
    case ChatRole::kSystem:
      return "system";
    case ChatRole::kUser:
      return "user";
    case ChatRole::kAssistant:
      return "assistant";
  }
  return "?";
}

std::optional<ChatRole> ParseChatRole(absl::string_view name) {
  for (ChatRole role : {ChatRole::kSystem, ChatRole::kUser, ChatRole::kAssistant}) {
    if (name == ChatRoleName(role)) return role;
  }
  return std::nullopt;
}

absl::string_view LossMaskName(LossMask mask) {
  return mask == LossMask::kAll ? "all" : "assistant";
}

std::optional<LossMask> ParseLossMask(absl::string_view name) {
  if (name == "assistant") return LossMask::kAssistant;
  if (name == "all") return LossMask::kAll;
  return std::nullopt;
}

std::string RenderedChat::Text() const {
  std::string text;
  for (const ChatSegment& s : segments) text += s.text;
  return text;
}

absl::StatusOr<ChatTemplate> ChatTemplate::Named(absl::string_view name) {
  if (name == "llama3") return ChatTemplate(Kind::kLlama3, "llama3");
  if (name == "llama3.1") return ChatTemplate(Kind::kLlama31, "llama3.1");
  if (name == "chatml") return ChatTemplate(Kind::kChatml, "chatml");
  if (name == "mistral") return ChatTemplate(Kind::kMistral, "mistral");
  return absl::InvalidArgumentError(absl::StrCat("unknown chat template \"", name,
                                                 "\" (known: ", absl::StrJoin(Names(), ", "), ")"));
}

std::vector<std::string> ChatTemplate::Names() {
  return {"chatml", "llama3", "llama3.1", "mistral"};
}

absl::string_view ChatTemplate::end_of_turn() const {
  switch (kind_) {
    case Kind::kLlama3:
    case Kind::kLlama31:
      return kEndOfTurn;
    case Kind::kChatml:
      return kImEnd;
    case Kind::kMistral:
      return kMistralEos;
  }
  return "";
}

absl::Span<const std::string> ChatTemplate::special_tokens() const {
  static const auto* const kLlama =
      new std::vector<std::string>{std::string(kBeginOfText), std::string(kStartHeader),
                                   std::string(kEndHeader), std::string(kEndOfTurn)};
  static const auto* const kChatml =
      new std::vector<std::string>{std::string(kImStart), std::string(kImEnd)};
  static const auto* const kMistral =
      new std::vector<std::string>{std::string(kMistralBos), std::string(kMistralEos),
                                   std::string(kInst), std::string(kInstEnd)};
  switch (kind_) {
    case Kind::kLlama3:
    case Kind::kLlama31:
      return *kLlama;
    case Kind::kChatml:
      return *kChatml;
    case Kind::kMistral:
      return *kMistral;
  }
  return {};
}

absl::StatusOr<RenderedChat> ChatTemplate::Render(absl::Span<const ChatMessage> messages) const {
  return RenderWith(messages, /*generation_prompt=*/false);
}

absl::StatusOr<RenderedChat> ChatTemplate::RenderGenerationPrompt(
    absl::Span<const ChatMessage> messages) const {
  return RenderWith(messages, /*generation_prompt=*/true);
}

absl::StatusOr<RenderedChat> ChatTemplate::RenderWith(absl::Span<const ChatMessage> messages,
                                                      bool generation_prompt) const {
  if (messages.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template ", name_, ": a conversation needs at least one message"));
  }
  const bool has_system = messages[0].role == ChatRole::kSystem;
  SegmentWriter out;
  switch (kind_) {
    case Kind::kLlama3:
      out.Special(kBeginOfText, ChatRole::kSystem, false);
      for (const ChatMessage& m : messages) Llama3Message(m, &out);
      if (generation_prompt) Llama3AssistantHeader(&out);
      break;
    case Kind::kLlama31:
      // The system header always comes first; only a first system message goes into it, a
      // later one is a message like any other.
      out.Special(kBeginOfText, ChatRole::kSystem, false);
      out.Special(kStartHeader, ChatRole::kSystem, false);
      out.Text("system", ChatRole::kSystem, false);
      out.Special(kEndHeader, ChatRole::kSystem, false);
      out.Text(kLlama31DateHeader, ChatRole::kSystem, false);
      if (has_system) out.Text(PythonStrip(messages[0].content), ChatRole::kSystem, false);
      out.Special(kEndOfTurn, ChatRole::kSystem, false);
      for (size_t i = has_system ? 1 : 0; i < messages.size(); ++i) {
        Llama3Message(messages[i], &out);
      }
      if (generation_prompt) Llama3AssistantHeader(&out);
      break;
    case Kind::kChatml:
      if (!has_system) {
        out.Special(kImStart, ChatRole::kSystem, false);
        out.Text(absl::StrCat("system\n", kQwenDefaultSystem), ChatRole::kSystem, false);
        out.Special(kImEnd, ChatRole::kSystem, false);
        out.Text("\n", ChatRole::kSystem, false);
      }
      for (const ChatMessage& m : messages) ChatmlMessage(m, &out);
      if (generation_prompt) {
        out.Special(kImStart, ChatRole::kAssistant, false);
        out.Text("assistant\n", ChatRole::kAssistant, false);
      }
      break;
    case Kind::kMistral: {
      const absl::Span<const ChatMessage> turns = messages.subspan(has_system ? 1 : 0);
      for (size_t i = 0; i < turns.size(); ++i) {
        const ChatRole expected = i % 2 == 0 ? ChatRole::kUser : ChatRole::kAssistant;
        if (turns[i].role != expected) {
          return MistralRoleError(i + (has_system ? 1 : 0), turns[i]);
        }
      }
      out.Special(kMistralBos, ChatRole::kSystem, false);
      for (size_t i = 0; i < turns.size(); ++i) {
        const ChatMessage& m = turns[i];
        if (m.role == ChatRole::kUser) {
          out.Special(kInst, ChatRole::kUser, false);
          if (has_system && i + 1 == turns.size()) {
            out.Text(absl::StrCat(" ", messages[0].content, "\n\n"), ChatRole::kSystem, false);
            out.Text(m.content, ChatRole::kUser, false);
          } else {
            out.Text(absl::StrCat(" ", m.content), ChatRole::kUser, false);
          }
          out.Special(kInstEnd, ChatRole::kUser, false);
        } else {
          out.Text(absl::StrCat(" ", PythonStrip(m.content)), ChatRole::kAssistant, true);
          out.Special(kMistralEos, ChatRole::kAssistant, true);
        }
      }
      // The template has no generation prompt: a prompt ends with [/INST].
      break;
    }
  }
  return out.Finish();
}

// ---------------------------------------------------------------------------------------
// Tokenization.

namespace {

// A byte range of a text that is (or is not) assistant output.
struct ByteSpan {
  size_t begin = 0;
  size_t end = 0;
  bool target = false;
};

}  // namespace

absl::StatusOr<ChatTokenizer> ChatTokenizer::Create(const ChatTemplate& chat_template,
                                                    const Tokenizer* tokenizer,
                                                    absl::string_view tokenizer_name) {
  ChatTokenizer chat(chat_template, tokenizer);
  for (const std::string& token : chat_template.special_tokens()) {
    absl::StatusOr<std::vector<int32_t>> ids = tokenizer->Encode(token);
    if (!ids.ok() || ids->size() != 1) {
      const std::string how = ids.ok()
                                  ? absl::StrCat("it encodes as ", ids->size(), " tokens")
                                  : absl::StrCat("it does not encode: ", ids.status().message());
      // SentencePiece never yields a control piece from text, so such a model cannot spell
      // the template; the model's tokenizer.json has its special tokens as added tokens.
      const std::string hint =
          tokenizer->kind() == "tokenizer.json"
              ? ""
              : absl::StrCat("; a ", tokenizer->kind(),
                             " tokenizer cannot spell special tokens in text: use the model's "
                             "tokenizer.json");
      return absl::FailedPreconditionError(
          absl::StrCat(tokenizer_name, ": no token \"", token, "\", which chat template ",
                       chat_template.name(), " needs (", how, ")", hint));
    }
    chat.special_ids_[token] = (*ids)[0];
    chat.special_texts_[(*ids)[0]] = token;
  }
  return chat;
}

std::string ChatTokenizer::TokenBytes(int32_t id) const {
  auto special = special_texts_.find(id);
  if (special != special_texts_.end()) return special->second;
  return tokenizer_->Decode({id});
}

absl::StatusOr<TokenizedChat> ChatTokenizer::Tokenize(absl::Span<const ChatMessage> messages,
                                                      LossMask mask) const {
  WEFT_ASSIGN_OR_RETURN(RenderedChat rendered, template_.Render(messages));
  return TokenizeRendered(rendered, mask);
}

namespace {

// The loss flag of each of `ids`, the tokens of `text`, under the rule of TokenizeRendered:
// a token is a target iff one of its bytes is in a target span of `spans` (which cover `text`
// in order). Token bytes come from `token_bytes`; they locate the tokens from the front until
// one does not match the text (a normalizer changed it, or the token's bytes are unknown) and
// from the back likewise; the tokens left between are one run over the bytes left between.
template <typename TokenBytesFn>
std::vector<uint8_t> LocateTargets(absl::string_view text, const std::vector<ByteSpan>& spans,
                                   absl::Span<const int32_t> ids, const TokenBytesFn& token_bytes) {
  std::vector<uint8_t> flags(ids.size(), 0);
  bool any_target = false;
  bool all_target = true;
  for (const ByteSpan& s : spans) {
    any_target = any_target || s.target;
    all_target = all_target && s.target;
  }
  if (!any_target || all_target) {
    if (all_target) std::fill(flags.begin(), flags.end(), kTokenFlagLoss);
    return flags;
  }
  // targets_before[k]: target bytes in text[0, k).
  std::vector<int64_t> targets_before(text.size() + 1, 0);
  {
    std::vector<uint8_t> is_target(text.size(), 0);
    for (const ByteSpan& s : spans) {
      if (s.target) std::fill(is_target.begin() + s.begin, is_target.begin() + s.end, 1);
    }
    for (size_t k = 0; k < text.size(); ++k) {
      targets_before[k + 1] = targets_before[k] + is_target[k];
    }
  }
  const auto target = [&](size_t begin, size_t end) {
    if (begin == end) {  // a token of no located bytes: the byte where it stands decides
      if (text.empty()) return false;
      begin = std::min(begin, text.size() - 1);
      end = begin + 1;
    }
    return targets_before[end] - targets_before[begin] > 0;
  };
  size_t front = 0;  // tokens [0, i) lie in text[0, front)
  size_t i = 0;
  for (; i < ids.size(); ++i) {
    const std::string bytes = token_bytes(ids[i]);
    if (bytes.empty() || text.compare(front, bytes.size(), bytes) != 0) break;
    flags[i] = target(front, front + bytes.size()) ? kTokenFlagLoss : 0;
    front += bytes.size();
  }
  size_t back = text.size();  // tokens [j, n) lie in text[back, size)
  size_t j = ids.size();
  for (; j > i; --j) {
    const std::string bytes = token_bytes(ids[j - 1]);
    if (bytes.empty() || bytes.size() > back - front ||
        text.compare(back - bytes.size(), bytes.size(), bytes) != 0) {
      break;
    }
    back -= bytes.size();
    flags[j - 1] = target(back, back + bytes.size()) ? kTokenFlagLoss : 0;
  }
  const uint8_t run = target(front, back) ? kTokenFlagLoss : 0;
  for (size_t k = i; k < j; ++k) flags[k] = run;
  return flags;
}

}  // namespace

absl::StatusOr<TokenizedChat> ChatTokenizer::TokenizeRendered(const RenderedChat& rendered,
                                                              LossMask mask) const {
  TokenizedChat out;
  const std::string text = rendered.Text();
  WEFT_ASSIGN_OR_RETURN(out.ids, tokenizer_->Encode(text));
  const auto token_bytes = [this](int32_t id) { return TokenBytes(id); };
  if (mask == LossMask::kAll) {
    out.flags.assign(out.ids.size(), kTokenFlagLoss);
  } else {
    // Piece by piece between the template's special tokens, which a tokenizer.json cuts out of
    // the text before anything else: the pieces' tokens are then the whole text's (checked
    // below), and a token can cross a segment boundary only inside a piece.
    std::vector<int32_t> ids;
    std::vector<uint8_t> flags;
    const std::vector<ChatSegment>& segments = rendered.segments;
    for (size_t s = 0; s < segments.size();) {
      if (segments[s].special) {
        auto id = special_ids_.find(segments[s].text);
        if (id != special_ids_.end()) {
          ids.push_back(id->second);
          flags.push_back(segments[s].assistant_output ? kTokenFlagLoss : 0);
          ++s;
          continue;
        }
      }
      std::string piece;
      std::vector<ByteSpan> spans;
      size_t e = s;
      do {
        spans.push_back(ByteSpan{piece.size(), piece.size() + segments[e].text.size(),
                                 segments[e].assistant_output});
        piece += segments[e].text;
        ++e;
      } while (e < segments.size() && !segments[e].special);
      WEFT_ASSIGN_OR_RETURN(std::vector<int32_t> piece_ids, tokenizer_->Encode(piece));
      const std::vector<uint8_t> piece_flags = LocateTargets(piece, spans, piece_ids, token_bytes);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
      flags.insert(flags.end(), piece_flags.begin(), piece_flags.end());
      s = e;
    }
    if (ids == out.ids) {
      out.flags = std::move(flags);
    } else {
      // An added token across a special token's edge (say "<|im_end|>\n" as one token):
      // locate the whole text's tokens instead.
      std::vector<ByteSpan> spans;
      size_t offset = 0;
      for (const ChatSegment& segment : segments) {
        spans.push_back(ByteSpan{offset, offset + segment.text.size(), segment.assistant_output});
        offset += segment.text.size();
      }
      out.flags = LocateTargets(text, spans, out.ids, token_bytes);
    }
  }
  if (!out.flags.empty()) out.flags[0] |= kTokenFlagDocStart;
  return out;
}

}  // namespace weft::data
