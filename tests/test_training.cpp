// Whole training steps under TP x DP against the one-rank run, and checkpoints across layouts.
// Run under mpiexec -n 8.
#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>

#include "checkpoint.hpp"
#include "h5.hpp"
#include "param_compare.hpp"
#include "test_util.hpp"
#include "trainer.hpp"

namespace ntp::test {
namespace {

constexpr double kTol = 1e-5;

// A tiny model of either family ("tiny" or "llama-tiny").
Options tiny_options(std::uint64_t seed, int tp, int micro_batch, const std::string& name = "tiny") {
  Options o;
  o.preset = name;
  o.model = preset(name);
  o.seq = o.model.context;
  o.tp = tp;
  o.micro_batch = micro_batch;
  o.seed = seed;
  o.opt.lr = 1e-3f;  // large enough that 5 steps move every parameter well past rounding
  // AdamW turns a gradient element at rounding level (|g| ~ 1e-8, so its sign is rounding's) into a
  // step of up to lr / 2 when eps is 1e-8. Llama's untied embedding has such elements (rows of rare
  // tokens): seed 3752244055 moved one element 2.7e-4 apart at TP 3 vs TP 1 after 6 steps (model
  // 1.4e-5 relative; 1.7e-7 with eps 1e-6). eps 1e-6 keeps those steps proportional to the gradient.
  if (o.model.family == Family::Llama) o.opt.eps = 1e-6f;
  return o;
}

std::unique_ptr<Comm> self_comm() {
  auto world = world_comm();
  return world->split(world->rank(), 0);
}

// Runs `steps` steps with every replica at o.micro_batch; returns the losses.
std::vector<double> train(Trainer& t, int steps) {
  std::vector<double> losses;
  for (int s = 0; s < steps; ++s)
    losses.push_back(t.step(std::vector<int>(t.topology().replicas, t.model().max_batch())).loss);
  return losses;
}

std::vector<std::vector<float>> canonical_params(Model& m) {
  std::vector<std::vector<float>> p;
  for (int t = 0; t < m.layout().tensor_count(); ++t) p.emplace_back(m.param(t), m.param(t) + m.layout().slot(t).elems);
  return p;
}

std::string tmp_path(const std::string& name, std::uint64_t seed) {
  return (std::filesystem::temp_directory_path() / ("ntpbench-test-" + std::to_string(seed) + "-" + name)).string();
}

// (preset, TP, DP). llama-tiny has 8 query heads in 4 KV groups: TP 3 splits the groups 2+1+1.
class WholeSteps : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(WholeSteps, MatchOneRank) {
  const auto [name, tp, dp] = GetParam();
  if (tp * dp > world_size()) GTEST_SKIP() << "needs " << tp * dp << " ranks";
  const std::uint64_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << name << " TP " << tp << " DP " << dp);
  const int B = 2, steps = 5;

  // The reference: one rank, TP 1, DP 1, the whole global batch.
  auto self = self_comm();
  Trainer ref(tiny_options(seed, 1, B * dp, name), *self, B * dp);
  auto ref_losses = train(ref, 1);
  const std::string ref_first_step = tmp_path("ref-step1-rank" + std::to_string(world_comm()->rank()) + ".h5", seed);
  ref.save_checkpoint(ref_first_step);
  const auto ref_rest = train(ref, steps - 1);
  ref_losses.insert(ref_losses.end(), ref_rest.begin(), ref_rest.end());
  struct Cleanup {
    std::string p;
    ~Cleanup() { std::filesystem::remove(p); }
  } cleanup{ref_first_step};

  auto group = first_ranks(tp * dp);
  if (!group) return;
  Trainer run(tiny_options(seed, tp, B, name), *group, B);
  const std::string path = tmp_path("steps-tp" + std::to_string(tp) + "-dp" + std::to_string(dp) + ".h5", seed);
  const ModelConfig& m = ref.model().layout().model();

  // Step 1's gradient, every tensor, before AdamW can amplify rounding: AdamW's first moment
  // after one step is 0.1 x the clipped gradient. Gathered to full tensors through a checkpoint.
  auto losses = train(run, 1);
  run.save_checkpoint(path);
  const ParamDiff grad_diff = compare_params(m, read_checkpoint_params(path, m, "optimizer/m/"),
                                             read_checkpoint_params(ref_first_step, m, "optimizer/m/"), 1e-6);
  EXPECT_TRUE(grad_diff.within(kTol, kTol)) << "step-1 gradients: " << grad_diff.describe();

  // Losses of every step, and every parameter after the last.
  const auto rest = train(run, steps - 1);
  losses.insert(losses.end(), rest.begin(), rest.end());
  for (int s = 0; s < steps; ++s)
    EXPECT_NEAR(losses[s], ref_losses[s], kTol * std::fabs(ref_losses[s])) << "step " << s + 1;
  run.save_checkpoint(path);
  const ParamDiff diff = compare_params(m, read_checkpoint_params(path, m), canonical_params(ref.model()),
                                        key_bias_bound(1e-3, steps));
  EXPECT_TRUE(diff.within(kTol)) << "parameters after " << steps << " steps: " << diff.describe();
  if (group->rank() == 0)
    std::printf("[ measured ] %s TP %d DP %d: step-1 gradients %s\n[ measured ] %s TP %d DP %d: parameters after %d "
                "steps %s\n",
                name.c_str(), tp, dp, grad_diff.describe().c_str(), name.c_str(), tp, dp, steps,
                diff.describe().c_str());
  group->barrier();
  if (group->rank() == 0) std::filesystem::remove(path);
}

// "llama_tiny_tp2<sep>1" for (llama-tiny, 2, 1).
std::string case_name(const std::tuple<std::string, int, int>& p, const char* sep) {
  std::string n = std::get<0>(p);
  std::replace(n.begin(), n.end(), '-', '_');
  return n + "_tp" + std::to_string(std::get<1>(p)) + sep + std::to_string(std::get<2>(p));
}

INSTANTIATE_TEST_SUITE_P(TpDp, WholeSteps,
                         ::testing::Combine(::testing::Values("tiny", "llama-tiny"), ::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return case_name(info.param, "_dp");
                         });

// (preset, TP saved at, TP resumed at): save after 3 steps, resume for 3 more: the same as 6 steps
// on one rank.
class Resume : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {};

TEST_P(Resume, AtAnotherLayout) {
  const auto [name, tp_a, tp_b] = GetParam();
  if (world_size() < std::max(tp_a, tp_b)) GTEST_SKIP() << "needs " << std::max(tp_a, tp_b) << " ranks";
  const std::uint64_t seed = shared_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << name << " TP " << tp_a << " -> " << tp_b);
  const int B = 2, k = 3;
  auto self = self_comm();
  Trainer ref(tiny_options(seed, 1, B, name), *self, B);
  const auto ref_losses = train(ref, 2 * k);

  const std::string mid = tmp_path("resume-mid.h5", seed), end = tmp_path("resume-end.h5", seed);
  if (auto ga = first_ranks(tp_a)) {
    Trainer a(tiny_options(seed, tp_a, B, name), *ga, B);
    train(a, k);
    a.save_checkpoint(mid);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (auto gb = first_ranks(tp_b)) {
    Trainer b(tiny_options(seed, tp_b, B, name), *gb, B);
    b.load_checkpoint(mid, false);
    EXPECT_EQ(b.steps_taken(), k);
    EXPECT_EQ(b.cursor(), k * B);
    const auto losses = train(b, k);
    for (int s = 0; s < k; ++s)
      EXPECT_NEAR(losses[s], ref_losses[k + s], kTol * ref_losses[k + s]) << "step " << k + s + 1;
    b.save_checkpoint(end);
    const auto got = read_checkpoint_params(end, b.model().layout().model());
    const ParamDiff diff = compare_params(ref.model().layout().model(), got, canonical_params(ref.model()),
                                          key_bias_bound(1e-3, 2 * k));
    EXPECT_TRUE(diff.within(kTol)) << diff.describe();
    if (gb->rank() == 0)
      std::printf("[ measured ] %s TP %d -> %d: parameters after %d steps %s\n", name.c_str(), tp_a, tp_b, 2 * k,
                  diff.describe().c_str());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_comm()->rank() == 0) std::filesystem::remove(mid), std::filesystem::remove(end);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, Resume,
                         ::testing::Values(std::tuple{"tiny", 2, 3}, std::tuple{"llama-tiny", 2, 1},
                                           std::tuple{"llama-tiny", 2, 3}),
                         [](const auto& info) {
                           return case_name(info.param, "_to_tp");
                         });

// A GPT-2 checkpoint is refused by a Llama run, naming both families.
TEST(Checkpoint, RefusesTheOtherFamily) {
  const std::uint64_t seed = shared_seed();
  auto self = self_comm();
  const std::string path = tmp_path("family-" + std::to_string(world_comm()->rank()) + ".h5", seed);
  {
    Trainer gpt(tiny_options(seed, 1, 1), *self, 1);
    gpt.save_checkpoint(path);
  }
  Trainer llama(tiny_options(seed, 1, 1, "llama-tiny"), *self, 1);
  try {
    llama.load_checkpoint(path, false);
    ADD_FAILURE() << "a GPT-2 checkpoint loaded into a Llama model";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("holds a gpt2 model, but this run trains a llama model"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

// The Llama file speaks Hugging Face Llama: names, [out, in] nn.Linear shapes, GQA's smaller k/v.
TEST(Checkpoint, LlamaUsesHuggingFaceNamesAndShapes) {
  const std::uint64_t seed = shared_seed();
  auto self = self_comm();
  Trainer t(tiny_options(seed, 1, 1, "llama-tiny"), *self, 1);
  const std::string path = tmp_path("hf-llama-" + std::to_string(world_comm()->rank()) + ".h5", seed);
  t.save_checkpoint(path);
  const ModelConfig m = t.model().layout().model();
  const long d = m.hidden, hs = m.head_size(), q = m.heads * hs, kv = m.kv() * hs, f = m.mlp();
  ASSERT_LT(kv, q) << "llama-tiny should have fewer KV heads than query heads";
  h5::File file(path, h5::Mode::ReadOnly);
  const hid_t id = file.id();
  EXPECT_EQ(h5::get_attr_string(id, "/", "model"), "llama");
  EXPECT_EQ(h5::shape_of(id, "model.embed_tokens.weight"), (std::vector<long>{m.vocab, d}));
  EXPECT_EQ(h5::shape_of(id, "lm_head.weight"), (std::vector<long>{m.vocab, d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.1.self_attn.q_proj.weight"), (std::vector<long>{q, d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.1.self_attn.k_proj.weight"), (std::vector<long>{kv, d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.1.self_attn.v_proj.weight"), (std::vector<long>{kv, d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.0.self_attn.o_proj.weight"), (std::vector<long>{d, q}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.0.mlp.gate_proj.weight"), (std::vector<long>{f, d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.0.mlp.up_proj.weight"), (std::vector<long>{f, d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.0.mlp.down_proj.weight"), (std::vector<long>{d, f}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.0.input_layernorm.weight"), (std::vector<long>{d}));
  EXPECT_EQ(h5::shape_of(id, "model.layers.0.post_attention_layernorm.weight"), (std::vector<long>{d}));
  EXPECT_EQ(h5::shape_of(id, "optimizer/m/model.norm.weight"), (std::vector<long>{d}));
  EXPECT_FALSE(h5::exists(id, "wpe"));
  // o_proj: canonical [in, out] (a KV group's rows together), HF [out, in].
  const auto o = h5::read_floats(id, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(o[7 * q + 11], t.model().param(llama_tensor(0, kO))[11 * d + 7]);
  // down_proj likewise; q_proj as stored.
  const auto down = h5::read_floats(id, "model.layers.1.mlp.down_proj.weight");
  EXPECT_EQ(down[5 * f + 3], t.model().param(llama_tensor(1, kDown))[3 * d + 5]);
  const auto qp = h5::read_floats(id, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(qp[9 * d + 2], t.model().param(llama_tensor(1, kQ))[9 * d + 2]);
  std::filesystem::remove(path);
}

// The file speaks Hugging Face GPT-2: names, [in, out] Conv1D shapes, q|k|v blocks of c_attn.
TEST(Checkpoint, UsesHuggingFaceNamesAndShapes) {
  const std::uint64_t seed = shared_seed();
  auto self = self_comm();
  Trainer t(tiny_options(seed, 1, 1), *self, 1);
  const std::string path = tmp_path("hf-" + std::to_string(world_comm()->rank()) + ".h5", seed);
  t.save_checkpoint(path);
  const ModelConfig m = t.model().layout().model();
  const long d = m.hidden, hs = m.head_size();
  h5::File f(path, h5::Mode::ReadOnly);
  EXPECT_EQ(h5::shape_of(f.id(), "wte"), (std::vector<long>{m.vocab, d}));
  EXPECT_EQ(h5::shape_of(f.id(), "h.0.attn.c_attn.weight"), (std::vector<long>{d, 3 * d}));
  EXPECT_EQ(h5::shape_of(f.id(), "h.1.mlp.c_fc.weight"), (std::vector<long>{d, 4 * d}));
  EXPECT_EQ(h5::shape_of(f.id(), "h.1.mlp.c_proj.weight"), (std::vector<long>{4 * d, d}));
  EXPECT_EQ(h5::shape_of(f.id(), "optimizer/v/ln_f.bias"), (std::vector<long>{d}));
  EXPECT_EQ(h5::get_attr_int(f.id(), "/", "step"), 0);
  // Head 1's key row 2, input feature 5: canonical ((1*3+1)*hs + 2)*d + 5, HF [5, d + 1*hs + 2].
  const auto hf = h5::read_floats(f.id(), "h.0.attn.c_attn.weight");
  const float* canon = t.model().param(layer_tensor(0, kQkvW));
  EXPECT_EQ(hf[5 * 3 * d + d + hs + 2], canon[((1 * 3 + 1) * hs + 2) * d + 5]);
  // c_fc: canonical [out, in], HF [in, out].
  const auto fc = h5::read_floats(f.id(), "h.0.mlp.c_fc.weight");
  EXPECT_EQ(fc[7 * 4 * d + 11], t.model().param(layer_tensor(0, kFcW))[11 * d + 7]);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ntp::test
