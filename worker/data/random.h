// Small, fully specified pseudo-random primitives shared by the data pipeline and the sampler.
//
// Why hand-written instead of <random>: the standard engines are specified, but the
// distributions are not (libstdc++ and libc++ give different numbers), and Weft promises that a
// batch or a sampled token is a pure function of its inputs on every platform and after every
// library upgrade. These functions are a few lines each and pinned by tests.
#ifndef WEFT_WORKER_DATA_RANDOM_H_
#define WEFT_WORKER_DATA_RANDOM_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace weft::data {

// The splitmix64 output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer whose
// output bits each depend on every input bit, so nearby inputs give unrelated outputs.
inline uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// The splitmix64 generator: advances `*state` by one step and returns the next output. Any
// state value (0 included) is a valid seed; the period is 2^64.
inline uint64_t SplitMix64Next(uint64_t* state) {
  *state += 0x9E3779B97F4A7C15ULL;
  return Mix64(*state);
}

// Folds `value` into the running hash `h`. Adding the golden-ratio increment before mixing keeps
// (h, 0) from mapping to a fixed point, and the bijective mix keeps every input bit relevant,
// so HashCombine(HashCombine(s, a), b) differs for every (a, b) pair in practice.
inline uint64_t HashCombine(uint64_t h, uint64_t value) {
  return Mix64(h + 0x9E3779B97F4A7C15ULL + value);
}

// A uniform double in [0, 1) from the top 53 bits of one splitmix64 output (53 = the double
// mantissa width, so every value is exactly representable and 1.0 is never returned).
inline double UniformDouble(uint64_t* state) {
  return static_cast<double>(SplitMix64Next(state) >> 11) * 0x1.0p-53;
}

// A bijection of [0, n) chosen by `key`, evaluated one element at a time in O(1) memory, so an
// epoch over billions of sequences needs no shuffled index array: a balanced Feistel network
// over the smallest even number of bits covering n (any round function gives a bijection; a
// keyed 64-bit mix per round makes the order look random), and "cycle walking" (applying it
// again until the value falls inside [0, n)) to shrink that bijection to [0, n). The domain is
// under 4n, so a lookup takes fewer than 4 network passes on average.
class KeyedPermutation {
 public:
  // Requires n >= 1.
  KeyedPermutation(uint64_t n, uint64_t key) : n_(n) {
    const int bits = std::bit_width(n - 1);
    half_bits_ = std::max(1, (bits + 1) / 2);
    mask_ = (uint64_t{1} << half_bits_) - 1;
    for (int r = 0; r < kRounds; ++r) round_keys_[r] = HashCombine(key, r);
  }

  // The image of i; requires i < n. Distinct i give distinct images.
  uint64_t operator()(uint64_t i) const {
    uint64_t x = i;
    do {
      x = Network(x);
    } while (x >= n_);
    return x;
  }

 private:
  static constexpr int kRounds = 6;

  uint64_t Network(uint64_t x) const {
    uint64_t left = x >> half_bits_;
    uint64_t right = x & mask_;
    for (int r = 0; r < kRounds; ++r) {
      const uint64_t next = left ^ (HashCombine(round_keys_[r], right) & mask_);
      left = right;
      right = next;
    }
    return (left << half_bits_) | right;
  }

  uint64_t n_;
  int half_bits_;
  uint64_t mask_;
  uint64_t round_keys_[kRounds];
};

}  // namespace weft::data

#endif  // WEFT_WORKER_DATA_RANDOM_H_
