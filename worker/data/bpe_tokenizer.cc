#include "worker/data/bpe_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"

namespace weft::data {
namespace {

using Json = nlohmann::json;

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

struct AddedToken {
  std::string content;
  int id = 0;
  bool special = false;
};

struct Pair {
  int left, right;
  bool operator==(const Pair&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const Pair& p) {
    return H::combine(std::move(h), p.left, p.right);
  }
};

class BpeTokenizer final : public Tokenizer {
 public:
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Load(std::string json,
                                                         absl::string_view name,
                                                         BpeSpecialIds special);

  absl::string_view kind() const override { return "tokenizer.json"; }
  int vocab_size() const override { return static_cast<int>(tokens_.size()); }
  int bos_id() const override { return special_.bos_id; }
  int eos_id() const override { return special_.eos_id; }
  const std::string& model_bytes() const override { return json_; }

  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) {
        out += kReplacement;
        continue;
      }
      const Token& t = tokens_[id];
      if (t.special) continue;
      if (t.added) {
        out += t.text;
        continue;
      }
      // Every character of a vocabulary token stands for one byte.
      for (size_t i = 0; i < t.text.size();) {
        utf8proc_int32_t cp = 0;
        const utf8proc_ssize_t n = utf8proc_iterate(
            reinterpret_cast<const utf8proc_uint8_t*>(t.text.data() + i),
            static_cast<utf8proc_ssize_t>(t.text.size() - i), &cp);
        if (n <= 0) break;
        i += static_cast<size_t>(n);
        auto it = code_point_byte_.find(static_cast<uint32_t>(cp));
        if (it == code_point_byte_.end()) {
          AppendUtf8(static_cast<uint32_t>(cp), &out);  // not a byte character: as it is
        } else {
          out.push_back(static_cast<char>(it->second));
        }
      }
    }
    return out;
  }

 protected:
  absl::Status EncodeBody(absl::string_view raw, std::vector<int32_t>* ids) const override {
    const std::string text = ReplaceInvalidUtf8(raw);
    absl::string_view rest = text;
    size_t from = 0;
    // The added tokens first: the earliest match, the longest where several start there.
    for (size_t i = 0; i < rest.size(); ++i) {
      const auto candidates = added_by_first_byte_.find(static_cast<unsigned char>(rest[i]));
      if (candidates == added_by_first_byte_.end()) continue;
      for (int a : candidates->second) {
        const AddedToken& token = added_[a];
        if (rest.compare(i, token.content.size(), token.content) != 0) continue;
        EncodeOrdinary(rest.substr(from, i - from), ids);
        ids->push_back(token.id);
        i += token.content.size() - 1;
        from = i + 1;
        break;
      }
    }
    EncodeOrdinary(rest.substr(from), ids);
    return absl::OkStatus();
  }
  // Invalid UTF-8 is replaced, not refused (see the header).
  bool requires_utf8() const override { return false; }

 private:
  struct Token {
    std::string text;
    bool added = false;
    bool special = false;
  };

  BpeTokenizer(std::string json, uint32_t crc) : Tokenizer(crc), json_(std::move(json)) {}

  // Normalized, split, byte-mapped and merged: valid UTF-8 without added tokens.
  void EncodeOrdinary(absl::string_view text, std::vector<int32_t>* ids) const {
    if (text.empty()) return;
    std::string normalized;
    if (nfc_) {
      normalized = NormalizeNfc(text);
      text = normalized;
    }
    std::string prefixed;
    if (add_prefix_space_ && text[0] != ' ') {
      prefixed = absl::StrCat(" ", text);
      text = prefixed;
    }
    std::vector<absl::string_view> pieces;
    if (pattern_ != nullptr) {
      pattern_->Split(text, &pieces);
    } else {
      pieces.push_back(text);
    }
    std::vector<int> word;
    for (absl::string_view piece : pieces) {
      if (ignore_merges_) {
        std::string mapped;
        for (unsigned char b : piece) mapped += byte_chars_[b];
        auto whole = vocab_.find(mapped);
        if (whole != vocab_.end()) {
          ids->push_back(whole->second);
          continue;
        }
      }
      word.clear();
      for (unsigned char b : piece) word.push_back(byte_ids_[b]);
      Merge(&word);
      ids->insert(ids->end(), word.begin(), word.end());
    }
  }

  // Merges the pair of lowest rank, leftmost first, until no pair has a rank: the word's
  // symbols are token ids throughout (each merge's result is in the vocabulary). A heap of
  // candidate pairs and a linked list of symbols, O(n log n): a pre-token can be long (a run
  // of a million spaces is one), and rescanning it for every merge would be quadratic.
  void Merge(std::vector<int>* word) const {
    const int n = static_cast<int>(word->size());
    if (n < 2) return;
    struct Symbol {
      int id, prev, next;  // -1: none
    };
    std::vector<Symbol> symbols(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) symbols[i] = {(*word)[i], i - 1, i + 1 < n ? i + 1 : -1};
    // (rank, left position, left id, right id): the ids tell a stale entry from a live one.
    using Candidate = std::array<int, 4>;
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    const auto push = [&](int left) {
      if (left < 0 || symbols[left].next < 0) return;
      const int right = symbols[left].next;
      auto it = merges_.find(Pair{symbols[left].id, symbols[right].id});
      if (it != merges_.end()) {
        heap.push({it->second.first, left, symbols[left].id, symbols[right].id});
      }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap.empty()) {
      const auto [rank, left, left_id, right_id] = heap.top();
      heap.pop();
      const int right = symbols[left].next;
      if (symbols[left].id != left_id || right < 0 || symbols[right].id != right_id) continue;
      symbols[left].id = merges_.find(Pair{left_id, right_id})->second.second;
      symbols[left].next = symbols[right].next;
      if (symbols[right].next >= 0) symbols[symbols[right].next].prev = left;
      symbols[right].id = -1;  // gone
      push(symbols[left].prev);
      push(left);
    }
    word->clear();
    for (int i = 0; i >= 0; i = symbols[i].next) word->push_back(symbols[i].id);
  }

  const std::string json_;
  BpeSpecialIds special_;
  std::vector<Token> tokens_;                        // by id
  absl::flat_hash_map<std::string, int> vocab_;      // vocabulary token -> id
  absl::flat_hash_map<Pair, std::pair<int, int>> merges_;  // pair -> (rank, merged id)
  std::vector<AddedToken> added_;
  // First byte of an added token -> indices into added_, longest first.
  absl::flat_hash_map<unsigned char, std::vector<int>> added_by_first_byte_;
  std::array<std::string, 256> byte_chars_;          // byte -> its character, UTF-8
  std::array<int, 256> byte_ids_{};                  // byte -> the id of its character
  absl::flat_hash_map<uint32_t, unsigned char> code_point_byte_;
  std::unique_ptr<SplitPattern> pattern_;                 // null: no split
  bool nfc_ = false;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
};

// What a JSON path of the file refuses, as FAILED_PRECONDITION.
absl::Status Unsupported(absl::string_view name, absl::string_view path, absl::string_view why) {
  return absl::FailedPreconditionError(
      absl::StrCat(name, ": ", path, ": ", why, " (Weft reads byte-level BPE tokenizer.json: "
                   "GPT-2, Llama 3, Qwen2/3, Mistral-Nemo styles)"));
}

bool IsNull(const Json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

absl::StatusOr<std::unique_ptr<Tokenizer>> BpeTokenizer::Load(std::string json,
                                                             absl::string_view name,
                                                             BpeSpecialIds special) {
  Json spec;
  try {
    spec = Json::parse(json);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": not JSON: ", e.what()));
  }
  if (!spec.is_object() || !spec.contains("model") || !spec["model"].is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no \"model\" object: not a "
                                                   "tokenizer.json"));
  }
  const uint32_t crc = Crc32c(json.data(), json.size());
  std::unique_ptr<BpeTokenizer> t(new BpeTokenizer(std::move(json), crc));
  try {
    const Json& model = spec["model"];
    if (model.value("type", "") != "BPE") {
      return Unsupported(name, "model.type", absl::StrCat("\"", model.value("type", ""),
                                                          "\", not BPE"));
    }
    if (!IsNull(model, "dropout")) return Unsupported(name, "model.dropout", "set");
    if (!IsNull(model, "unk_token")) return Unsupported(name, "model.unk_token", "set");
    if (!IsNull(model, "continuing_subword_prefix") && model["continuing_subword_prefix"] != "") {
      return Unsupported(name, "model.continuing_subword_prefix", "set");
    }
    if (!IsNull(model, "end_of_word_suffix") && model["end_of_word_suffix"] != "") {
      return Unsupported(name, "model.end_of_word_suffix", "set");
    }
    if (model.value("byte_fallback", false)) {
      return Unsupported(name, "model.byte_fallback", "true (a byte-level BPE needs none)");
    }
    t->ignore_merges_ = model.value("ignore_merges", false);
    if (!model.contains("vocab") || !model["vocab"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": model.vocab: not an object"));
    }
    int max_id = -1;
    for (const auto& [text, id] : model["vocab"].items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 24)) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": model.vocab[\"", text, "\"]: not an id in [0, 2^24)"));
      }
      t->vocab_[text] = id.get<int>();
      max_id = std::max(max_id, id.get<int>());
    }
    const Json& added = spec.contains("added_tokens") ? spec["added_tokens"] : Json::array();
    for (size_t i = 0; i < added.size(); ++i) {
      const Json& a = added[i];
      const std::string where = absl::StrCat("added_tokens[", i, "]");
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false)) {
        return Unsupported(name, where, "lstrip, rstrip or single_word set");
      }
      AddedToken token{a.at("content").get<std::string>(), a.at("id").get<int>(),
                       a.value("special", false)};
      if (token.content.empty() || token.id < 0 || token.id >= (1 << 24)) {
        return absl::InvalidArgumentError(absl::StrCat(name, ": ", where, ": empty, or its id "
                                                       "is not in [0, 2^24)"));
      }
      max_id = std::max(max_id, token.id);
      t->added_.push_back(std::move(token));
    }
    t->tokens_.resize(static_cast<size_t>(max_id + 1));
    for (const auto& [text, id] : t->vocab_) t->tokens_[id].text = text;
    for (size_t a = 0; a < t->added_.size(); ++a) {
      const AddedToken& token = t->added_[a];
      t->tokens_[token.id] = {token.content, true, token.special};
      t->added_by_first_byte_[static_cast<unsigned char>(token.content[0])].push_back(
          static_cast<int>(a));
    }
    for (auto& [first, list] : t->added_by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [&](int x, int y) {
        return t->added_[x].content.size() > t->added_[y].content.size();
      });
    }
    // The byte alphabet: every byte's character must be a token.
    for (int b = 0; b < 256; ++b) {
      t->byte_chars_[b] = ByteLevelChar(b);
      t->code_point_byte_[ByteLevelCodePoint(b)] = static_cast<unsigned char>(b);
      auto it = t->vocab_.find(t->byte_chars_[b]);
      if (it == t->vocab_.end()) {
        return Unsupported(name, "model.vocab",
                           absl::StrCat("no token for byte ", b, " (\"", t->byte_chars_[b],
                                        "\"): not a byte-level vocabulary"));
      }
      t->byte_ids_[b] = it->second;
    }
    const Json& merges = model.contains("merges") ? model["merges"] : Json::array();
    for (size_t r = 0; r < merges.size(); ++r) {
      std::string left, right;
      if (merges[r].is_string()) {
        const std::string m = merges[r].get<std::string>();
        const size_t space = m.find(' ', 1);
        if (space == std::string::npos) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ": model.merges[", r, "]: \"", m, "\" is not \"left right\""));
        }
        left = m.substr(0, space);
        right = m.substr(space + 1);
      } else {
        left = merges[r].at(0).get<std::string>();
        right = merges[r].at(1).get<std::string>();
      }
      auto l = t->vocab_.find(left), rt = t->vocab_.find(right),
           merged = t->vocab_.find(left + right);
      if (l == t->vocab_.end() || rt == t->vocab_.end() || merged == t->vocab_.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": model.merges[", r, "]: \"", left, "\" + \"", right,
            "\": a side or the merged token is not in model.vocab"));
      }
      t->merges_.try_emplace(Pair{l->second, rt->second},
                             std::pair{static_cast<int>(r), merged->second});
    }

    // normalizer: none, NFC, or a Sequence of NFC.
    if (!IsNull(spec, "normalizer")) {
      std::vector<Json> parts = {spec["normalizer"]};
      if (spec["normalizer"].value("type", "") == "Sequence") {
        parts = spec["normalizer"].at("normalizers").get<std::vector<Json>>();
      }
      for (const Json& n : parts) {
        if (n.value("type", "") != "NFC") {
          return Unsupported(name, "normalizer",
                             absl::StrCat("\"", n.value("type", ""), "\" (only NFC)"));
        }
        t->nfc_ = true;
      }
    }

    // pre_tokenizer: ByteLevel, or Split(s) then a ByteLevel without its own split.
    if (IsNull(spec, "pre_tokenizer")) {
      return Unsupported(name, "pre_tokenizer", "none: a byte-level BPE needs ByteLevel");
    }
    std::vector<Json> pre = {spec["pre_tokenizer"]};
    if (spec["pre_tokenizer"].value("type", "") == "Sequence") {
      pre = spec["pre_tokenizer"].at("pretokenizers").get<std::vector<Json>>();
    }
    std::string pattern;
    bool byte_level = false;
    for (size_t i = 0; i < pre.size(); ++i) {
      const Json& p = pre[i];
      const std::string where = absl::StrCat("pre_tokenizer[", i, "]");
      const std::string type = p.value("type", "");
      if (type == "ByteLevel") {
        if (byte_level || i + 1 != pre.size()) {
          return Unsupported(name, where, "ByteLevel must come once, last");
        }
        byte_level = true;
        t->add_prefix_space_ = p.value("add_prefix_space", false);
        if (p.value("use_regex", true)) {
          if (!pattern.empty()) return Unsupported(name, where, "a Split and use_regex both");
          pattern = kGpt2SplitPattern;
        }
      } else if (type == "Split") {
        if (!pattern.empty()) return Unsupported(name, where, "more than one split");
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false)) {
          return Unsupported(name, where, "a Split other than Isolated, not inverted");
        }
        const Json& pat = p.at("pattern");
        if (pat.contains("Regex")) {
          pattern = pat["Regex"].get<std::string>();
        } else if (pat.contains("String")) {
          // A literal: quoted for PCRE2.
          pattern = absl::StrCat("\\Q", pat["String"].get<std::string>(), "\\E");
        } else {
          return Unsupported(name, where, "a pattern neither Regex nor String");
        }
      } else {
        return Unsupported(name, where, absl::StrCat("\"", type, "\""));
      }
    }
    if (!byte_level) return Unsupported(name, "pre_tokenizer", "no ByteLevel");
    if (!pattern.empty()) {
      auto compiled = SplitPattern::Compile(pattern, absl::StrCat(name, ": pre_tokenizer"));
      if (!compiled.ok()) return compiled.status();
      t->pattern_ = *std::move(compiled);
    }
    if (!IsNull(spec, "decoder") && spec["decoder"].value("type", "") != "ByteLevel") {
      return Unsupported(name, "decoder",
                         absl::StrCat("\"", spec["decoder"].value("type", ""), "\", not ByteLevel"));
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", e.what()));
  }
  for (const auto& [what, id] : {std::pair{"BOS", special.bos_id}, {"EOS", special.eos_id}}) {
    if (id < -1 || id >= t->vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", what, " id ", id,
                                                     " is outside the vocabulary of ",
                                                     t->vocab_size()));
    }
  }
  t->special_ = special;
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SplitPattern>> SplitPattern::Compile(const std::string& pattern,
                                                                    absl::string_view where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return absl::FailedPreconditionError(
        absl::StrCat(where, ": the pattern does not compile at offset ", offset, ": ",
                     reinterpret_cast<const char*>(message)));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT it still matches, slower
  return std::unique_ptr<SplitPattern>(new SplitPattern(code));
}

SplitPattern::~SplitPattern() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void SplitPattern::Split(absl::string_view text, std::vector<absl::string_view>* pieces) const {
  pcre2_code* code = static_cast<pcre2_code*>(code_);
  pcre2_match_data* data = pcre2_match_data_create_from_pattern(code, nullptr);
  size_t at = 0, emitted = 0;
  while (at <= text.size()) {
    const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                               PCRE2_NO_UTF_CHECK, data, nullptr);
    if (rc < 0) break;
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data);
    const size_t begin = v[0], end = v[1];
    if (end == begin) {  // an empty match: step over one character
      if (begin >= text.size()) break;
      at = begin + std::max<size_t>(1, Utf8SequenceLength(text, begin));
      continue;
    }
    if (begin > emitted) pieces->push_back(text.substr(emitted, begin - emitted));
    pieces->push_back(text.substr(begin, end - begin));
    emitted = at = end;
  }
  if (emitted < text.size()) pieces->push_back(text.substr(emitted));
  pcre2_match_data_free(data);
}

std::string NormalizeNfc(absl::string_view text) {
  // By length, not NUL-terminated: a NUL in the text is a character like any other.
  utf8proc_uint8_t* nfc = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &nfc,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  // Valid UTF-8 always maps; on a failure the text goes on as it is.
  std::string out = n >= 0 ? std::string(reinterpret_cast<const char*>(nfc), static_cast<size_t>(n))
                           : std::string(text);
  std::free(nfc);
  return out;
}

uint32_t ByteLevelCodePoint(int b) {
  const auto printable = [](int c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  if (printable(b)) return static_cast<uint32_t>(b);
  uint32_t before = 0;  // non-printable bytes below b
  for (int c = 0; c < b; ++c) before += printable(c) ? 0 : 1;
  return 0x100 + before;
}

std::string ByteLevelChar(int b) {
  std::string s;
  AppendUtf8(ByteLevelCodePoint(b), &s);
  return s;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerJson(std::string json,
                                                                 absl::string_view name,
                                                                 BpeSpecialIds special) {
  return BpeTokenizer::Load(std::move(json), name, special);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadBpeTokenizerFile(const std::string& path) {
  absl::StatusOr<std::string> json = ReadTokenizerFile(path);
  if (!json.ok()) return json.status();
  BpeSpecialIds special;
  const std::string config =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  if (std::filesystem::exists(config)) {
    absl::StatusOr<std::string> text = ReadTokenizerFile(config);
    if (!text.ok()) return text.status();
    absl::StatusOr<BpeSpecialIds> ids = ReadHfSpecialIds(*text, config, *json);
    if (!ids.ok()) return ids.status();
    special = *ids;
  }
  return LoadBpeTokenizerJson(*std::move(json), path, special);
}

absl::StatusOr<BpeSpecialIds> ReadHfSpecialIds(const std::string& config_json,
                                               absl::string_view config_name,
                                               const std::string& tokenizer_json) {
  Json config, tokenizer;
  try {
    config = Json::parse(config_json);
    tokenizer = Json::parse(tokenizer_json);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_name, ": not JSON: ", e.what()));
  }
  const auto id_of = [&](const char* field) -> absl::StatusOr<int> {
    if (!config.is_object() || !config.contains(field) || config[field].is_null()) return -1;
    const Json& v = config[field];
    const Json& content = v.is_object() && v.contains("content") ? v["content"] : v;
    if (!content.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(config_name, ": ", field, ": not a string or {\"content\": string}"));
    }
    const std::string text = content.get<std::string>();
    if (tokenizer.contains("added_tokens") && tokenizer["added_tokens"].is_array()) {
      for (const Json& a : tokenizer["added_tokens"]) {
        if (a.value("content", "") == text && a.contains("id")) return a["id"].get<int>();
      }
    }
    if (tokenizer.contains("model") && tokenizer["model"].contains("vocab") &&
        tokenizer["model"]["vocab"].contains(text)) {
      return tokenizer["model"]["vocab"][text].get<int>();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        config_name, ": ", field, " \"", text, "\" is not a token of the tokenizer.json"));
  };
  BpeSpecialIds ids;
  try {
    absl::StatusOr<int> bos = id_of("bos_token");
    if (!bos.ok()) return bos.status();
    absl::StatusOr<int> eos = id_of("eos_token");
    if (!eos.ok()) return eos.status();
    ids.bos_id = *bos;
    ids.eos_id = *eos;
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(config_name, ": ", e.what()));
  }
  return ids;
}

}  // namespace weft::data
