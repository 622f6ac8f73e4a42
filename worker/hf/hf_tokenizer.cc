#include "worker/hf/hf_tokenizer.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe_tokenizer.h"

namespace weft::hf {
namespace {

using Json = nlohmann::ordered_json;
using data::SentencePieceModelInfo;
using PieceKind = SentencePieceModelInfo::PieceKind;

constexpr char kSpaceSymbol[] = "\xE2\x96\x81";  // U+2581, SentencePiece's escaped space

Json Null(int id) { return id < 0 ? Json(nullptr) : Json(id); }

Json TokenizerJson(const Json& added_tokens, const Json& normalizer, const Json& pre_tokenizer,
                   const Json& decoder, const Json& model) {
  return Json{{"version", "1.0"},          {"truncation", nullptr},
              {"padding", nullptr},        {"added_tokens", added_tokens},
              {"normalizer", normalizer},  {"pre_tokenizer", pre_tokenizer},
              {"post_processor", nullptr}, {"decoder", decoder},
              {"model", model}};
}

Json BpeModel(Json vocab, const std::vector<std::pair<std::string, std::string>>& merges,
              const Json& unk_token, bool byte_fallback) {
  Json merge_list = Json::array();
  for (const auto& [left, right] : merges) merge_list.push_back({left, right});
  return Json{{"type", "BPE"},
              {"dropout", nullptr},
              {"unk_token", unk_token},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"fuse_unk", !unk_token.is_null()},
              {"byte_fallback", byte_fallback},
              {"ignore_merges", false},
              {"vocab", std::move(vocab)},
              {"merges", std::move(merge_list)}};
}

struct Special {
  std::string bos, eos, unk, pad;  // "" when none
};

Json TokenizerConfigJson(const Special& special, int64_t model_max_length) {
  const auto token = [](const std::string& t) { return t.empty() ? Json(nullptr) : Json(t); };
  return Json{{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", token(special.bos)},
              {"eos_token", token(special.eos)},
              {"unk_token", token(special.unk)},
              {"pad_token", token(special.pad)},
              {"model_max_length", model_max_length},
              // The decoder already gives the text back as it was; no "clean up" of spaces.
              {"clean_up_tokenization_spaces", false}};
}

Json SpecialTokensMapJson(const Special& special) {
  Json map = Json::object();
  for (const auto& [key, value] : {std::pair{"bos_token", &special.bos},
                                   std::pair{"eos_token", &special.eos},
                                   std::pair{"unk_token", &special.unk},
                                   std::pair{"pad_token", &special.pad}}) {
    if (!value->empty()) map[key] = *value;
  }
  return map;
}

absl::StatusOr<std::string> Dump(const Json& json, const char* file) {
  try {
    return json.dump(2, ' ', /*ensure_ascii=*/false, Json::error_handler_t::strict) + "\n";
  } catch (const nlohmann::json::exception& e) {
    return absl::FailedPreconditionError(
        absl::StrCat("Hugging Face export: cannot write ", file, ": ", e.what()));
  }
}

// The three files around `tokenizer_json`, the tokenizer.json's text.
absl::StatusOr<HfTokenizerFiles> FilesAround(std::string tokenizer_json, const Special& special,
                                             const HfTokenIds& ids, int64_t model_max_length) {
  HfTokenizerFiles files;
  files.ids = ids;
  WEFT_ASSIGN_OR_RETURN(std::string config,
                        Dump(TokenizerConfigJson(special, model_max_length),
                             kHfTokenizerConfigFile));
  WEFT_ASSIGN_OR_RETURN(std::string map,
                        Dump(SpecialTokensMapJson(special), kHfSpecialTokensFile));
  files.files = {{kHfTokenizerFile, std::move(tokenizer_json)},
                 {kHfTokenizerConfigFile, std::move(config)},
                 {kHfSpecialTokensFile, std::move(map)}};
  return files;
}

absl::StatusOr<HfTokenizerFiles> Files(const Json& tokenizer, const Special& special,
                                       const HfTokenIds& ids, int64_t model_max_length) {
  WEFT_ASSIGN_OR_RETURN(std::string tokenizer_json, Dump(tokenizer, kHfTokenizerFile));
  return FilesAround(std::move(tokenizer_json), special, ids, model_max_length);
}

absl::StatusOr<HfTokenizerFiles> ByteFiles(int64_t model_max_length) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[data::ByteLevelChar(b)] = b;
  // No regex split and no added space: every byte of the text is one token, as in Weft.
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  const Json tokenizer = TokenizerJson(Json::array(), nullptr, byte_level, byte_level,
                                       BpeModel(std::move(vocab), {}, nullptr, false));
  return Files(tokenizer, Special{}, HfTokenIds{}, model_max_length);
}

Json Replace(const char* pattern_kind, const std::string& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", {{pattern_kind, pattern}}}, {"content", content}};
}

absl::StatusOr<HfTokenizerFiles> SentencePieceFiles(const data::Tokenizer& tokenizer,
                                                     int64_t model_max_length) {
  WEFT_ASSIGN_OR_RETURN(const SentencePieceModelInfo m,
                        data::DescribeSentencePiece(tokenizer.model_bytes(), "the tokenizer"));
  if (m.type != SentencePieceModelInfo::Type::kUnigram &&
      m.type != SentencePieceModelInfo::Type::kBpe) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Hugging Face export: the SentencePiece tokenizer is a ",
        m.type == SentencePieceModelInfo::Type::kWord ? "word" : "char",
        " model (trainer_spec.model_type); only unigram and BPE models are written"));
  }
  if (m.treat_whitespace_as_suffix) {
    return absl::FailedPreconditionError(
        "Hugging Face export: the SentencePiece tokenizer puts the space mark after words "
        "(trainer_spec.treat_whitespace_as_suffix), which is not written");
  }
  const auto piece = [&](int id) { return id < 0 ? std::string() : m.pieces[id].text; };
  const std::string space = m.escape_whitespaces ? kSpaceSymbol : " ";

  Json added = Json::array();
  for (size_t id = 0; id < m.pieces.size(); ++id) {
    const PieceKind kind = m.pieces[id].kind;
    if (kind != PieceKind::kUnknown && kind != PieceKind::kControl &&
        kind != PieceKind::kUserDefined) {
      continue;
    }
    added.push_back({{"id", id},
                     {"content", m.pieces[id].text},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", kind != PieceKind::kUserDefined}});
  }

  // SentencePiece's normalization, step by step: the compiled character map, extra spaces,
  // the dummy prefix, spaces escaped.
  Json normalizers = Json::array();
  if (!m.precompiled_charsmap.empty()) {
    normalizers.push_back({{"type", "Precompiled"},
                           {"precompiled_charsmap", absl::Base64Escape(m.precompiled_charsmap)}});
  }
  if (m.remove_extra_whitespaces) {
    normalizers.push_back(Replace("Regex", " {2,}", " "));
    normalizers.push_back(Replace("Regex", "^ | $", ""));
  }
  if (m.add_dummy_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", space}});
  if (m.escape_whitespaces) normalizers.push_back(Replace("String", " ", kSpaceSymbol));
  const Json normalizer = normalizers.empty()
                              ? Json(nullptr)
                              : Json{{"type", "Sequence"}, {"normalizers", normalizers}};

  Json decoders = Json::array();
  if (m.escape_whitespaces) decoders.push_back(Replace("String", kSpaceSymbol, " "));
  if (m.byte_fallback) decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (m.add_dummy_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  const Json decoder = {{"type", "Sequence"}, {"decoders", decoders}};

  Json model;
  if (m.type == SentencePieceModelInfo::Type::kUnigram) {
    Json vocab = Json::array();
    for (const SentencePieceModelInfo::Piece& p : m.pieces) vocab.push_back({p.text, p.score});
    model = {{"type", "Unigram"},
             {"unk_id", Null(m.unk_id)},
             {"vocab", std::move(vocab)},
             {"byte_fallback", m.byte_fallback}};
  } else {
    Json vocab = Json::object();
    for (size_t id = 0; id < m.pieces.size(); ++id) vocab[m.pieces[id].text] = id;
    const Json unk = m.unk_id < 0 ? Json(nullptr) : Json(piece(m.unk_id));
    model = BpeModel(std::move(vocab), BpeMergesOf(m), unk, m.byte_fallback);
  }
  // No pre-tokenizer: SentencePiece segments the whole normalized text.
  const Json json = TokenizerJson(added, normalizer, nullptr, decoder, model);
  const Special special{piece(m.bos_id), piece(m.eos_id), piece(m.unk_id), piece(m.pad_id)};
  return Files(json, special, HfTokenIds{m.bos_id, m.eos_id, m.pad_id}, model_max_length);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> BpeMergesOf(
    const SentencePieceModelInfo& model) {
  std::unordered_map<std::string, int> normal;  // only normal pieces merge in SentencePiece
  for (size_t id = 0; id < model.pieces.size(); ++id) {
    if (model.pieces[id].kind == PieceKind::kNormal) {
      normal.emplace(model.pieces[id].text, static_cast<int>(id));
    }
  }
  struct Merge {
    float score;
    int piece, left, right;
  };
  std::vector<Merge> merges;
  for (const auto& [text, id] : normal) {
    for (size_t cut = 1; cut < text.size(); ++cut) {
      if ((static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) continue;  // inside a char
      const auto left = normal.find(text.substr(0, cut));
      const auto right = normal.find(text.substr(cut));
      if (left == normal.end() || right == normal.end()) continue;
      merges.push_back({model.pieces[id].score, id, left->second, right->second});
    }
  }
  std::sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tuple(-a.score, a.piece, a.left) < std::tuple(-b.score, b.piece, b.left);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (const Merge& m : merges) {
    out.emplace_back(model.pieces[m.left].text, model.pieces[m.right].text);
  }
  return out;
}

std::string HfGenerationConfigJson(const HfTokenIds& ids) {
  return Json{{"bos_token_id", Null(ids.bos_id)},
              {"eos_token_id", Null(ids.eos_id)},
              {"pad_token_id", Null(ids.pad_id)}}
             .dump(2) +
         "\n";
}

absl::StatusOr<HfTokenizerFiles> HfTokenizerFilesFor(const data::Tokenizer& tokenizer,
                                                      int64_t model_max_length) {
  if (tokenizer.kind() == "bytes") return ByteFiles(model_max_length);
  if (tokenizer.kind() == "tokenizer.json") {
    // It came as a tokenizer.json: it goes back out as those very bytes, and its BOS and EOS
    // (from the tokenizer_config.json it came with) into config.json's ids.
    return FilesAround(tokenizer.model_bytes(), Special{},
                       HfTokenIds{tokenizer.bos_id(), tokenizer.eos_id(), -1}, model_max_length);
  }
  return SentencePieceFiles(tokenizer, model_max_length);
}

}  // namespace weft::hf
