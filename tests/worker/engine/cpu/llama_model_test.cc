// Whole-model tests of the Llama CPU engine: the loss and logits against an independent
// position-by-position reference written from the definitions (Hugging Face's
// LlamaForCausalLM, eager attention), the gradient of every unit against finite differences of
// the full loss (tied and untied head, grouped-query attention, llama3 rotary scaling), the
// fp32 engine against the double one, causality for sampling, the registry, and an overfitting
// sanity run.
#include "worker/engine/cpu/llama_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "tests/worker/engine/model_test_util.h"
#include "worker/engine/adamw.h"

namespace weft::engine {
namespace {

// A tiny Llama: 2 layers, C = 16, 4 query heads sharing 2 kv heads (D = 4), SwiGLU 12,
// V = 11 padded to 16, context 6, micro-batch (2, 5).
LlamaConfig TinyConfig(bool tied, bool llama3) {
  // rope_theta 100: fast rotations, so every position's angle matters at T = 5.
  return LlamaConfig{.num_layers = 2,
                     .hidden_size = 16,
                     .num_heads = 4,
                     .num_kv_heads = 2,
                     .intermediate_size = 12,
                     .vocab_size = 11,
                     .padded_vocab_size = 16,
                     .context_length = 6,
                     .rope_theta = 100.0,
                     .rope_llama3 = llama3,
                     .rope_factor = 4,
                     .rope_low_freq_factor = 1,
                     .rope_high_freq_factor = 2,
                     .rope_original_context_length = 8,
                     .rms_norm_eps = 1e-5,
                     .tie_word_embeddings = tied};
}

constexpr int kB = 2;
constexpr int kT = 5;
// Token 3 appears at several positions and is also a target, so with a tied head its embed row
// gets gradient from both the encoder and the LM head.
const std::vector<int32_t> kTokens = {3, 7, 3, 0, 10, 5, 3, 9, 1, 3};
const std::vector<int32_t> kTargets = {7, 3, 0, 10, 3, 3, 9, 1, 3, 2};

// ---- an independent reference, one position at a time, straight from the definitions ----

using Vec = std::vector<double>;

Vec RmsNorm(const Vec& x, const double* w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1 / std::sqrt(ss / x.size() + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w[i] * x[i] * r;
  return y;
}

// y = W x for W (rows, x.size()) row-major.
Vec Linear(const double* w, const Vec& x, int rows) {
  Vec y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (size_t i = 0; i < x.size(); ++i) y[r] += w[r * x.size() + i] * x[i];
  }
  return y;
}

// Rotates one head (D values at `x`) for position `pos`: pairs (i, i + D/2).
void Rotate(double* x, int d, int pos, const Vec& inv_freq) {
  for (int i = 0; i < d / 2; ++i) {
    const double a = x[i], b = x[i + d / 2], angle = pos * inv_freq[i];
    x[i] = a * std::cos(angle) - b * std::sin(angle);
    x[i + d / 2] = b * std::cos(angle) + a * std::sin(angle);
  }
}

// Causal GQA over one sequence: q (T, NH*D), k and v (T, NKV*D) -> (T, NH*D).
std::vector<Vec> Attend(const LlamaConfig& c, const std::vector<Vec>& q, const std::vector<Vec>& k,
                        const std::vector<Vec>& v) {
  const int d = c.head_size(), t = static_cast<int>(q.size());
  std::vector<Vec> y(t, Vec(c.q_width(), 0.0));
  for (int pos = 0; pos < t; ++pos) {
    for (int h = 0; h < c.num_heads; ++h) {
      const int g = h / (c.num_heads / c.num_kv_heads);
      Vec s(pos + 1);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= pos; ++j) {
        s[j] = 0;
        for (int i = 0; i < d; ++i) s[j] += q[pos][h * d + i] * k[j][g * d + i];
        s[j] /= std::sqrt(static_cast<double>(d));
        mx = std::max(mx, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int j = 0; j <= pos; ++j) {
        for (int i = 0; i < d; ++i) y[pos][h * d + i] += s[j] / sum * v[j][g * d + i];
      }
    }
  }
  return y;
}

// One block on one sequence's residual stream x (T, C), in place.
void ReferenceBlock(const LlamaConfig& c, const double* w, const Vec& inv_freq,
                    std::vector<Vec>* x) {
  const LlamaArch arch(c);
  const std::vector<TensorInfo> t = arch.UnitTensors(1);
  const int d = c.head_size(), q_w = c.q_width(), kv_w = c.kv_width(), inter = c.intermediate_size;
  std::vector<Vec> q, k, v;
  for (int pos = 0; pos < static_cast<int>(x->size()); ++pos) {
    const Vec qkv =
        Linear(w + t[kLlamaQkvw].offset,
               RmsNorm((*x)[pos], w + t[kLlamaAttnNorm].offset, c.rms_norm_eps), c.qkv_width());
    q.emplace_back(qkv.begin(), qkv.begin() + q_w);
    k.emplace_back(qkv.begin() + q_w, qkv.begin() + q_w + kv_w);
    v.emplace_back(qkv.begin() + q_w + kv_w, qkv.end());
    for (int h = 0; h < c.num_heads; ++h) Rotate(q.back().data() + h * d, d, pos, inv_freq);
    for (int h = 0; h < c.num_kv_heads; ++h) Rotate(k.back().data() + h * d, d, pos, inv_freq);
  }
  const std::vector<Vec> y = Attend(c, q, k, v);
  for (size_t pos = 0; pos < x->size(); ++pos) {
    Vec& r = (*x)[pos];
    const Vec o = Linear(w + t[kLlamaAttnOut].offset, y[pos], c.hidden_size);
    for (int i = 0; i < c.hidden_size; ++i) r[i] += o[i];
    const Vec gu = Linear(w + t[kLlamaGateUp].offset,
                          RmsNorm(r, w + t[kLlamaMlpNorm].offset, c.rms_norm_eps), 2 * inter);
    Vec hidden(inter);
    for (int i = 0; i < inter; ++i) hidden[i] = gu[i] / (1 + std::exp(-gu[i])) * gu[inter + i];
    const Vec down = Linear(w + t[kLlamaDown].offset, hidden, c.hidden_size);
    for (int i = 0; i < c.hidden_size; ++i) r[i] += down[i];
  }
}

// Mean cross-entropy over the (B, T) positions; `logits` gets (B*T, V) when given.
double ReferenceLoss(const LlamaConfig& c, const Units& p, std::vector<Vec>* logits) {
  const LlamaArch arch(c);
  const std::vector<TensorInfo> head = arch.UnitTensors(0);
  const Vec inv_freq = RopeInverseFrequencies(c);
  const double* lm_head =
      p[0].data() + head[c.tie_word_embeddings ? kLlamaEmbed : kLlamaLmHead].offset;
  double loss = 0;
  for (int b = 0; b < kB; ++b) {
    std::vector<Vec> x;
    for (int pos = 0; pos < kT; ++pos) {
      const double* row =
          p[0].data() + head[kLlamaEmbed].offset + kTokens[b * kT + pos] * c.hidden_size;
      x.emplace_back(row, row + c.hidden_size);
    }
    for (int l = 0; l < c.num_layers; ++l) ReferenceBlock(c, p[1 + l].data(), inv_freq, &x);
    for (int pos = 0; pos < kT; ++pos) {
      const Vec z =
          Linear(lm_head, RmsNorm(x[pos], p[0].data() + head[kLlamaNorm].offset, c.rms_norm_eps),
                 c.vocab_size);
      double mx = -1e300, sum = 0;
      for (double v : z) mx = std::max(mx, v);
      for (double v : z) sum += std::exp(v - mx);
      loss += std::log(sum) + mx - z[kTargets[b * kT + pos]];
      if (logits) logits->push_back(z);
    }
  }
  return loss / (kB * kT);
}

class LlamaModelTest : public ::testing::TestWithParam<bool> {};  // tied head or not

TEST_P(LlamaModelTest, LossAndLogitsMatchAPositionByPositionReference) {
  for (bool llama3 : {false, true}) {
    const LlamaConfig config = TinyConfig(GetParam(), llama3);
    const Units params = RandomParams(LlamaArch(config), 1);
    std::vector<Vec> expected_logits;
    const double expected = ReferenceLoss(config, params, &expected_logits);
    cpu::LlamaModel<double> model(config, kB, kT, Checkpointing::kNone);
    EXPECT_NEAR(Forward(model, params, kTokens, kTargets, 1.0), expected, 1e-12 * expected);
    const std::vector<double> logits =
        InferenceLogits(model, params, kTokens.data(), kB, kT, config.padded_vocab_size);
    for (int i = 0; i < kB * kT; ++i) {
      for (int j = 0; j < config.vocab_size; ++j) {
        EXPECT_NEAR(logits[i * config.padded_vocab_size + j], expected_logits[i][j],
                    1e-12 * std::max(1.0, std::abs(expected_logits[i][j])))
            << "position " << i << " token " << j << (llama3 ? " (llama3 rope)" : "");
      }
    }
  }
}

// Every coordinate of every unit, in double, against central differences of the full loss
// (loss_scale * mean cross-entropy): h = 1e-5, |analytic - numeric| <= 1e-7 max(1e-2, |numeric|).
TEST_P(LlamaModelTest, EveryUnitMatchesFiniteDifferencesInDouble) {
  const bool tied = GetParam();
  const LlamaConfig config = TinyConfig(tied, /*llama3=*/!tied);
  const LlamaArch arch(config);
  const double loss_scale = 0.5;
  const Units params = RandomParams(arch, 2);
  cpu::LlamaModel<double> model(config, kB, kT, Checkpointing::kNone);
  Units grads = ZerosLike(params);
  ForwardBackward(model, params, kTokens, kTargets, loss_scale, &grads);

  Units x = params;
  auto objective = [&] { return loss_scale * Forward(model, x, kTokens, kTargets, loss_scale); };
  const double worst = ExpectGradientsMatchFiniteDifferences(arch, grads, &x, objective);
  RecordProperty("worst_relative_error", Sci(worst));

  // Vocabulary padding rows get exactly nothing, from the encoder or the LM head.
  const std::vector<TensorInfo> head = arch.UnitTensors(0);
  for (const TensorInfo& info : head) {
    if (info.live_size == info.size) continue;
    for (size_t i = info.live_size; i < info.size; ++i) {
      ASSERT_EQ(grads[0][info.offset + i], 0.0) << info.name << " padding";
    }
  }
  // A token never seen as input: its embed row moves only through a tied LM head.
  const int c = config.hidden_size;
  double unseen = 0;
  for (int i = 0; i < c; ++i) unseen += std::abs(grads[0][head[kLlamaEmbed].offset + 2 * c + i]);
  if (tied) {
    EXPECT_GT(unseen, 0.0);
  } else {
    EXPECT_EQ(unseen, 0.0);
  }
}

// The fp32 engine (LlamaCpu) against the double model on the same (float-rounded) parameters:
// the loss to 1e-5 relative, every gradient within 2e-5 of the largest gradient of its unit.
TEST_P(LlamaModelTest, FloatEngineMatchesDouble) {
  const LlamaConfig config = TinyConfig(GetParam(), true);
  const std::vector<std::vector<float>> params =
      CastUnits<float>(RandomParams(LlamaArch(config), 3));
  LlamaCpu model(config, kB, kT, Checkpointing::kNone);
  std::vector<std::vector<float>> grads = ZerosLike(params);
  const double loss = ForwardBackward(model, params, kTokens, kTargets, 0.5f, &grads);

  const Units exact_params = CastUnits<double>(params);
  cpu::LlamaModel<double> reference(config, kB, kT, Checkpointing::kNone);
  Units grads_d = ZerosLike(exact_params);
  const double loss_d = ForwardBackward(reference, exact_params, kTokens, kTargets, 0.5, &grads_d);
  EXPECT_NEAR(loss, loss_d, 1e-5 * loss_d);
  ExpectUnitsNear(grads, grads_d, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Head, LlamaModelTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

// Sampling runs B = 1 with a growing T on a model sized for training: a prefix must give the
// same logits as the full sequence (causality; rotary angles depend on the position only).
TEST(LlamaCpuTest, ShorterShapeGivesPrefixLogits) {
  const LlamaConfig config = TinyConfig(false, true);
  const std::vector<std::vector<float>> params =
      CastUnits<float>(RandomParams(LlamaArch(config), 4));
  LlamaCpu model(config, kB, kT, Checkpointing::kNone);
  ExpectPrefixLogitsMatch(model, params, kTokens, kB, kT, 3, config.padded_vocab_size);
}

TEST(LlamaCpuTest, RegistryBuildsLlamaCpuFromASpec) {
  weft::v1::ModelSpec spec;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "architecture: LLAMA num_layers: 2 hidden_size: 16 num_heads: 4 num_kv_heads: 2 "
      "intermediate_size: 12 vocab_size: 11 context_length: 6",
      &spec));
  auto arch = MakeModelArch(spec);
  ASSERT_TRUE(arch.ok()) << arch.status();
  auto made = cpu::CreateCpuModel(**arch, kB, kT, Checkpointing::kNone);
  ASSERT_TRUE(made.ok()) << made.status();
  const std::unique_ptr<cpu::CpuModel> model = *std::move(made);
  const auto* llama = dynamic_cast<const LlamaCpu*>(model.get());
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->config().num_kv_heads, 2);
  EXPECT_EQ(llama->config().padded_vocab_size, 128);
}

TEST(LlamaCpuDeathTest, CallsOutOfOrderAbort) {
  // OpenBLAS has worker threads: re-execute the test binary instead of forking it as is.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const LlamaConfig config = TinyConfig(true, false);
  const std::vector<std::vector<float>> params =
      CastUnits<float>(RandomParams(LlamaArch(config), 5));
  LlamaCpu model(config, kB, kT, Checkpointing::kNone);
  model.EncoderForward(params[0].data(), kTokens.data());
  EXPECT_DEATH(model.BlockForward(1, params[2].data()), "LlamaModel: BlockForward out of order");
  EXPECT_DEATH(model.ClassifierBackward(params[0].data(), nullptr), "needs a training");
  std::vector<int32_t> bad = kTokens;
  bad[3] = config.vocab_size;
  EXPECT_DEATH(model.EncoderForward(params[0].data(), bad.data()), "token outside");
}

TEST(LlamaCpuTest, LossFallsWhenOverfittingOneBatch) {
  weft::v1::JobSpec spec;
  spec.mutable_optimizer()->set_learning_rate(1e-2);
  spec.mutable_training()->set_total_steps(40);
  spec.mutable_lr_schedule()->set_kind(weft::v1::LrSchedule::CONSTANT);
  LlamaConfig config = TinyConfig(false, false);
  config.vocab_size = 64;
  config.padded_vocab_size = 64;
  config.context_length = 16;
  const LlamaArch arch(config);
  const int b = 4, t = 16;
  std::mt19937_64 rng(13);
  std::vector<int32_t> tokens(b * t), targets(b * t);
  for (auto& x : tokens) x = std::uniform_int_distribution<int32_t>(0, 63)(rng);
  for (auto& x : targets) x = std::uniform_int_distribution<int32_t>(0, 63)(rng);

  const int units = arch.NumUnits();
  std::vector<std::vector<float>> params(units), m(units), v(units);
  std::vector<std::vector<uint8_t>> masks(units);
  for (int u = 0; u < units; ++u) {
    params[u].resize(arch.UnitSize(u));
    arch.InitUnit(u, 99, params[u].data());
    m[u].assign(params[u].size(), 0.0f);
    v[u].assign(params[u].size(), 0.0f);
    masks[u].resize(params[u].size());
    arch.UnitDecayMask(u, masks[u].data());
  }
  LlamaCpu model(config, b, t, Checkpointing::kNone);
  std::vector<float> losses;
  for (int step = 0; step < 40; ++step) {
    std::vector<std::vector<float>> grads = ZerosLike(params);
    losses.push_back(ForwardBackward(model, params, tokens, targets, 1.0f, &grads));
    const AdamWConfig adamw = AdamWConfigFromSpec(spec.optimizer(), LearningRate(spec, step));
    for (int u = 0; u < units; ++u) {
      AdamWUpdate(params[u].data(), grads[u].data(), m[u].data(), v[u].data(), masks[u].data(),
                  params[u].size(), adamw, step + 1, 1.0f);
    }
  }
  EXPECT_NEAR(losses.front(), std::log(64.0), 0.05);
  EXPECT_LT(losses.back(), 0.5 * losses.front());
  RecordProperty("final_loss", Sci(losses.back()));
}

}  // namespace
}  // namespace weft::engine
