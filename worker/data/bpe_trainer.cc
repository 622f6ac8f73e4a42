#include "worker/data/bpe_trainer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status.h"
#include "common/utf8.h"
#include "nlohmann/json.hpp"
#include "worker/data/bpe_tokenizer.h"
#include "worker/data/tokenizer.h"

namespace weft::data {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kByteTokens = 256;
constexpr int kMaxVocab = 1 << 24;  // what bpe_tokenizer.h reads

struct Style {
  absl::string_view name;
  const char* pattern;  // the split; for gpt2 the one ByteLevel's use_regex applies
  bool split_in_byte_level;
  bool nfc;
  bool ignore_merges;
};

constexpr std::array<Style, 3> kStyles = {{
    {"gpt2", kGpt2SplitPattern, true, false, false},
    {"llama3", kLlama3SplitPattern, false, false, true},
    {"qwen2", kQwen2SplitPattern, false, true, false},
}};

const Style* FindStyle(absl::string_view name) {
  for (const Style& s : kStyles) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// The special tokens, cut out of the text before anything else, as the tokenizer's encoder
// does: at the earliest position one starts, the longest of those that start there.
class SpecialCutter {
 public:
  explicit SpecialCutter(const std::vector<std::string>& specials) : specials_(specials) {
    std::stable_sort(
        specials_.begin(), specials_.end(),
        [](const std::string& x, const std::string& y) { return x.size() > y.size(); });
    for (const std::string& s : specials_) first_byte_[static_cast<unsigned char>(s[0])] = true;
  }

  // Calls `fn` on each stretch of `text` between special tokens (empty ones too).
  template <typename Fn>
  void ForEachOrdinary(absl::string_view text, Fn&& fn) const {
    size_t from = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if (!first_byte_[static_cast<unsigned char>(text[i])]) continue;
      for (const std::string& s : specials_) {
        if (text.compare(i, s.size(), s) != 0) continue;
        fn(text.substr(from, i - from));
        i += s.size() - 1;
        from = i + 1;
        break;
      }
    }
    fn(text.substr(from));
  }

 private:
  std::vector<std::string> specials_;  // longest first
  std::array<bool, 256> first_byte_{};
};

using WordCounts = absl::flat_hash_map<std::string, int64_t>;

// Whether the split of every pattern here is the same for text[0, p) and text[p, end) as for
// the whole: a line break between a printable ASCII character and an ASCII letter. No match
// can span it (only whitespace and punctuation matches take a line break, and none takes a
// letter after it), and the one lookahead, \s+(?!\S), sees the same either way: in the whole
// text a lone "\n" before a letter fails it and \s+ takes the "\n"; in the left part alone it
// takes the same "\n" at the end. NFC does not compose across it either.
bool IsSafeCut(absl::string_view text, size_t p) {
  if (p < 2 || p >= text.size() || text[p - 1] != '\n') return false;
  const unsigned char before = static_cast<unsigned char>(text[p - 2]);
  const unsigned char after = static_cast<unsigned char>(text[p]);
  return before > ' ' && before < 0x7F && ((after | 0x20) >= 'a' && (after | 0x20) <= 'z');
}

// The text to count, cut into pieces that can be counted apart (in any order, on any
// thread) and give the counts of the whole: documents, the stretches between special tokens,
// and stretches longer than `chunk_bytes` cut at safe line breaks, so that one large file is
// not one thread's work. Views into the documents, or into `fixed` for documents whose invalid
// UTF-8 was replaced.
std::vector<absl::string_view> CutWork(const std::vector<std::string>& documents,
                                       const SpecialCutter& cutter, size_t chunk_bytes,
                                       std::deque<std::string>* fixed) {
  std::vector<absl::string_view> work;
  for (absl::string_view document : documents) {
    if (FindInvalidUtf8(document).has_value()) {
      fixed->push_back(ReplaceInvalidUtf8(document));
      document = fixed->back();
    }
    cutter.ForEachOrdinary(document, [&](absl::string_view text) {
      while (text.size() > chunk_bytes) {
        size_t p = text.find('\n', chunk_bytes - 1);
        while (p != absl::string_view::npos && !IsSafeCut(text, p + 1)) {
          p = text.find('\n', p + 1);
        }
        if (p == absl::string_view::npos) break;
        work.push_back(text.substr(0, p + 1));
        text.remove_prefix(p + 1);
      }
      if (!text.empty()) work.push_back(text);
    });
  }
  return work;
}

// How a stretch of text between special tokens becomes counted pre-tokens: exactly the
// encoder's path (BpeTokenizer::EncodeOrdinary), so that the words learned from are the ones
// encoded.
class Counter {
 public:
  Counter(const Style& style, const SplitPattern& pattern) : style_(style), pattern_(pattern) {}

  void Count(absl::string_view text, WordCounts* counts, int64_t* pre_tokens,
             std::vector<absl::string_view>* pieces) const {
    std::string normalized;
    if (style_.nfc) {
      normalized = NormalizeNfc(text);
      text = normalized;
    }
    pieces->clear();
    pattern_.Split(text, pieces);
    for (absl::string_view piece : *pieces) {
      auto it = counts->find(piece);
      if (it == counts->end()) {
        counts->emplace(std::string(piece), 1);
      } else {
        ++it->second;
      }
    }
    *pre_tokens += static_cast<int64_t>(pieces->size());
  }

 private:
  const Style& style_;
  const SplitPattern& pattern_;
};

// Words counted on `threads` threads, each taking the next piece of work; their counts summed.
WordCounts CountWords(const std::vector<absl::string_view>& work, const Counter& counter,
                      int threads, int64_t* pre_tokens) {
  threads = std::max(1, std::min<int>(threads, static_cast<int>(work.size())));
  std::vector<WordCounts> counts(static_cast<size_t>(threads));
  std::vector<int64_t> tokens(static_cast<size_t>(threads), 0);
  std::atomic<size_t> next{0};
  const auto count = [&](int t) {
    std::vector<absl::string_view> pieces;
    for (size_t i; (i = next.fetch_add(1)) < work.size();) {
      counter.Count(work[i], &counts[t], &tokens[t], &pieces);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(count, t);
  count(0);
  for (std::thread& t : pool) t.join();
  for (int t = 1; t < threads; ++t) {
    for (auto& [word, n] : counts[t]) counts[0][word] += n;
    counts[t] = {};
  }
  *pre_tokens = 0;
  for (int64_t n : tokens) *pre_tokens += n;
  return std::move(counts[0]);
}

using PairKey = uint64_t;  // left id << 32 | right id; ordered as (left, right)
PairKey MakePair(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
}
int32_t Left(PairKey p) { return static_cast<int32_t>(p >> 32); }
int32_t Right(PairKey p) { return static_cast<int32_t>(p & 0xFFFFFFFFu); }

// The merge loop over the counted words. Each word's symbols (token ids) live in one shared
// array and shrink in place as pairs merge.
class MergeLearner {
 public:
  struct Merge {
    int32_t left, right, result;
  };

  // `byte_id`: the id of each byte's token; `banned`: byte strings no merge may make (the
  // special tokens' texts, which as ordinary tokens would collide with them).
  MergeLearner(const WordCounts& counts, const std::array<int32_t, 256>& byte_id,
               absl::flat_hash_set<std::string> banned)
      : banned_(std::move(banned)) {
    token_bytes_.resize(kByteTokens);
    for (int b = 0; b < kByteTokens; ++b) token_bytes_[byte_id[b]] = std::string(1, char(b));
    for (int id = 0; id < kByteTokens; ++id) token_id_[token_bytes_[id]] = id;
    // Words in byte order, so that every run lays them out alike (the result does not depend
    // on it, but a run that can be repeated exactly is easier to reason about).
    std::vector<const std::pair<const std::string, int64_t>*> sorted;
    sorted.reserve(counts.size());
    for (const auto& entry : counts) {
      if (entry.first.size() >= 2) sorted.push_back(&entry);  // one byte: no pair
    }
    std::sort(sorted.begin(), sorted.end(),
              [](const auto* x, const auto* y) { return x->first < y->first; });
    words_.reserve(sorted.size());
    for (const auto* entry : sorted) {
      Word w{symbols_.size(), static_cast<uint32_t>(entry->first.size()), entry->second};
      for (unsigned char b : entry->first) symbols_.push_back(byte_id[b]);
      words_.push_back(w);
    }
    for (size_t w = 0; w < words_.size(); ++w) {
      const int32_t* s = &symbols_[words_[w].offset];
      for (uint32_t i = 0; i + 1 < words_[w].length; ++i) {
        const PairKey p = MakePair(s[i], s[i + 1]);
        pair_count_[p] += words_[w].count;
        std::vector<int32_t>& where = pair_words_[p];
        if (where.empty() || where.back() != static_cast<int32_t>(w)) {
          where.push_back(static_cast<int32_t>(w));
        }
      }
    }
    for (const auto& [p, n] : pair_count_) heap_.push({n, p});
  }

  // Learns merges until there are `max_tokens` tokens or no pair is seen `min_frequency`
  // times.
  void Learn(int max_tokens, int64_t min_frequency) {
    while (static_cast<int>(token_bytes_.size()) < max_tokens && !heap_.empty()) {
      const Candidate top = heap_.top();
      heap_.pop();
      auto found = pair_count_.find(top.pair);
      const int64_t count = found == pair_count_.end() ? 0 : found->second;
      if (count != top.count) {
        // Stale. A count only falls after its entry is pushed, except for pairs with a new
        // token, which get an entry of their own when they rise: so a higher count than this
        // entry's already has one, and a lower one goes back in at its true place.
        if (count > 0 && count < top.count) heap_.push({count, top.pair});
        continue;
      }
      if (count < min_frequency) break;  // the largest count left
      const int32_t left = Left(top.pair), right = Right(top.pair);
      if (auto done = merged_.find(top.pair); done != merged_.end()) {
        // Merged before, and made again since by a later merge whose token another merge had
        // already made. The encoder applies it at its first rank; so does the text here.
        Apply(top.pair, done->second);
        continue;
      }
      std::string bytes = absl::StrCat(token_bytes_[left], token_bytes_[right]);
      if (banned_.contains(bytes)) continue;  // never merged; any later entry of it is skipped too
      int32_t result;
      if (auto existing = token_id_.find(bytes); existing != token_id_.end()) {
        result = existing->second;  // the same text by another pair: one token, two merges
      } else {
        result = static_cast<int32_t>(token_bytes_.size());
        token_id_.emplace(bytes, result);
        token_bytes_.push_back(std::move(bytes));
      }
      merged_.emplace(top.pair, result);
      merges_.push_back({left, right, result});
      Apply(top.pair, result);
    }
  }

  const std::vector<std::string>& token_bytes() const { return token_bytes_; }
  const std::vector<Merge>& merges() const { return merges_; }
  size_t words() const { return words_.size(); }

 private:
  struct Word {
    size_t offset;
    uint32_t length;
    int64_t count;
  };
  struct Candidate {
    int64_t count;
    PairKey pair;
    // The heap's top is the largest count, then the smallest (left, right).
    bool operator<(const Candidate& o) const {
      return count != o.count ? count < o.count : pair > o.pair;
    }
  };

  void Add(PairKey p, int64_t delta) {
    auto it = pair_count_.try_emplace(p, 0).first;
    it->second += delta;
    if (it->second == 0) {  // gone from every word: forget it and where it was
      pair_count_.erase(it);
      pair_words_.erase(p);
    }
  }

  // Replaces every occurrence of `pair` by `result` in the words that hold it, left to right,
  // and updates the counts of the pairs around each occurrence; pairs with `result` that rise
  // are pushed with their new counts.
  void Apply(PairKey pair, int32_t result) {
    std::vector<int32_t> where;
    if (auto it = pair_words_.find(pair); it != pair_words_.end()) {
      where = std::move(it->second);
      pair_words_.erase(it);
    }
    std::sort(where.begin(), where.end());
    where.erase(std::unique(where.begin(), where.end()), where.end());
    const int32_t a = Left(pair), b = Right(pair);
    std::vector<PairKey> risen;
    const auto rise = [&](PairKey p, int32_t w, int64_t c) {
      Add(p, c);
      if (!pair_count_.contains(p)) return;
      std::vector<int32_t>& list = pair_words_[p];
      if (list.empty() || list.back() != w) list.push_back(w);
      risen.push_back(p);
    };
    for (int32_t w : where) {
      Word& word = words_[static_cast<size_t>(w)];
      int32_t* s = &symbols_[word.offset];
      const int64_t c = word.count;
      const uint32_t n = word.length;
      uint32_t out = 0;  // the merged word is written over the old one, never ahead of it
      for (uint32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
          if (out > 0) {  // the left neighbour, perhaps an occurrence just merged
            Add(MakePair(s[out - 1], a), -c);
            rise(MakePair(s[out - 1], result), w, c);
          }
          if (i + 2 < n) {
            Add(MakePair(b, s[i + 2]), -c);
            rise(MakePair(result, s[i + 2]), w, c);
          }
          Add(pair, -c);
          s[out++] = result;
          i += 2;
        } else {
          s[out++] = s[i++];
        }
      }
      word.length = out;
    }
    std::sort(risen.begin(), risen.end());
    risen.erase(std::unique(risen.begin(), risen.end()), risen.end());
    for (PairKey p : risen) {
      auto it = pair_count_.find(p);
      if (it != pair_count_.end() && it->second > 0) heap_.push({it->second, p});
    }
  }

  std::vector<int32_t> symbols_;
  std::vector<Word> words_;
  absl::flat_hash_map<PairKey, int64_t> pair_count_;
  // The words that held the pair when it was counted or rose; some may no longer hold it.
  absl::flat_hash_map<PairKey, std::vector<int32_t>> pair_words_;
  std::priority_queue<Candidate> heap_;
  std::vector<std::string> token_bytes_;  // by id: the bytes a token stands for
  absl::flat_hash_map<std::string, int32_t> token_id_;
  absl::flat_hash_map<PairKey, int32_t> merged_;
  std::vector<Merge> merges_;
  absl::flat_hash_set<std::string> banned_;
};

std::string Quote(absl::string_view s) { return Json(std::string(s)).dump(); }

// The special token's text as the bytes a byte-level token with that text stands for, or
// nothing when some character of it stands for no byte (then no token can have its text).
std::optional<std::string> AsByteLevelBytes(const std::string& text,
                                            const absl::flat_hash_map<std::string, int>& chars) {
  std::string bytes;
  for (size_t i = 0; i < text.size();) {
    const size_t n = Utf8SequenceLength(text, i);
    if (n == 0) return std::nullopt;
    auto it = chars.find(text.substr(i, n));
    if (it == chars.end()) return std::nullopt;
    bytes.push_back(static_cast<char>(it->second));
    i += n;
  }
  return bytes;
}

}  // namespace

std::vector<std::string> BpeStyleSpecialTokens(absl::string_view style) {
  if (style == "gpt2") return {"<|endoftext|>"};
  if (style == "llama3") {
    return {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>"};
  }
  if (style == "qwen2") return {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  return {};
}

std::string BpeStyleBos(absl::string_view style) {
  if (style == "gpt2") return "<|endoftext|>";
  if (style == "llama3") return "<|begin_of_text|>";
  return "";
}

std::string BpeStyleEos(absl::string_view style) {
  if (style == "gpt2" || style == "qwen2") return "<|endoftext|>";
  if (style == "llama3") return "<|end_of_text|>";
  return "";
}

namespace {

// The options checked, and what follows from them.
struct Plan {
  const Style* style = nullptr;
  std::vector<std::string> specials;
  std::string bos, eos;  // "": none
  absl::flat_hash_set<std::string> banned;  // byte strings no merge may make
};

absl::StatusOr<Plan> MakePlan(const BpeTrainOptions& options) {
  Plan plan;
  plan.style = FindStyle(options.style);
  if (plan.style == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("style \"", options.style, "\": not one of gpt2, llama3, qwen2"));
  }
  const Style* style = plan.style;
  const std::vector<std::string>& specials = plan.specials =
      options.special_tokens.value_or(BpeStyleSpecialTokens(style->name));
  absl::flat_hash_map<std::string, int> char_byte;
  for (int b = 0; b < 256; ++b) char_byte[ByteLevelChar(b)] = b;
  for (size_t i = 0; i < specials.size(); ++i) {
    const std::string& s = specials[i];
    const std::string where = absl::StrCat("special_tokens[", i, "] \"", s, "\"");
    if (s.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("special_tokens[", i, "]: empty"));
    }
    if (FindInvalidUtf8(s).has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("special_tokens[", i, "]: not UTF-8"));
    }
    if (std::find(specials.begin(), specials.begin() + i, s) != specials.begin() + i) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": given twice"));
    }
    if (char_byte.contains(s)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the token of byte ", char_byte[s],
                       " has that text; every byte keeps its own token"));
    }
    // A learned token with the special token's text would be a second token of that text,
    // which the library would fold into the special one: no merge may make it.
    if (std::optional<std::string> bytes = AsByteLevelBytes(s, char_byte)) {
      plan.banned.insert(*std::move(bytes));
    }
  }
  const int64_t floor = kByteTokens + static_cast<int64_t>(specials.size());
  if (options.vocab_size < floor || options.vocab_size > kMaxVocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "vocab_size ", options.vocab_size, ": must lie in [", floor, ", ", kMaxVocab,
        "] (the 256 byte tokens and the ", specials.size(), " special tokens at least)"));
  }
  const auto pick = [&](const std::optional<std::string>& given, const std::string& fallback,
                        absl::string_view field) -> absl::StatusOr<std::string> {
    const auto listed = [&](const std::string& t) {
      return std::find(specials.begin(), specials.end(), t) != specials.end();
    };
    if (!given.has_value()) return listed(fallback) ? fallback : "";
    if (!given->empty() && !listed(*given)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " \"", *given, "\": not one of the special tokens (",
                       absl::StrJoin(specials, " "), ")"));
    }
    return *given;
  };
  WEFT_ASSIGN_OR_RETURN(plan.bos, pick(options.bos_token, BpeStyleBos(style->name), "bos_token"));
  WEFT_ASSIGN_OR_RETURN(plan.eos, pick(options.eos_token, BpeStyleEos(style->name), "eos_token"));
  if (options.min_frequency < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_frequency ", options.min_frequency, ": must be at least 1"));
  }
  if (options.threads < 0) {
    return absl::InvalidArgumentError(absl::StrCat("threads ", options.threads, ": negative"));
  }
  if (options.chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", options.chunk_bytes, ": must be at least 1"));
  }
  return plan;
}

}  // namespace

absl::Status CheckBpeTrainOptions(const BpeTrainOptions& options) {
  return MakePlan(options).status();
}

absl::StatusOr<BpeTrainResult> TrainBpeTokenizer(const BpeTrainOptions& options) {
  WEFT_ASSIGN_OR_RETURN(Plan plan, MakePlan(options));
  const Style* style = plan.style;
  const std::vector<std::string>& specials = plan.specials;
  std::array<std::string, 256> byte_char;
  for (int b = 0; b < 256; ++b) byte_char[b] = ByteLevelChar(b);

  BpeTrainResult result;
  const absl::Time start = absl::Now();
  WEFT_ASSIGN_OR_RETURN(std::unique_ptr<SplitPattern> pattern,
                        SplitPattern::Compile(style->pattern, style->name));
  const SpecialCutter cutter(specials);
  const Counter counter(*style, *pattern);
  std::deque<std::string> fixed;
  const std::vector<absl::string_view> work =
      CutWork(options.documents, cutter, static_cast<size_t>(options.chunk_bytes), &fixed);
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  result.pieces = static_cast<int64_t>(work.size());
  WordCounts counts = CountWords(work, counter, threads, &result.pre_tokens);
  if (result.pre_tokens == 0) {
    return absl::InvalidArgumentError(
        options.documents.empty()
            ? "documents: none, no text to learn from"
            : "documents: no text to learn from (empty, or nothing but special tokens)");
  }
  result.words = static_cast<int64_t>(counts.size());
  const absl::Time counted = absl::Now();
  result.count_seconds = absl::ToDoubleSeconds(counted - start);

  // Byte tokens in the order of their characters' code points: ids 0..255 as GPT-2 has them.
  std::array<int, 256> by_code_point;
  for (int b = 0; b < 256; ++b) by_code_point[b] = b;
  std::sort(by_code_point.begin(), by_code_point.end(),
            [](int x, int y) { return ByteLevelCodePoint(x) < ByteLevelCodePoint(y); });
  std::array<int32_t, 256> byte_id;
  for (int id = 0; id < 256; ++id) byte_id[by_code_point[id]] = id;

  MergeLearner learner(counts, byte_id, std::move(plan.banned));
  counts = {};
  learner.Learn(options.vocab_size - static_cast<int>(specials.size()), options.min_frequency);
  result.merge_seconds = absl::ToDoubleSeconds(absl::Now() - counted);

  const std::vector<std::string>& tokens = learner.token_bytes();
  std::vector<std::string> text(tokens.size());  // each token's byte-level characters
  for (size_t id = 0; id < tokens.size(); ++id) {
    for (unsigned char b : tokens[id]) text[id] += byte_char[b];
  }
  const int first_special = static_cast<int>(tokens.size());
  result.vocab_size = first_special + static_cast<int>(specials.size());
  result.merges = static_cast<int>(learner.merges().size());
  for (size_t i = 0; i < specials.size(); ++i) {
    if (specials[i] == plan.bos) result.bos_id = first_special + static_cast<int>(i);
    if (specials[i] == plan.eos) result.eos_id = first_special + static_cast<int>(i);
  }

  // Written by hand rather than dumped whole: one vocabulary entry and one merge a line keeps
  // a file of 100k tokens readable and diffable (a dump with indentation would spread each
  // merge over four lines).
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", style->split_in_byte_level}};
  Json pre_tokenizer = byte_level;
  if (!style->split_in_byte_level) {
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"},
                        {"pattern", {{"Regex", style->pattern}}},
                        {"behavior", "Isolated"},
                        {"invert", false}},
                       byte_level}}};
  }
  const Json normalizer = style->nfc ? Json{{"type", "NFC"}} : Json(nullptr);
  const Json decoder = {{"type", "ByteLevel"},
                        {"add_prefix_space", true},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  std::string& out = result.tokenizer_json;
  out.reserve(tokens.size() * 24 + learner.merges().size() * 24 + 4096);
  absl::StrAppend(&out,
                  "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n"
                  "  \"padding\": null,\n  \"added_tokens\": [");
  for (size_t i = 0; i < specials.size(); ++i) {
    const Json added = {{"id", first_special + static_cast<int>(i)},
                        {"content", specials[i]},
                        {"single_word", false},
                        {"lstrip", false},
                        {"rstrip", false},
                        {"normalized", false},
                        {"special", true}};
    absl::StrAppend(&out, i == 0 ? "\n    " : ",\n    ", added.dump());
  }
  absl::StrAppend(&out, specials.empty() ? "],\n" : "\n  ],\n", "  \"normalizer\": ",
                  normalizer.dump(), ",\n  \"pre_tokenizer\": ", pre_tokenizer.dump(),
                  ",\n  \"post_processor\": null,\n  \"decoder\": ", decoder.dump(), ",\n");
  absl::StrAppend(&out, "  \"model\": {\n    \"type\": \"BPE\",\n    \"dropout\": null,\n"
                        "    \"unk_token\": null,\n    \"continuing_subword_prefix\": null,\n"
                        "    \"end_of_word_suffix\": null,\n    \"fuse_unk\": false,\n"
                        "    \"byte_fallback\": false,\n    \"ignore_merges\": ",
                  style->ignore_merges ? "true" : "false", ",\n    \"vocab\": {");
  for (size_t id = 0; id < text.size(); ++id) {
    absl::StrAppend(&out, id == 0 ? "\n      " : ",\n      ", Quote(text[id]), ": ", id);
  }
  absl::StrAppend(&out, "\n    },\n    \"merges\": [");
  for (size_t m = 0; m < learner.merges().size(); ++m) {
    const MergeLearner::Merge& merge = learner.merges()[m];
    absl::StrAppend(&out, m == 0 ? "\n      [" : ",\n      [", Quote(text[merge.left]), ", ",
                    Quote(text[merge.right]), "]");
  }
  absl::StrAppend(&out, learner.merges().empty() ? "]\n  }\n}\n" : "\n    ]\n  }\n}\n");

  // What transformers' AutoTokenizer needs beside it: the fast tokenizer class and which
  // special tokens begin and end a document (ReadHfSpecialIds reads the same fields).
  const Json config = {{"bos_token", plan.bos.empty() ? Json(nullptr) : Json(plan.bos)},
                       {"eos_token", plan.eos.empty() ? Json(nullptr) : Json(plan.eos)},
                       {"clean_up_tokenization_spaces", false},
                       {"tokenizer_class", "PreTrainedTokenizerFast"}};
  result.tokenizer_config_json = config.dump(2) + "\n";
  return result;
}

}  // namespace weft::data
