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
