// Every tensor-parallel layer at TP 1..4, with even and with scattered uneven shard maps, against
// the same layer run unsharded on one rank, on fresh random inputs. Run under mpiexec -n 4.
#include <memory>

#include "backend.hpp"
#include "make_model.hpp"
#include "model.hpp"
#include "ntp_layout.hpp"
#include "test_util.hpp"
#include "tp_layers.hpp"

namespace ntp::test {
namespace {

constexpr double kTol = 1e-5;

// Columns [u*w, (u+1)*w) of every row of a [rows, units*w] matrix, for the given units.
std::vector<float> take_cols(const std::vector<float>& full, int rows, int units_total, long w,
                             const std::vector<int>& units) {
  std::vector<float> out;
  for (int r = 0; r < rows; ++r)
    for (int u : units) {
      const auto* row = full.data() + long(r) * units_total * w;
      out.insert(out.end(), row + u * w, row + (u + 1) * w);
    }
  return out;
}

struct Groups {
  std::unique_ptr<Comm> self;  // this rank alone: the unsharded reference
  std::unique_ptr<Comm> tp;    // the first `tp` ranks, or null
};

Groups groups(int tp) {
  auto world = world_comm();
  Groups g;
  g.self = world->split(world->rank(), 0);
  g.tp = first_ranks(tp);
  return g;
}

// The shard maps a test runs against at degree tp: Megatron's even split and a scattered one.
std::vector<ShardMap> maps_for(std::mt19937_64& rng, int units, int tp) {
  return {ShardMap::even(units, tp), random_map(rng, units, tp)};
}

class TpLayers : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (GetParam() > world_size()) GTEST_SKIP() << "needs " << GetParam() << " ranks";
    seed_ = shared_seed();
    rng_.seed(seed_ + GetParam());
  }
  std::uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::unique_ptr<Backend> be_ = make_cpu_backend();
};

TEST_P(TpLayers, ColumnParallelLinear) {
  const int tp = GetParam(), BT = 6, C = 20, OC = 22;  // 22 columns: uneven at TP 3 and 4
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " tp " << tp);
  const auto W = random_vec(rng_, std::size_t(OC) * C), b = random_vec(rng_, OC), x = random_vec(rng_, BT * C);
  const auto dout = random_vec(rng_, std::size_t(BT) * OC);
  const auto maps = maps_for(rng_, OC, tp);
  Groups g = groups(tp);
  const TpContext ref{*be_, *g.self};
  std::vector<float> out(BT * OC), dx(BT * C), dW(OC * C, 0.f), db(OC, 0.f);
  column_parallel_forward(ref, out.data(), x.data(), W.data(), b.data(), BT, C, OC);
  column_parallel_backward(ref, dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), BT, C, OC);
  if (!g.tp) return;
  for (const auto& map : maps) {
    const auto& units = map.units_of(g.tp->rank());
    const int OCl = static_cast<int>(units.size());
    const TpContext ctx{*be_, *g.tp};
    const auto Wl = take_units(W, units, C), bl = take_units(b, units, 1);
    const auto doutl = take_cols(dout, BT, OC, 1, units);
    std::vector<float> outl(BT * OCl), dxl(BT * C), dWl(OCl * C, 0.f), dbl(OCl, 0.f);
    column_parallel_forward(ctx, outl.data(), x.data(), Wl.data(), bl.data(), BT, C, OCl);
    column_parallel_backward(ctx, dxl.data(), dWl.data(), dbl.data(), doutl.data(), x.data(), Wl.data(), BT, C, OCl);
    EXPECT_LT(rel_l2(outl, take_cols(out, BT, OC, 1, units)), kTol);
    EXPECT_LT(rel_l2(dxl, dx), kTol);
    EXPECT_LT(rel_l2(dWl, take_units(dW, units, C)), kTol);
    EXPECT_LT(rel_l2(dbl, take_units(db, units, 1)), kTol);
  }
}

TEST_P(TpLayers, RowParallelLinear) {
  const int tp = GetParam(), BT = 5, C = 26, OC = 12;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " tp " << tp);
  const auto W = random_vec(rng_, std::size_t(C) * OC), b = random_vec(rng_, OC), x = random_vec(rng_, BT * C);
  const auto dout = random_vec(rng_, std::size_t(BT) * OC);
  const auto maps = maps_for(rng_, C, tp);
  Groups g = groups(tp);
  const TpContext ref{*be_, *g.self};
  std::vector<float> out(BT * OC), dx(BT * C), dW(C * OC, 0.f), db(OC, 0.f);
  row_parallel_forward(ref, out.data(), x.data(), W.data(), b.data(), BT, C, OC);
  row_parallel_backward(ref, dx.data(), dW.data(), db.data(), dout.data(), x.data(), W.data(), BT, C, OC);
  if (!g.tp) return;
  for (const auto& map : maps) {
    const auto& units = map.units_of(g.tp->rank());
    const int Cl = static_cast<int>(units.size());
    const TpContext ctx{*be_, *g.tp};
    const auto Wl = take_units(W, units, OC), xl = take_cols(x, BT, C, 1, units);
    std::vector<float> outl(BT * OC), dxl(BT * Cl), dWl(Cl * OC, 0.f), dbl(OC, 0.f);
    row_parallel_forward(ctx, outl.data(), xl.data(), Wl.data(), b.data(), BT, Cl, OC);
    row_parallel_backward(ctx, dxl.data(), dWl.data(), dbl.data(), dout.data(), xl.data(), Wl.data(), BT, Cl, OC);
    EXPECT_LT(rel_l2(outl, out), kTol);
    EXPECT_LT(rel_l2(dxl, take_cols(dx, BT, C, 1, units)), kTol);
    EXPECT_LT(rel_l2(dWl, take_units(dW, units, OC)), kTol);
    EXPECT_LT(rel_l2(dbl, db), kTol);
  }
}

// The attention block split by heads: column-parallel QKV (a head's q, k and v rows together),
// local causal attention, row-parallel output projection.
TEST_P(TpLayers, AttentionByHeads) {
  const int tp = GetParam(), B = 2, T = 7, H = 5, hs = 4, d = H * hs, BT = B * T;  // 5 heads: uneven
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " tp " << tp);
  const auto Wqkv = random_vec(rng_, std::size_t(3) * d * d, 0.3f), bqkv = random_vec(rng_, 3 * d, 0.1f);
  const auto Wo = random_vec(rng_, std::size_t(d) * d, 0.3f), bo = random_vec(rng_, d);
  const auto x = random_vec(rng_, BT * d), dout = random_vec(rng_, BT * d);
  const auto maps = maps_for(rng_, H, tp);
  Groups g = groups(tp);

  struct Result {
    std::vector<float> out, dx, dWqkv, dbqkv, dWo, dbo;
  };
  auto run = [&](const TpContext& ctx, const std::vector<int>& heads) {
    const int Hl = static_cast<int>(heads.size()), dl = Hl * hs;
    const auto Wq = take_units(Wqkv, heads, 3L * hs * d), bq = take_units(bqkv, heads, 3L * hs);
    const auto Wol = take_units(Wo, heads, long(hs) * d);
    std::vector<float> qkv(BT * 3 * dl), att(B * Hl * T * T), atty(BT * dl), scratch(att.size());
    std::vector<float> datty(BT * dl), dqkv(BT * 3 * dl, 0.f);
    Result r{std::vector<float>(BT * d), std::vector<float>(BT * d), std::vector<float>(Wq.size(), 0.f),
             std::vector<float>(bq.size(), 0.f), std::vector<float>(Wol.size(), 0.f), std::vector<float>(d, 0.f)};
    column_parallel_forward(ctx, qkv.data(), x.data(), Wq.data(), bq.data(), BT, d, 3 * dl);
    ctx.be.attention_forward(atty.data(), att.data(), qkv.data(), B, T, Hl, hs);
    row_parallel_forward(ctx, r.out.data(), atty.data(), Wol.data(), bo.data(), BT, dl, d);
    row_parallel_backward(ctx, datty.data(), r.dWo.data(), r.dbo.data(), dout.data(), atty.data(), Wol.data(), BT, dl,
                          d);
    ctx.be.attention_backward(dqkv.data(), scratch.data(), datty.data(), qkv.data(), att.data(), B, T, Hl, hs);
    column_parallel_backward(ctx, r.dx.data(), r.dWqkv.data(), r.dbqkv.data(), dqkv.data(), x.data(), Wq.data(), BT,
                             d, 3 * dl);
    return r;
  };
  std::vector<int> all(H);
  for (int h = 0; h < H; ++h) all[h] = h;
  const Result ref = run(TpContext{*be_, *g.self}, all);
  if (!g.tp) return;
  for (const auto& map : maps) {
    const auto& heads = map.units_of(g.tp->rank());
    const Result r = run(TpContext{*be_, *g.tp}, heads);
    EXPECT_LT(rel_l2(r.out, ref.out), kTol);
    EXPECT_LT(rel_l2(r.dx, ref.dx), kTol);
    EXPECT_LT(rel_l2(r.dWqkv, take_units(ref.dWqkv, heads, 3L * hs * d)), kTol);
    EXPECT_LT(rel_l2(r.dWo, take_units(ref.dWo, heads, long(hs) * d)), kTol);
    EXPECT_LT(rel_l2(r.dbo, ref.dbo), kTol);
    // The bias gradient's query and value parts; the key part is analytically zero (softmax
    // ignores a shift shared by all keys), so it is compared in absolute terms.
    const auto mine = r.dbqkv, theirs = take_units(ref.dbqkv, heads, 3L * hs);
    double scale = 0;
    for (float v : theirs) scale = std::max(scale, double(std::fabs(v)));
    for (std::size_t k = 0; k < mine.size(); ++k) EXPECT_NEAR(mine[k], theirs[k], 1e-5 * scale) << "element " << k;
  }
}

TEST_P(TpLayers, VocabParallelEmbedding) {
  const int tp = GetParam(), B = 3, T = 5, C = 8, V = 23;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " tp " << tp);
  const auto wte = random_vec(rng_, std::size_t(V) * C), wpe = random_vec(rng_, std::size_t(T) * C);
  const auto dout = random_vec(rng_, std::size_t(B) * T * C);
  std::vector<int> tokens(B * T);
  for (auto& t : tokens) t = static_cast<int>(rng_() % 6);  // few distinct tokens: repeats
  tokens[0] = V - 1;
  const auto maps = maps_for(rng_, V, tp);
  Groups g = groups(tp);
  const std::vector<int> all_rows = ShardMap::single(V, 0, 1).local_rows(0);
  std::vector<float> out(B * T * C), dwte(V * C, 0.f), dwpe(T * C, 0.f);
  const TpContext ref{*be_, *g.self};
  vocab_parallel_embedding_forward(ref, out.data(), tokens.data(), wte.data(), all_rows.data(), wpe.data(), B, T, C);
  vocab_parallel_embedding_backward(ref, dwte.data(), dwpe.data(), dout.data(), tokens.data(), all_rows.data(), B, T,
                                    C);
  if (!g.tp) return;
  for (const auto& map : maps) {
    const auto& units = map.units_of(g.tp->rank());
    const auto rows = map.local_rows(g.tp->rank());
    const TpContext ctx{*be_, *g.tp};
    const auto wtel = take_units(wte, units, C);
    std::vector<float> outl(B * T * C), dwtel(wtel.size(), 0.f), dwpel(T * C, 0.f);
    vocab_parallel_embedding_forward(ctx, outl.data(), tokens.data(), wtel.data(), rows.data(), wpe.data(), B, T, C);
    vocab_parallel_embedding_backward(ctx, dwtel.data(), dwpel.data(), dout.data(), tokens.data(), rows.data(), B, T,
                                      C);
    EXPECT_LT(rel_l2(outl, out), kTol);
    EXPECT_LT(rel_l2(dwtel, take_units(dwte, units, C)), kTol);
    EXPECT_LT(rel_l2(dwpel, dwpe), kTol);
  }
}

TEST_P(TpLayers, VocabParallelCrossEntropy) {
  const int tp = GetParam(), BT = 9, V = 31;
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " tp " << tp);
  const auto logits = random_vec(rng_, std::size_t(BT) * V, 3.0f);
  std::vector<int> targets(BT);
  for (auto& t : targets) t = static_cast<int>(rng_() % V);
  const auto maps = maps_for(rng_, V, tp);
  Groups g = groups(tp);
  const float dloss = 1.0f / BT;
  const std::vector<int> all_rows = ShardMap::single(V, 0, 1).local_rows(0);
  std::vector<float> losses(BT), mx(BT), sums(2 * BT), dlogits = logits;
  const TpContext ref{*be_, *g.self};
  vocab_parallel_cross_entropy_forward(ref, losses.data(), mx.data(), sums.data(), logits.data(), targets.data(),
                                       all_rows.data(), BT, V);
  vocab_parallel_cross_entropy_backward(ref, dlogits.data(), mx.data(), sums.data(), targets.data(), all_rows.data(),
                                        dloss, BT, V);
  if (!g.tp) return;
  for (const auto& map : maps) {
    const auto& units = map.units_of(g.tp->rank());
    const auto rows = map.local_rows(g.tp->rank());
    const int Vl = static_cast<int>(units.size());
    const TpContext ctx{*be_, *g.tp};
    auto logl = take_cols(logits, BT, V, 1, units);
    std::vector<float> lossl(BT), mxl(BT), sumsl(2 * BT);
    vocab_parallel_cross_entropy_forward(ctx, lossl.data(), mxl.data(), sumsl.data(), logl.data(), targets.data(),
                                         rows.data(), BT, Vl);
    vocab_parallel_cross_entropy_backward(ctx, logl.data(), mxl.data(), sumsl.data(), targets.data(), rows.data(),
                                          dloss, BT, Vl);
    EXPECT_LT(rel_l2(lossl, losses), kTol);
    EXPECT_LT(rel_l2(logl, take_cols(dlogits, BT, V, 1, units)), kTol);
  }
}

// Grouped-query attention (8 query heads over 4 KV heads) in a one-layer Llama, sharded by KV
// group at TP 1..4 under Megatron's even split (uneven at TP 3), a scattered uneven map and the NTP
// core/extra layout of every sync degree below tp, against the unsharded model: the loss and every
// tensor's gradient (a rank's units of the reference's). Everything else is split evenly.
TEST_P(TpLayers, LlamaGqaByKvGroups) {
  const int tp = GetParam();
  SCOPED_TRACE(::testing::Message() << "seed " << seed_ << " tp " << tp);
  ModelConfig m{30, 6, 1, 8, 32, Family::Llama, 4, 20, 100.0f};
  ASSERT_GT(m.heads, m.kv());
  const int B = 2, T = 6, BT = B * T;
  std::vector<int> tokens(BT), targets(BT);
  for (int i = 0; i < BT; ++i) tokens[i] = int(rng_() % m.vocab), targets[i] = int(rng_() % m.vocab);
  Groups g = groups(tp);

  auto run = [&](Comm& comm, const TpLayout& layout, int rank) {
    auto model = make_model(*be_, m, layout, rank, comm, B, T);
    model->init_params(seed_);
    // Larger weights than the init so attention's mixing carries signal.
    std::mt19937_64 noise_rng(seed_ + 1);
    for (int t = 0; t < model->layout().tensor_count(); ++t) {
      const auto& spec = model->layout().specs()[t];
      const auto full = random_vec(noise_rng, spec.full_elems(m), 0.3f);
      const auto& slot = model->layout().slot(t);
      const auto mine = spec.dim == ShardDim::Replicated ? full : take_units(full, slot.units, spec.unit_elems);
      for (long k = 0; k < slot.elems; ++k) model->param(t)[k] += mine[k];
    }
    model->zero_grads();
    const double loss = model->forward(tokens.data(), targets.data(), B);
    model->backward(1.0f / BT);
    return std::pair{loss, std::move(model)};
  };
  auto self_layout = TpLayout::even(m, 1);
  auto [ref_loss, ref] = run(*g.self, self_layout, 0);
  if (!g.tp) return;
  std::vector<ShardMap> head_maps = maps_for(rng_, m.head_units(), tp);
  for (int n2 = 1; n2 < tp; ++n2) head_maps.push_back(core_extra_map(m.head_units(), tp, n2));
  for (const auto& heads : head_maps) {
    TpLayout layout = TpLayout::even(m, tp);
    layout.map(ShardDim::Heads) = heads;
    auto [loss, model] = run(*g.tp, layout, g.tp->rank());
    EXPECT_NEAR(loss, ref_loss, kTol * std::fabs(ref_loss));
    for (int t = 0; t < model->layout().tensor_count(); ++t) {
      const auto& spec = model->layout().specs()[t];
      const auto& slot = model->layout().slot(t);
      const std::vector<float> full(ref->grad(t), ref->grad(t) + ref->layout().slot(t).elems);
      const auto want = spec.dim == ShardDim::Replicated ? full : take_units(full, slot.units, spec.unit_elems);
      EXPECT_LT(rel_l2(std::vector<float>(model->grad(t), model->grad(t) + slot.elems), want), kTol) << spec.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, TpLayers, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return "tp" + std::to_string(info.param); });

// A KV group is the smallest unit: TP above the KV-head count is refused, saying why.
TEST(TpLayout, LlamaRefusesTpAboveKvHeads) {
  const ModelConfig m = preset("llama-tiny");
  EXPECT_NO_THROW(TpLayout::even(m, m.kv()));
  try {
    TpLayout::even(m, m.kv() + 1);
    ADD_FAILURE() << "TP " << m.kv() + 1 << " accepted with " << m.kv() << " KV heads";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("KV-head count (" + std::to_string(m.kv()) + ")"), std::string::npos)
        << e.what();
  }
  // GPT-2 still splits by head.
  EXPECT_NO_THROW(TpLayout::even(preset("tiny"), 4));
}

TEST(ShardMap, EvenSplitsMatchMegatron) {
  const auto m = ShardMap::even(8, 3);
  EXPECT_EQ(m.count(0), 3);
  EXPECT_EQ(m.count(1), 3);
  EXPECT_EQ(m.count(2), 2);
  const auto n = ShardMap::even(4, 3);
  EXPECT_EQ(n.units_of(0), (std::vector<int>{0, 1}));
  EXPECT_EQ(n.units_of(1), (std::vector<int>{2}));
  EXPECT_EQ(n.units_of(2), (std::vector<int>{3}));
  EXPECT_EQ(n.local_index(3), 0);
  EXPECT_EQ(n.local_rows(0), (std::vector<int>{0, 1, -1, -1}));
  EXPECT_THROW(ShardMap({0, 3}, 2), std::invalid_argument);
}

}  // namespace
}  // namespace ntp::test
