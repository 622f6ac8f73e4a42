// Picking the next token from a model's logits (text generation from a trained model).
#ifndef WEFT_WORKER_DATA_SAMPLER_H_
#define WEFT_WORKER_DATA_SAMPLER_H_

#include <cstdint>

#include "absl/status/status.h"

namespace weft::data {

// Validates generation parameters before any model work, naming the command-line flag that
// carries each one ("--temperature must be >= 0, got -1"):
//  - temperature (--temperature): finite and >= 0 (0 = greedy);
//  - top_k (--top-k): in [0, vocab] (0 = no limit);
//  - tokens (--tokens, how many tokens to generate): >= 1;
//  - vocab (the model's vocabulary size, not a flag): >= 1.
// INVALID_ARGUMENT listing every violation, one per line; OK otherwise.
absl::Status CheckSamplingParams(float temperature, int top_k, int tokens, int vocab);

// Returns the next token in [0, vocab_size) drawn from softmax(logits / temperature) restricted
// to the top_k largest logits.
//  - temperature == 0 or top_k == 1: the argmax (the lowest index among equal maxima).
//  - top_k == 0 or top_k >= vocab_size: every token is a candidate. Candidates are ranked by
//    logit, ties broken by lower index, so which tokens survive a cut is deterministic.
//  - The softmax subtracts the largest candidate logit and accumulates in double, so large or
//    very negative logits neither overflow nor lose the distribution.
//  - Logits may be -inf (masked: never drawn unless all are masked). NaN counts as -inf. If every
//    candidate is -inf, or the largest is +inf, the result is the argmax as above.
// Determinism: the result is a pure function of the arguments and *rng_state, and every call,
// greedy included, advances *rng_state by exactly one splitmix64 step, so the random stream's
// position depends only on how many tokens were sampled, not on the settings used.
// Requires logits[0..vocab_size) readable, vocab_size >= 1, temperature >= 0, top_k >= 0,
// rng_state non-null (use CheckSamplingParams first).
int32_t SampleToken(const float* logits, int vocab_size, float temperature, int top_k,
                    uint64_t* rng_state);

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_SAMPLER_H_
