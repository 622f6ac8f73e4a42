#include "worker/data/sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/data/random.h"

namespace weft::data {
namespace {

// NaN compares false with everything, which would make orderings inconsistent; mapping it to
// -inf gives a total order and means a NaN logit is simply never chosen.
inline float Key(float logit) {
  return std::isnan(logit) ? -std::numeric_limits<float>::infinity() : logit;
}

int32_t Argmax(const float* logits, int vocab_size) {
  int32_t best = 0;
  float best_key = Key(logits[0]);
  for (int32_t i = 1; i < vocab_size; ++i) {
    // Strict '>' keeps the lowest index among equal maxima.
    if (Key(logits[i]) > best_key) {
      best = i;
      best_key = Key(logits[i]);
    }
  }
  return best;
}

}  // namespace

absl::Status CheckSamplingParams(float temperature, int top_k, int tokens, int vocab) {
  std::vector<std::string> problems;
  if (std::isnan(temperature) || std::isinf(temperature)) {
    problems.push_back(absl::StrCat("--temperature must be a finite number >= 0, got ",
                                    std::isnan(temperature) ? "nan" : (temperature > 0 ? "inf" : "-inf")));
  } else if (temperature < 0) {
    problems.push_back(absl::StrCat("--temperature must be >= 0, got ", temperature));
  }
  if (vocab < 1) {
    problems.push_back(absl::StrCat("vocabulary size must be >= 1, got ", vocab));
  }
  if (top_k < 0) {
    problems.push_back(absl::StrCat("--top-k must be >= 0 (0 = no limit), got ", top_k));
  } else if (vocab >= 1 && top_k > vocab) {
    problems.push_back(absl::StrCat("--top-k must be <= the vocabulary size ", vocab,
                                    " (0 = no limit), got ", top_k));
  }
  if (tokens < 1) {
    problems.push_back(absl::StrCat("--tokens must be >= 1, got ", tokens));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

int32_t SampleToken(const float* logits, int vocab_size, float temperature, int top_k,
                    uint64_t* rng_state) {
  assert(logits != nullptr && vocab_size >= 1 && rng_state != nullptr);
  assert(temperature >= 0 && top_k >= 0);
  // Drawn before any early return so that every call consumes exactly one step (see header).
  const double u = UniformDouble(rng_state);
  if (temperature == 0.0f || top_k == 1 || vocab_size == 1) return Argmax(logits, vocab_size);

  const int k = (top_k == 0 || top_k >= vocab_size) ? vocab_size : top_k;
  // Candidate indices, best first for the top-k cut. The comparator is a strict total order
  // (logit descending, then index ascending), so the candidate set never depends on the sort
  // algorithm. The full-vocabulary case needs no ordering at all.
  std::vector<int32_t> candidates(static_cast<size_t>(vocab_size));
  std::iota(candidates.begin(), candidates.end(), 0);
  if (k < vocab_size) {
    std::partial_sort(candidates.begin(), candidates.begin() + k, candidates.end(),
                      [logits](int32_t a, int32_t b) {
                        const float ka = Key(logits[a]);
                        const float kb = Key(logits[b]);
                        return ka != kb ? ka > kb : a < b;
                      });
    candidates.resize(static_cast<size_t>(k));
  }

  float max_logit = -std::numeric_limits<float>::infinity();
  for (int32_t i : candidates) max_logit = std::max(max_logit, Key(logits[i]));
  // Degenerate distributions: exp() of (x - max) would be NaN for these.
  if (std::isinf(max_logit)) return Argmax(logits, vocab_size);

  // exp((x - max) / T): the largest term is exactly 1, so the sum is in [1, k] and cannot
  // overflow; double keeps tiny probabilities from vanishing in the sum of a 50k vocabulary.
  const double inv_t = 1.0 / static_cast<double>(temperature);
  std::vector<double> weights(candidates.size());
  double total = 0;
  for (size_t j = 0; j < candidates.size(); ++j) {
    weights[j] = std::exp((static_cast<double>(Key(logits[candidates[j]])) - max_logit) * inv_t);
    total += weights[j];
  }
  // Inverse-CDF draw. The walk is in candidate order, which is fixed for given logits.
  const double target = u * total;
  double cumulative = 0;
  for (size_t j = 0; j < candidates.size(); ++j) {
    cumulative += weights[j];
    if (target < cumulative) return candidates[j];
  }
  // Rounding can leave target a hair above the final cumulative sum: take the last candidate
  // with non-zero weight rather than one with probability zero.
  for (size_t j = candidates.size(); j-- > 0;) {
    if (weights[j] > 0) return candidates[j];
  }
  return Argmax(logits, vocab_size);  // unreachable: the max candidate has weight 1
}

}  // namespace weft::data
