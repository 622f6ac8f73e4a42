#include "worker/mfu.h"

#include "gtest/gtest.h"

namespace weft::worker {
namespace {

weft::v1::ModelSpec Model(int layers, int width, int vocab, int padded_vocab, int context) {
  weft::v1::ModelSpec m;
  m.set_num_layers(layers);
  m.set_hidden_size(width);
  m.set_num_heads(1);
  m.set_vocab_size(vocab);
  m.set_padded_vocab_size(padded_vocab);
  m.set_context_length(context);
  return m;
}

TEST(MfuTest, FlopsPerTokenOfGpt2Small) {
  // 6 x 124,475,904 parameters + 12 x 12 layers x 768 wide x 1024 context.
  EXPECT_EQ(TrainingFlopsPerToken(Model(12, 768, 50257, 50304, 1024)),
            746'855'424.0 + 113'246'208.0);
}

TEST(MfuTest, FlopsPerTokenOfATinyModelByHand) {
  // 96 parameters (wte 4x2, wpe 5x2, one block 74, final LayerNorm 4): 6 x 96 + 12 x 1 x 2 x 5.
  EXPECT_EQ(TrainingFlopsPerToken(Model(1, 2, 3, 4, 5)), 576.0 + 120.0);
}

// The peer's count (../shared/bench/peer_fsdp_gpt.py --arch llama: 6 x every parameter, embedding
// and untied LM head included, + 12 x layers x width x sequence) for its Llama-3.2-1B-like
// shape: 16 layers, 2048 wide, 32 heads / 8 kv heads, SwiGLU 8192, vocab 128,256, T = 2048.
TEST(MfuTest, FlopsPerTokenOfTheLlama1bBenchShape) {
  weft::v1::ModelSpec m = Model(16, 2048, 128256, 128256, 2048);
  m.set_architecture(weft::v1::LLAMA);
  m.set_num_heads(32);
  m.set_num_kv_heads(8);
  m.set_intermediate_size(8192);
  // 1,498,482,688 parameters: 2 x 128256 x 2048 (embed, lm_head) + 2048 (final norm) + 16 x
  // 60,821,504 (2 norms, qkvw 3072 x 2048, o 2048^2, gate_up and down 3 x 2048 x 8192).
  EXPECT_EQ(TrainingFlopsPerToken(m), 6.0 * 1'498'482'688 + 12.0 * 16 * 2048 * 2048);
}

TEST(MfuTest, ShareOfThePeak) {
  // 100k tokens/s x 860,101,632 FLOPs = 8.60101632e13 FLOP/s of a 989e12 peak.
  EXPECT_NEAR(Mfu(100'000, 860'101'632.0, 989e12), 0.0869668, 1e-7);
  EXPECT_DOUBLE_EQ(Mfu(50, 2e9, 1e12), 0.1);
}

TEST(MfuTest, UnknownPeakGivesZero) {
  EXPECT_EQ(Mfu(100'000, 860'101'632.0, 0), 0);
  EXPECT_EQ(Mfu(100'000, 860'101'632.0, -1), 0);
}

}  // namespace
}  // namespace weft::worker
