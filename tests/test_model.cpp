// The whole model on one rank, both families: gradients against finite differences, and learning.
#include "data.hpp"
#include "make_model.hpp"
#include "model.hpp"
#include "test_util.hpp"
#include "trainer.hpp"

namespace ntp::test {
namespace {

// Every parameter tensor's analytic gradient against central differences of the loss, on a
// small model with fresh random weights and tokens. Llama: 4 query heads over 2 KV heads (GQA);
// moe: Llama with 4 experts of width 24, top 2, a capacity that drops some assignments, and the
// balancing loss (weighted 0.1, so its gradient shows) in the loss differentiated.
class GradientCheck : public ::testing::TestWithParam<std::string> {};

// One tensor's comparison at one point: how many samples kept the routing, and their error.
struct TensorCheck {
  std::string name;
  int compared = 0;
  double error = 0;
};

// The check at one point drawn from rng: random weights (larger than the init, so every path,
// attention included, carries signal) and tokens.
std::vector<TensorCheck> check_point(const ModelConfig& m, std::uint64_t seed, std::mt19937_64& rng) {
  const int B = 2, T = 8, BT = B * T;
  auto be = make_cpu_backend();
  auto self = world_comm()->split(world_comm()->rank(), 0);
  auto model_ptr = make_model(*be, m, TpLayout::even(m, 1), 0, *self, B, T);
  Model& model = *model_ptr;
  model.init_params(seed);
  for (int t = 0; t < model.layout().tensor_count(); ++t) {
    const auto& slot = model.layout().slot(t);
    const auto noise = random_vec(rng, slot.elems, 0.2f);
    for (long k = 0; k < slot.elems; ++k) model.param(t)[k] += noise[k];
  }
  std::vector<int> tokens(BT), targets(BT);
  for (int i = 0; i < BT; ++i) tokens[i] = int(rng() % m.vocab), targets[i] = int(rng() % m.vocab);

  model.zero_grads();
  model.forward(tokens.data(), targets.data(), B);
  model.backward(1.0f / BT);
  // The routing of a forward pass: a difference quotient across a change of it (a top-k choice or a
  // capacity cut flipped by the step) measures a jump, not the gradient, and is not compared.
  model.take_router_stats();
  model.forward(tokens.data(), targets.data(), B);
  const auto routed = model.take_router_stats().choices;
  Model::RouterStats last;
  auto loss = [&] {
    const double ce = model.forward(tokens.data(), targets.data(), B) / BT;
    last = model.take_router_stats();
    return ce + last.aux_loss;
  };

  const float eps = 4e-3f;
  std::vector<TensorCheck> out;
  for (int t = 0; t < model.layout().tensor_count(); ++t) {
    const auto& spec = model.layout().specs()[t];
    const auto& slot = model.layout().slot(t);
    const bool key_bias = spec.name.ends_with("c_attn.bias");
    std::vector<float> analytic, numeric;
    // 12 samples that keep the routing, from at most 36 draws.
    for (int k = 0; k < 36 && numeric.size() < 12; ++k) {
      long i = long(rng() % slot.elems);
      if (key_bias && (i / m.head_size()) % 3 == 1) i -= m.head_size();  // skip the key bias (gradient is zero)
      float* p = model.param(t) + i;
      const float saved = *p;
      *p = saved + eps;
      const double up = loss();
      const bool same_up = last.choices == routed;
      *p = saved - eps;
      const double down = loss();
      const bool same_down = last.choices == routed;
      *p = saved;
      if (!same_up || !same_down) continue;
      numeric.push_back(float((up - down) / (2 * eps)));
      analytic.push_back(model.grad(t)[i]);
    }
    out.push_back({spec.name, int(numeric.size()), rel_l2(numeric, analytic)});
  }
  return out;
}

TEST_P(GradientCheck, GradientsMatchFiniteDifferences) {
  const std::uint64_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ModelConfig m{32, 8, 2, 4, 16};
  if (GetParam() != "gpt2") m.family = Family::Llama, m.kv_heads = 2, m.ffn = 40, m.rope_theta = 100.0f;
  if (GetParam() == "moe") m.experts = 4, m.top_k = 2, m.ffn = 24, m.capacity_factor = 0.75f, m.router_aux_coef = 0.1f;
  std::mt19937_64 rng(seed);
  // A mixture's loss jumps where a routing choice flips. A point drawn next to such a boundary (a
  // near tie of two router logits, which every layer-0 weight moves) leaves a tensor few samples
  // that keep the routing: it is drawn again, at most 4 times. Dense models never jump.
  for (int draw = 0;; ++draw) {
    const std::vector<TensorCheck> checks = check_point(m, seed + draw, rng);
    const bool enough = std::all_of(checks.begin(), checks.end(), [](const TensorCheck& c) { return c.compared >= 8; });
    if (!enough && draw < 4) continue;
    if (GetParam() != "moe") {
      EXPECT_EQ(draw, 0);
    }
    for (const TensorCheck& c : checks) {
      EXPECT_GE(c.compared, 8) << c.name << ": too few samples keep the routing, after " << draw + 1 << " points";
      EXPECT_LT(c.error, 2e-2) << c.name;
    }
    return;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GradientCheck, ::testing::Values("gpt2", "llama", "moe"),
                         [](const auto& info) { return info.param; });

// On the synthetic Markov chain the tiny model's loss falls from ln(V) toward the chain's entropy.
class Learning : public ::testing::TestWithParam<std::string> {};

TEST_P(Learning, TinyModelLearnsTheMarkovChain) {
  Options o;
  o.preset = GetParam();
  o.model = preset(o.preset);
  o.seq = o.model.context;
  o.micro_batch = 8;
  o.seed = shared_seed();
  o.opt.lr = 3e-3f;
  SCOPED_TRACE(::testing::Message() << "seed " << o.seed);
  auto self = world_comm()->split(world_comm()->rank(), 0);
  Trainer t(o, *self, o.micro_batch);
  const double floor = static_cast<const MarkovData&>(t.data()).entropy_rate();
  double first = 0, last10 = 0;
  for (int s = 1; s <= 200; ++s) {
    const double loss = t.step({o.micro_batch}).loss;
    if (s == 1) first = loss;
    if (s > 190) last10 += loss / 10;
  }
  EXPECT_NEAR(first, std::log(double(o.model.vocab)), 0.1);  // starts near uniform
  // Closes at least three quarters of the gap to the entropy floor (and cannot beat the floor by much).
  EXPECT_LT(last10, floor + 0.25 * (first - floor)) << "start " << first << ", floor " << floor;
  EXPECT_GT(last10, floor - 0.1);
}

INSTANTIATE_TEST_SUITE_P(Presets, Learning, ::testing::Values("tiny", "llama-tiny"), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

}  // namespace
}  // namespace ntp::test
