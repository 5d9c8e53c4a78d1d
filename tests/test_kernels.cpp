// CPU kernels against their frozen naive references, plus finite-difference checks of the
// references themselves. Every test draws a fresh seed; it is printed on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/gqa.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reference/adamw.hpp"
#include "kernels/cpu/reference/attention.hpp"
#include "kernels/cpu/reference/cross_entropy.hpp"
#include "kernels/cpu/reference/embedding.hpp"
#include "kernels/cpu/reference/gelu.hpp"
#include "kernels/cpu/reference/gqa.hpp"
#include "kernels/cpu/reference/layernorm.hpp"
#include "kernels/cpu/reference/matmul.hpp"
#include "kernels/cpu/reference/residual.hpp"
#include "kernels/cpu/reference/rmsnorm.hpp"
#include "kernels/cpu/reference/rope.hpp"
#include "kernels/cpu/reference/moe_dispatch.hpp"
#include "kernels/cpu/reference/moe_router.hpp"
#include "kernels/cpu/reference/swiglu.hpp"
#include "kernels/cpu/reference/zero.hpp"
#include "kernels/cpu/residual.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/moe_dispatch.hpp"
#include "kernels/cpu/moe_router.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernels/cpu/zero.hpp"
#include "kernel_check.hpp"

namespace {

using ntp::test::Vec;
using ntp::test::rel_err;
using ntp::cpu::WeightLayout;

constexpr double kTol = 1e-5;    // fast vs reference
constexpr double kFdTol = 1e-2;  // reference backward vs central differences
constexpr float kFdStep = 1e-3f;


// max |analytic - numeric| / max |analytic|, for finite-difference checks.
double fd_err(const Vec& analytic, const Vec& numeric) {
  double diff = 0.0, scale = 1e-6;
  for (size_t i = 0; i < analytic.size(); i++) {
    diff = std::max(diff, std::fabs(static_cast<double>(analytic[i]) - numeric[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(analytic[i])));
  }
  return diff / scale;
}

// Central-difference gradient of loss() with respect to x, perturbing x in place.
template <class Loss>
Vec numeric_grad(Vec& x, Loss loss) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); i++) {
    const float x0 = x[i];
    const float xp = x0 + kFdStep, xm = x0 - kFdStep;
    x[i] = xp;
    const double lp = loss();
    x[i] = xm;
    const double lm = loss();
    x[i] = x0;
    g[i] = static_cast<float>((lp - lm) / (static_cast<double>(xp) - xm));
  }
  return g;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); i++) s += static_cast<double>(a[i]) * b[i];
  return s;
}

std::string shape(std::initializer_list<long> dims) {
  std::string s = "shape=";
  for (long d : dims) s += std::to_string(d) + " ";
  return s;
}

// ---------------------------------------------------------------------------------------------
TEST(Residual, ForwardBackward) {
  SEEDED_RNG(rng);
  for (long N : {1L, 7L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({N}));
    Vec a = rng.vec(N), b = rng.vec(N), dout = rng.vec(N);
    Vec out(N), out_ref(N);
    ntp::cpu::residual_forward(out.data(), a.data(), b.data(), N);
    ntp::ref::residual_forward(out_ref.data(), a.data(), b.data(), N);
    EXPECT_CLOSE(out, out_ref, kTol);

    Vec da = rng.vec(N), db = rng.vec(N);
    Vec da_ref = da, db_ref = db;
    ntp::cpu::residual_backward(da.data(), db.data(), dout.data(), N);
    ntp::ref::residual_backward(da_ref.data(), db_ref.data(), dout.data(), N);
    EXPECT_CLOSE(da, da_ref, kTol);
    EXPECT_CLOSE(db, db_ref, kTol);
  }
}

// ---------------------------------------------------------------------------------------------
TEST(Gelu, ForwardBackward) {
  SEEDED_RNG(rng);
  for (long N : {1L, 7L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({N}));
    Vec x = rng.vec(N, -6.0f, 6.0f), dout = rng.vec(N);
    Vec out(N), out_ref(N);
    ntp::cpu::gelu_forward(out.data(), x.data(), N);
    ntp::ref::gelu_forward(out_ref.data(), x.data(), N);
    EXPECT_CLOSE(out, out_ref, kTol);

    Vec dx = rng.vec(N), dx_ref = dx;
    ntp::cpu::gelu_backward(dx.data(), x.data(), dout.data(), N);
    ntp::ref::gelu_backward(dx_ref.data(), x.data(), dout.data(), N);
    EXPECT_CLOSE(dx, dx_ref, kTol);
  }
}

TEST(Gelu, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const long N = 200;
  Vec x = rng.vec(N, -4.0f, 4.0f), w = rng.vec(N), out(N);
  Vec dx(N, 0.0f);
  ntp::ref::gelu_backward(dx.data(), x.data(), w.data(), N);
  Vec num = numeric_grad(x, [&] {
    ntp::ref::gelu_forward(out.data(), x.data(), N);
    return dot(out, w);
  });
  EXPECT_LE(fd_err(dx, num), kFdTol);
}

// ---------------------------------------------------------------------------------------------
TEST(AdamW, UpdateAndSumSquares) {
  SEEDED_RNG(rng);
  for (long n : {1L, 13L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({n}));
    Vec p = rng.vec(n), m = rng.vec(n, -0.1f, 0.1f), v = rng.vec(n, 0.0f, 0.01f);
    Vec p_ref = p, m_ref = m, v_ref = v;
    for (int t = 1; t <= 3; t++) {
      Vec g = rng.vec(n);
      ntp::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
      ntp::ref::adamw_update(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f,
                             0.5f, t);
    }
    EXPECT_CLOSE(p, p_ref, kTol);
    EXPECT_CLOSE(m, m_ref, kTol);
    EXPECT_CLOSE(v, v_ref, kTol);

    const double s = ntp::cpu::sum_squares(p.data(), n), s_ref = ntp::ref::sum_squares(p.data(), n);
    EXPECT_NEAR(s, s_ref, 1e-12 * std::max(1.0, s_ref));
  }
  EXPECT_EQ(ntp::cpu::sum_squares(nullptr, 0), 0.0);
  // Above the kernel's stream threshold too (several OpenMP blocks, four streams each, a tail).
  const long big = (1L << 22) + 4099;
  Vec x = rng.vec(big);
  const double s = ntp::cpu::sum_squares(x.data(), big), s_ref = ntp::ref::sum_squares(x.data(), big);
  // Summed in another order: within twice the bound of a sum of n positive doubles, n u.
  EXPECT_NEAR(s, s_ref, 2.0 * double(big) * 0x1p-53 * s_ref);
}

// memset's job, and above 16 MB streaming stores from every thread: from an unaligned start, with
// a tail, nothing written outside [p, p + n).
TEST(Zero, MatchesReference) {
  SEEDED_RNG(rng);
  for (long n : {0L, 1L, 13L, 4099L, (1L << 22) + 4099}) {
    SCOPED_TRACE(shape({n}));
    Vec x = rng.vec(n + 8, 0.5f, 1.0f), x_ref = x;
    ntp::cpu::zero(x.data() + 3, n);
    ntp::ref::zero(x_ref.data() + 3, n);
    EXPECT_EQ(x, x_ref);
  }
}

// ---------------------------------------------------------------------------------------------
// A vocabulary-parallel ownership map: rank-local rows in ascending token order, -1 if not owned.
std::vector<int> random_local_rows(ntp::test::Rng& rng, int V, int& Vl) {
  std::vector<int> local_row(V);
  Vl = 0;
  for (int tok = 0; tok < V; tok++) local_row[tok] = rng.uniform(0, 1) ? Vl++ : -1;
  return local_row;
}

TEST(Embedding, ForwardBackward) {
  SEEDED_RNG(rng);
  struct Shape {
    int B, T, C, V;
  };
  for (Shape s :
       {Shape{1, 1, 1, 1}, Shape{1, 1, 7, 5}, Shape{2, 5, 13, 11}, Shape{4, 32, 100, 64}, Shape{3, 17, 70, 257}}) {
    SCOPED_TRACE(shape({s.B, s.T, s.C, s.V}));
    const int BT = s.B * s.T, C = s.C;
    int Vl = 0;
    std::vector<int> local_row = random_local_rows(rng, s.V, Vl);
    std::vector<int> tokens(BT);
    for (int& t : tokens) t = rng.uniform(0, s.V - 1);
    Vec wte = rng.vec(static_cast<size_t>(Vl) * C), wpe = rng.vec(static_cast<size_t>(s.T) * C);

    Vec out = rng.vec(BT * C), out_ref = rng.vec(BT * C);  // garbage: the forward overwrites
    ntp::cpu::embedding_forward(out.data(), tokens.data(), wte.data(), local_row.data(), BT, C);
    ntp::ref::embedding_forward(out_ref.data(), tokens.data(), wte.data(), local_row.data(), BT, C);
    EXPECT_CLOSE(out, out_ref, 0.0);
    ntp::cpu::position_embedding_forward(out.data(), wpe.data(), s.B, s.T, C);
    ntp::ref::position_embedding_forward(out_ref.data(), wpe.data(), s.B, s.T, C);
    EXPECT_CLOSE(out, out_ref, kTol);

    Vec dout = rng.vec(BT * C);
    Vec dwte = rng.vec(wte.size()), dwpe = rng.vec(wpe.size());
    Vec dwte_ref = dwte, dwpe_ref = dwpe;
    ntp::cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), local_row.data(), BT, C);
    ntp::ref::embedding_backward(dwte_ref.data(), dout.data(), tokens.data(), local_row.data(), BT, C);
    EXPECT_CLOSE(dwte, dwte_ref, kTol);
    ntp::cpu::position_embedding_backward(dwpe.data(), dout.data(), s.B, s.T, C);
    ntp::ref::position_embedding_backward(dwpe_ref.data(), dout.data(), s.B, s.T, C);
    EXPECT_CLOSE(dwpe, dwpe_ref, kTol);
  }
}

TEST(Embedding, BackwardRepeatedTokens) {
  SEEDED_RNG(rng);
  const int BT = 257, C = 67, V = 5;
  std::vector<int> local_row = {0, -1, 1, 2, -1};  // rank owns tokens 0, 2, 3
  std::vector<int> tokens(BT);
  for (int& t : tokens) t = rng.uniform(0, V - 1);
  tokens[0] = tokens[1] = tokens[BT - 1] = 2;
  Vec dout = rng.vec(static_cast<size_t>(BT) * C), dwte = rng.vec(3 * C);

  // Expected: initial value plus the sum of every position's gradient carrying that token.
  std::vector<double> expect(dwte.begin(), dwte.end());
  for (int bt = 0; bt < BT; bt++)
    if (local_row[tokens[bt]] >= 0)
      for (int c = 0; c < C; c++) expect[local_row[tokens[bt]] * C + c] += dout[bt * C + c];

  ntp::cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), local_row.data(), BT, C);
  for (int i = 0; i < 3 * C; i++) EXPECT_NEAR(dwte[i], expect[i], 1e-4) << "i=" << i;
}

// ---------------------------------------------------------------------------------------------
TEST(Matmul, ForwardBackward) {
  SEEDED_RNG(rng);
  struct Shape {
    int BT, C, OC;
  };
  for (Shape s :
       {Shape{1, 1, 1}, Shape{1, 7, 3}, Shape{5, 13, 9}, Shape{33, 17, 70}, Shape{64, 48, 96}, Shape{128, 64, 192}}) {
    for (WeightLayout layout : {WeightLayout::OutIn, WeightLayout::InOut}) {
      for (bool with_bias : {true, false}) {
        SCOPED_TRACE(shape({s.BT, s.C, s.OC}) + (layout == WeightLayout::OutIn ? "OutIn" : "InOut") +
                     (with_bias ? " bias" : " nobias"));
        const size_t nin = static_cast<size_t>(s.BT) * s.C, nout = static_cast<size_t>(s.BT) * s.OC;
        const size_t nw = static_cast<size_t>(s.C) * s.OC;
        Vec inp = rng.vec(nin), w = rng.vec(nw), bias = rng.vec(s.OC), dout = rng.vec(nout);
        const float* b = with_bias ? bias.data() : nullptr;

        Vec out = rng.vec(nout), out_ref(nout);  // garbage: the forward overwrites
        ntp::cpu::matmul_forward(out.data(), inp.data(), w.data(), b, s.BT, s.C, s.OC, layout);
        ntp::ref::matmul_forward(out_ref.data(), inp.data(), w.data(), b, s.BT, s.C, s.OC, layout);
        EXPECT_CLOSE(out, out_ref, kTol);

        // Non-zero accumulate targets check the += contract; nullptr dinp/dbias must be skipped.
        Vec dinp = rng.vec(nin), dw = rng.vec(nw), db = rng.vec(s.OC);
        Vec dinp_ref = dinp, dw_ref = dw, db_ref = db;
        float* dinp_p = with_bias ? dinp.data() : nullptr;
        float* dinp_ref_p = with_bias ? dinp_ref.data() : nullptr;
        float* db_p = with_bias ? db.data() : nullptr;
        float* db_ref_p = with_bias ? db_ref.data() : nullptr;
        ntp::cpu::matmul_backward(dinp_p, dw.data(), db_p, dout.data(), inp.data(), w.data(), s.BT, s.C, s.OC, layout);
        ntp::ref::matmul_backward(dinp_ref_p, dw_ref.data(), db_ref_p, dout.data(), inp.data(), w.data(), s.BT, s.C,
                                  s.OC, layout);
        EXPECT_CLOSE(dinp, dinp_ref, kTol);
        EXPECT_CLOSE(dw, dw_ref, kTol);
        EXPECT_CLOSE(db, db_ref, kTol);
      }
    }
  }
}

TEST(Matmul, LayoutsAgree) {
  // The same logical weight stored both ways must give the same product.
  SEEDED_RNG(rng);
  const int BT = 9, C = 11, OC = 6;
  Vec inp = rng.vec(BT * C), w_oi = rng.vec(OC * C), w_io(C * OC);
  for (int o = 0; o < OC; o++)
    for (int i = 0; i < C; i++) w_io[i * OC + o] = w_oi[o * C + i];
  Vec a(BT * OC), b(BT * OC);
  ntp::cpu::matmul_forward(a.data(), inp.data(), w_oi.data(), nullptr, BT, C, OC, WeightLayout::OutIn);
  ntp::cpu::matmul_forward(b.data(), inp.data(), w_io.data(), nullptr, BT, C, OC, WeightLayout::InOut);
  EXPECT_CLOSE(a, b, kTol);
}

TEST(Bias, ForwardBackward) {
  SEEDED_RNG(rng);
  for (auto [BT, OC] : {std::pair{1, 1}, std::pair{7, 13}, std::pair{300, 70}}) {
    SCOPED_TRACE(shape({BT, OC}));
    Vec bias = rng.vec(OC), out = rng.vec(BT * OC), out_ref = out, dout = rng.vec(BT * OC);
    ntp::cpu::bias_forward(out.data(), bias.data(), BT, OC);
    ntp::ref::bias_forward(out_ref.data(), bias.data(), BT, OC);
    EXPECT_CLOSE(out, out_ref, kTol);

    Vec db = rng.vec(OC), db_ref = db;
    ntp::cpu::bias_backward(db.data(), dout.data(), BT, OC);
    ntp::ref::bias_backward(db_ref.data(), dout.data(), BT, OC);
    EXPECT_CLOSE(db, db_ref, kTol);
  }
}

// ---------------------------------------------------------------------------------------------
TEST(LayerNorm, ForwardBackward) {
  SEEDED_RNG(rng);
  for (auto [BT, C] : {std::pair{1, 1}, std::pair{1, 7}, std::pair{5, 13}, std::pair{37, 100}, std::pair{64, 768}}) {
    SCOPED_TRACE(shape({BT, C}));
    const size_t n = static_cast<size_t>(BT) * C;
    Vec inp = rng.vec(n, -2.0f, 3.0f), w = rng.vec(C, 0.5f, 1.5f), b = rng.vec(C), dout = rng.vec(n);
    Vec out(n), mean(BT), rstd(BT), out_ref(n), mean_ref(BT), rstd_ref(BT);
    ntp::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), BT, C);
    ntp::ref::layernorm_forward(out_ref.data(), mean_ref.data(), rstd_ref.data(), inp.data(), w.data(), b.data(), BT,
                                C);
    EXPECT_CLOSE(out, out_ref, kTol);
    EXPECT_CLOSE(mean, mean_ref, kTol);
    EXPECT_CLOSE(rstd, rstd_ref, kTol);

    Vec dinp = rng.vec(n), dw = rng.vec(C), db = rng.vec(C);
    Vec dinp_ref = dinp, dw_ref = dw, db_ref = db;
    ntp::cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                 rstd.data(), BT, C);
    ntp::ref::layernorm_backward(dinp_ref.data(), dw_ref.data(), db_ref.data(), dout.data(), inp.data(), w.data(),
                                 mean.data(), rstd.data(), BT, C);
    EXPECT_CLOSE(dinp, dinp_ref, kTol);
    EXPECT_CLOSE(dw, dw_ref, kTol);
    EXPECT_CLOSE(db, db_ref, kTol);
  }
}

TEST(LayerNorm, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const int BT = 3, C = 10;
  Vec inp = rng.vec(BT * C, -2.0f, 2.0f), w = rng.vec(C, 0.5f, 1.5f), b = rng.vec(C), proj = rng.vec(BT * C);
  Vec out(BT * C), mean(BT), rstd(BT);
  auto loss = [&] {
    ntp::ref::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), BT, C);
    return dot(out, proj);
  };
  loss();
  Vec dinp(BT * C, 0.0f), dw(C, 0.0f), db(C, 0.0f);
  ntp::ref::layernorm_backward(dinp.data(), dw.data(), db.data(), proj.data(), inp.data(), w.data(), mean.data(),
                               rstd.data(), BT, C);
  EXPECT_LE(fd_err(dinp, numeric_grad(inp, loss)), kFdTol);
  EXPECT_LE(fd_err(dw, numeric_grad(w, loss)), kFdTol);
  EXPECT_LE(fd_err(db, numeric_grad(b, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
TEST(RmsNorm, ForwardBackward) {
  SEEDED_RNG(rng);
  for (auto [BT, C] : {std::pair{1, 1}, std::pair{1, 7}, std::pair{5, 13}, std::pair{37, 100}, std::pair{64, 768}}) {
    SCOPED_TRACE(shape({BT, C}));
    const size_t n = static_cast<size_t>(BT) * C;
    Vec inp = rng.vec(n, -2.0f, 3.0f), w = rng.vec(C, 0.5f, 1.5f), dout = rng.vec(n);
    Vec out(n), rstd(BT), out_ref(n), rstd_ref(BT);
    ntp::cpu::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), BT, C);
    ntp::ref::rmsnorm_forward(out_ref.data(), rstd_ref.data(), inp.data(), w.data(), BT, C);
    EXPECT_CLOSE(out, out_ref, kTol);
    EXPECT_CLOSE(rstd, rstd_ref, kTol);

    Vec dinp = rng.vec(n), dw = rng.vec(C);
    Vec dinp_ref = dinp, dw_ref = dw;
    ntp::cpu::rmsnorm_backward(dinp.data(), dw.data(), dout.data(), inp.data(), w.data(), rstd.data(), BT, C);
    ntp::ref::rmsnorm_backward(dinp_ref.data(), dw_ref.data(), dout.data(), inp.data(), w.data(), rstd.data(), BT,
                               C);
    EXPECT_CLOSE(dinp, dinp_ref, kTol);
    EXPECT_CLOSE(dw, dw_ref, kTol);
  }
}

TEST(RmsNorm, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const int BT = 3, C = 10;
  Vec inp = rng.vec(BT * C, -2.0f, 2.0f), w = rng.vec(C, 0.5f, 1.5f), proj = rng.vec(BT * C);
  Vec out(BT * C), rstd(BT);
  auto loss = [&] {
    ntp::ref::rmsnorm_forward(out.data(), rstd.data(), inp.data(), w.data(), BT, C);
    return dot(out, proj);
  };
  loss();
  Vec dinp(BT * C, 0.0f), dw(C, 0.0f);
  ntp::ref::rmsnorm_backward(dinp.data(), dw.data(), proj.data(), inp.data(), w.data(), rstd.data(), BT, C);
  EXPECT_LE(fd_err(dinp, numeric_grad(inp, loss)), kFdTol);
  EXPECT_LE(fd_err(dw, numeric_grad(w, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
// The MoE router: what each token chooses, capacity, the balancing loss, and their gradients.
struct Routed {
  std::vector<int> expert;
  Vec weight, probs;
  std::vector<char> kept;
  std::vector<long> per_expert;
  long dropped = -1;
  float aux = -1;
  Routed(long T, int E, int k) : expert(T * k), weight(T * k), probs(T * E), kept(T * k), per_expert(E) {}
};

template <class Forward>
Routed route(Forward forward, const Vec& logits, long T, int E, int k, long capacity) {
  Routed r(T, E, k);
  forward(logits.data(), T, E, k, capacity, r.expert.data(), r.weight.data(), r.kept.data(), r.probs.data(),
          r.per_expert.data(), &r.dropped, &r.aux);
  return r;
}

TEST(MoeRouter, ForwardBackward) {
  SEEDED_RNG(rng);
  for (long T : {1L, 7L, 300L, 2000L})
    for (int E : {4, 6, 8})
      for (int k : {1, 2})
        for (long capacity : {0L, (T * k + E - 1) / E}) {  // no limit; exactly the even share
          SCOPED_TRACE(shape({T, E, k, capacity}));
          const Vec logits = rng.vec(T * E, -3.0f, 3.0f);
          const Routed a = route(ntp::cpu::moe_router_forward, logits, T, E, k, capacity);
          const Routed b = route(ntp::ref::moe_router_forward, logits, T, E, k, capacity);
          EXPECT_EQ(a.expert, b.expert);
          EXPECT_EQ(a.kept, b.kept);
          EXPECT_EQ(a.per_expert, b.per_expert);
          EXPECT_EQ(a.dropped, b.dropped);
          EXPECT_CLOSE(a.weight, b.weight, kTol);
          EXPECT_CLOSE(a.probs, b.probs, kTol);
          EXPECT_NEAR(a.aux, b.aux, kTol * std::max(1.0f, b.aux));
          // What routing means, beside agreeing: weights sum to 1, every assignment is kept or
          // dropped, no expert takes more than its capacity, and without one nothing is dropped.
          for (long t = 0; t < T; t++) {
            float sum = 0;
            for (int j = 0; j < k; j++) sum += a.weight[t * k + j];
            EXPECT_NEAR(sum, 1.0f, 1e-5f);
          }
          long total = a.dropped;
          for (int e = 0; e < E; e++) {
            total += a.per_expert[e];
            if (capacity > 0) {
              EXPECT_LE(a.per_expert[e], capacity);
            }
          }
          EXPECT_EQ(total, T * k);
          if (capacity == 0) {
            EXPECT_EQ(a.dropped, 0);
          }

          const Vec dweight = rng.vec(T * k);
          Vec dz = rng.vec(T * E), dz_ref = dz;
          ntp::cpu::moe_router_backward(dz.data(), a.probs.data(), a.expert.data(), a.weight.data(), dweight.data(), T, E,
                                        k, 0.01f);
          ntp::ref::moe_router_backward(dz_ref.data(), b.probs.data(), b.expert.data(), b.weight.data(),
                                        dweight.data(), T, E, k, 0.01f);
          EXPECT_CLOSE(dz, dz_ref, kTol);
        }
}

TEST(MoeRouter, BalancingLossByHand) {
  // One token, two experts, top-1. Equal logits: the lower expert is chosen, f = [1, 0], P = [.5, .5]:
  // aux = 2 * (1 * 0.5) = 1. Logits [ln 3, 0]: P = [.75, .25], aux = 2 * 0.75 = 1.5.
  Routed even = route(ntp::ref::moe_router_forward, Vec{0.0f, 0.0f}, 1, 2, 1, 0);
  EXPECT_EQ(even.expert[0], 0);
  EXPECT_FLOAT_EQ(even.aux, 1.0f);
  Routed skew = route(ntp::ref::moe_router_forward, Vec{std::log(3.0f), 0.0f}, 1, 2, 1, 0);
  EXPECT_NEAR(skew.aux, 1.5f, 1e-6f);
  // Capacity 1 over three tokens that all choose expert 0: the first keeps it, the others drop.
  Routed full = route(ntp::ref::moe_router_forward, Vec{1.0f, 0.0f, 1.0f, 0.0f, 1.0f, 0.0f}, 3, 2, 1, 1);
  EXPECT_EQ(full.kept, (std::vector<char>{1, 0, 0}));
  EXPECT_EQ(full.dropped, 2);
  EXPECT_EQ(full.per_expert, (std::vector<long>{1, 0}));
}

TEST(MoeRouter, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const long T = 5;
  const int E = 6, k = 2;
  // Logits spaced 0.3 apart (a shuffled ladder per token): the central differences never change
  // which experts a token chooses.
  Vec z(T * E);
  for (long t = 0; t < T; t++) {
    std::vector<int> order(E);
    for (int e = 0; e < E; e++) order[e] = e;
    for (int e = E - 1; e > 0; e--) std::swap(order[e], order[static_cast<int>(rng.vec(1, 0.0f, 0.999f)[0] * (e + 1))]);
    for (int e = 0; e < E; e++) z[t * E + e] = 0.3f * order[e] - 0.9f + rng.vec(1, -0.05f, 0.05f)[0];
  }
  const Vec proj = rng.vec(T * k);
  const float aux_scale = 0.7f;
  auto loss = [&] {
    const Routed r = route(ntp::ref::moe_router_forward, z, T, E, k, 0);
    return dot(r.weight, proj) + aux_scale * r.aux;
  };
  const Routed r = route(ntp::ref::moe_router_forward, z, T, E, k, 0);
  Vec dz(T * E, 0.0f);
  ntp::ref::moe_router_backward(dz.data(), r.probs.data(), r.expert.data(), r.weight.data(), proj.data(), T, E, k,
                                aux_scale);
  EXPECT_LE(fd_err(dz, numeric_grad(z, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
// Tokens to experts and back: the rows' layout, the dispatch and the weighted combine.
struct Rows {
  std::vector<long> offsets, row_of;
  Rows(long T, int E, int k) : offsets(E + 1), row_of(T * k) {}
};

template <class Plan>
Rows plan_rows(Plan plan, const Routed& r, long T, int E, int k) {
  Rows rows(T, E, k);
  plan(r.expert.data(), r.kept.data(), T, E, k, rows.offsets.data(), rows.row_of.data());
  return rows;
}

TEST(MoeDispatch, ForwardBackward) {
  SEEDED_RNG(rng);
  for (long T : {1L, 9L, 333L})
    for (int C : {1, 17, 64})
      for (long capacity : {0L, std::max(1L, T / 4)}) {  // no limit; tight, with drops
        const int E = 6, k = 2;
        SCOPED_TRACE(shape({T, C, capacity}));
        const Routed r = route(ntp::ref::moe_router_forward, rng.vec(T * E, -2.0f, 2.0f), T, E, k, capacity);
        const Rows a = plan_rows(ntp::cpu::moe_plan, r, T, E, k), b = plan_rows(ntp::ref::moe_plan, r, T, E, k);
        ASSERT_EQ(a.offsets, b.offsets);
        ASSERT_EQ(a.row_of, b.row_of);
        const long R = a.offsets[E];
        EXPECT_EQ(R, T * k - r.dropped);
        for (int e = 0; e < E; e++) EXPECT_EQ(a.offsets[e + 1] - a.offsets[e], r.per_expert[e]);

        const Vec x = rng.vec(T * C);
        Vec xs(R * C, NAN), xs_ref(R * C, NAN);
        ntp::cpu::moe_dispatch_forward(xs.data(), x.data(), a.row_of.data(), T, k, C);
        ntp::ref::moe_dispatch_forward(xs_ref.data(), x.data(), b.row_of.data(), T, k, C);
        EXPECT_EQ(xs, xs_ref);  // copies: exact, and every row written (no NaN left)

        const Vec dxs = rng.vec(R * C);
        Vec dx = rng.vec(T * C), dx_ref = dx;
        ntp::cpu::moe_dispatch_backward(dx.data(), dxs.data(), a.row_of.data(), T, k, C);
        ntp::ref::moe_dispatch_backward(dx_ref.data(), dxs.data(), b.row_of.data(), T, k, C);
        EXPECT_CLOSE(dx, dx_ref, kTol);

        const Vec ys = rng.vec(R * C);
        Vec y = rng.vec(T * C), y_ref = y;
        ntp::cpu::moe_combine_forward(y.data(), ys.data(), r.weight.data(), a.row_of.data(), T, k, C);
        ntp::ref::moe_combine_forward(y_ref.data(), ys.data(), r.weight.data(), b.row_of.data(), T, k, C);
        EXPECT_CLOSE(y, y_ref, kTol);

        const Vec dy = rng.vec(T * C);
        Vec dys(R * C, NAN), dys_ref(R * C, NAN), dw(T * k, NAN), dw_ref(T * k, NAN);
        ntp::cpu::moe_combine_backward(dys.data(), dw.data(), dy.data(), ys.data(), r.weight.data(), a.row_of.data(), T,
                                       k, C);
        ntp::ref::moe_combine_backward(dys_ref.data(), dw_ref.data(), dy.data(), ys.data(), r.weight.data(),
                                       b.row_of.data(), T, k, C);
        EXPECT_CLOSE(dys, dys_ref, kTol);
        EXPECT_CLOSE(dw, dw_ref, kTol);
      }
}

TEST(MoeDispatch, RowsByHand) {
  // Three tokens, top-2 of three experts, capacity 2: token 0 -> (2, 0), token 1 -> (0, 2),
  // token 2 -> (0, 1). Expert 0 keeps tokens 0 and 1 and drops token 2's slot; expert 2 keeps
  // tokens 0 and 1. Rows: expert 0 [t0, t1], expert 1 [t2], expert 2 [t0, t1].
  const std::vector<int> expert{2, 0, 0, 2, 0, 1};
  const std::vector<char> kept{1, 1, 1, 1, 0, 1};
  Rows rows(3, 3, 2);
  ntp::ref::moe_plan(expert.data(), kept.data(), 3, 3, 2, rows.offsets.data(), rows.row_of.data());
  EXPECT_EQ(rows.offsets, (std::vector<long>{0, 2, 3, 5}));
  EXPECT_EQ(rows.row_of, (std::vector<long>{3, 0, 1, 4, -1, 2}));
  // Combine with weights: token 2 keeps only its second slot's share (0.25 of expert 1's row).
  const Vec ys{10, 20, 30, 40, 50};  // C = 1
  const Vec weight{0.5f, 0.5f, 0.75f, 0.25f, 0.75f, 0.25f};
  Vec y(3, 0.0f);
  ntp::ref::moe_combine_forward(y.data(), ys.data(), weight.data(), rows.row_of.data(), 3, 2, 1);
  EXPECT_EQ(y, (Vec{0.5f * 40 + 0.5f * 10, 0.75f * 20 + 0.25f * 50, 0.25f * 30}));
}

// The kernels composed into Mixtral's sparse MLP (router x @ Wr, top-k, each kept slot through its
// expert's SwiGLU MLP, the weighted sum), forward and backward, against the same block written
// per token in float64 and its gradient by central differences: the loss is proj . y plus the
// balancing loss. A capacity drops some slots, which must add nothing and get no gradient.
TEST(MoeDispatch, KernelsComposeIntoTheSparseMlp) {
  SEEDED_RNG(rng);
  const long T = 12;
  const int C = 8, F = 6, E = 4, k = 2;
  const long capacity = 5;  // of 24 slots over 4 experts: some drop
  const float aux_scale = 0.3f;
  Vec x = rng.vec(T * C), wr = rng.vec(C * E, -0.8f, 0.8f), wg = rng.vec(E * C * F, -0.5f, 0.5f),
      wu = rng.vec(E * C * F, -0.5f, 0.5f), wd = rng.vec(E * F * C, -0.5f, 0.5f);
  const Vec proj = rng.vec(T * C);

  // The block per token in float64, with routing and capacity as the router's contract says.
  using D = std::vector<double>;
  auto block64 = [&](const D& xd, const D& wrd, const D& wgd, const D& wud, const D& wdd, std::vector<int>* chosen) {
    std::vector<long> load(E, 0), picked(E, 0);
    D prob_mean(E, 0.0), y(T * C, 0.0);
    for (long t = 0; t < T; t++) {
      D z(E, 0.0);
      for (int e = 0; e < E; e++)
        for (int c = 0; c < C; c++) z[e] += xd[t * C + c] * wrd[c * E + e];
      std::vector<int> order(E);
      for (int e = 0; e < E; e++) order[e] = e;
      std::stable_sort(order.begin(), order.end(), [&](int p, int q) { return z[p] > z[q]; });
      const double top = z[order[0]];
      double sk = 0, sall = 0;
      for (int j = 0; j < k; j++) sk += std::exp(z[order[j]] - top);
      for (int e = 0; e < E; e++) sall += std::exp(z[e] - top);
      for (int e = 0; e < E; e++) prob_mean[e] += std::exp(z[e] - top) / sall / T;
      for (int j = 0; j < k; j++) {
        const int e = order[j];
        if (chosen) chosen->push_back(e);
        picked[e]++;
        if (load[e] >= capacity) continue;  // dropped
        load[e]++;
        const double w = std::exp(z[e] - top) / sk;
        D h(F);
        for (int f = 0; f < F; f++) {
          double g = 0, u = 0;
          for (int c = 0; c < C; c++) {
            g += xd[t * C + c] * wgd[(e * C + c) * F + f];
            u += xd[t * C + c] * wud[(e * C + c) * F + f];
          }
          h[f] = g / (1 + std::exp(-g)) * u;
        }
        for (int c = 0; c < C; c++) {
          double o = 0;
          for (int f = 0; f < F; f++) o += h[f] * wdd[(e * F + f) * C + c];
          y[t * C + c] += w * o;
        }
      }
    }
    double aux = 0;
    for (int e = 0; e < E; e++) aux += double(picked[e]) / double(T * k) * prob_mean[e];
    double loss = aux_scale * E * aux;
    for (long i = 0; i < T * C; i++) loss += y[i] * proj[i];
    return std::make_pair(y, loss);
  };
  auto to64 = [](const Vec& v) { return D(v.begin(), v.end()); };

  // Forward from the kernels.
  Vec logits(T * E);
  ntp::cpu::matmul_forward(logits.data(), x.data(), wr.data(), nullptr, T, C, E, ntp::cpu::WeightLayout::InOut);
  const Routed r = route(ntp::cpu::moe_router_forward, logits, T, E, k, capacity);
  ASSERT_GT(r.dropped, 0);
  const Rows rows = plan_rows(ntp::cpu::moe_plan, r, T, E, k);
  const long R = rows.offsets[E];
  Vec xs(R * C), gate(R * F), up(R * F), h(R * F), ys(R * C), y(T * C, 0.0f);
  ntp::cpu::moe_dispatch_forward(xs.data(), x.data(), rows.row_of.data(), T, k, C);
  for (int e = 0; e < E; e++) {
    const long r0 = rows.offsets[e], n = rows.offsets[e + 1] - r0;
    if (n == 0) continue;
    ntp::cpu::matmul_forward(&gate[r0 * F], &xs[r0 * C], &wg[e * C * F], nullptr, n, C, F, ntp::cpu::WeightLayout::InOut);
    ntp::cpu::matmul_forward(&up[r0 * F], &xs[r0 * C], &wu[e * C * F], nullptr, n, C, F, ntp::cpu::WeightLayout::InOut);
    ntp::cpu::swiglu_forward(&h[r0 * F], &gate[r0 * F], &up[r0 * F], n * F);
    ntp::cpu::matmul_forward(&ys[r0 * C], &h[r0 * F], &wd[e * F * C], nullptr, n, F, C, ntp::cpu::WeightLayout::InOut);
  }
  ntp::cpu::moe_combine_forward(y.data(), ys.data(), r.weight.data(), rows.row_of.data(), T, k, C);
  std::vector<int> chosen;
  const auto [y64, loss64] = block64(to64(x), to64(wr), to64(wg), to64(wu), to64(wd), &chosen);
  ASSERT_EQ(chosen, r.expert);  // the same routing in float32 and float64
  EXPECT_CLOSE(y, Vec(y64.begin(), y64.end()), 1e-5);
  EXPECT_NEAR(r.aux * aux_scale + dot(y, proj), loss64, 1e-4 * std::max(1.0, std::fabs(loss64)));

  // Backward from the kernels.
  Vec dys(R * C), dweight(T * k), dh(R * F, 0.0f), dgate(R * F, 0.0f), dup(R * F, 0.0f), dxs(R * C, 0.0f);
  Vec dx(T * C, 0.0f), dwr(C * E, 0.0f), dwg(E * C * F, 0.0f), dwu(E * C * F, 0.0f), dwd(E * F * C, 0.0f),
      dlogits(T * E, 0.0f);
  ntp::cpu::moe_combine_backward(dys.data(), dweight.data(), proj.data(), ys.data(), r.weight.data(),
                                 rows.row_of.data(), T, k, C);
  for (int e = 0; e < E; e++) {
    const long r0 = rows.offsets[e], n = rows.offsets[e + 1] - r0;
    if (n == 0) continue;
    ntp::cpu::matmul_backward(&dh[r0 * F], &dwd[e * F * C], nullptr, &dys[r0 * C], &h[r0 * F], &wd[e * F * C], n, F, C,
                              ntp::cpu::WeightLayout::InOut);
    ntp::cpu::swiglu_backward(&dgate[r0 * F], &dup[r0 * F], &gate[r0 * F], &up[r0 * F], &dh[r0 * F], n * F);
    ntp::cpu::matmul_backward(&dxs[r0 * C], &dwg[e * C * F], nullptr, &dgate[r0 * F], &xs[r0 * C], &wg[e * C * F], n, C,
                              F, ntp::cpu::WeightLayout::InOut);
    ntp::cpu::matmul_backward(&dxs[r0 * C], &dwu[e * C * F], nullptr, &dup[r0 * F], &xs[r0 * C], &wu[e * C * F], n, C,
                              F, ntp::cpu::WeightLayout::InOut);
  }
  ntp::cpu::moe_dispatch_backward(dx.data(), dxs.data(), rows.row_of.data(), T, k, C);
  ntp::cpu::moe_router_backward(dlogits.data(), r.probs.data(), r.expert.data(), r.weight.data(), dweight.data(), T, E,
                                k, aux_scale);
  ntp::cpu::matmul_backward(dx.data(), dwr.data(), nullptr, dlogits.data(), x.data(), wr.data(), T, C, E,
                            ntp::cpu::WeightLayout::InOut);

  // Central differences of the float64 block, parameter by parameter.
  const double eps = 1e-6;
  auto check = [&](const char* name, const Vec& analytic, int which) {
    SCOPED_TRACE(name);
    std::vector<D> p{to64(x), to64(wr), to64(wg), to64(wu), to64(wd)};
    Vec numeric(analytic.size());
    for (std::size_t i = 0; i < analytic.size(); i++) {
      const double keep = p[which][i];
      p[which][i] = keep + eps;
      const double up_loss = block64(p[0], p[1], p[2], p[3], p[4], nullptr).second;
      p[which][i] = keep - eps;
      const double down_loss = block64(p[0], p[1], p[2], p[3], p[4], nullptr).second;
      p[which][i] = keep;
      numeric[i] = float((up_loss - down_loss) / (2 * eps));
    }
    EXPECT_CLOSE(analytic, numeric, 1e-4);
  };
  check("dx", dx, 0);
  check("dWr", dwr, 1);
  check("dWgate", dwg, 2);
  check("dWup", dwu, 3);
  check("dWdown", dwd, 4);
}

// ---------------------------------------------------------------------------------------------
TEST(SwiGlu, ForwardBackward) {
  SEEDED_RNG(rng);
  for (long N : {1L, 7L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({N}));
    Vec gate = rng.vec(N, -8.0f, 8.0f), up = rng.vec(N, -2.0f, 2.0f), dout = rng.vec(N);
    Vec out(N), out_ref(N);
    ntp::cpu::swiglu_forward(out.data(), gate.data(), up.data(), N);
    ntp::ref::swiglu_forward(out_ref.data(), gate.data(), up.data(), N);
    EXPECT_CLOSE(out, out_ref, kTol);

    Vec dg = rng.vec(N), du = rng.vec(N), dg_ref = dg, du_ref = du;
    ntp::cpu::swiglu_backward(dg.data(), du.data(), gate.data(), up.data(), dout.data(), N);
    ntp::ref::swiglu_backward(dg_ref.data(), du_ref.data(), gate.data(), up.data(), dout.data(), N);
    EXPECT_CLOSE(dg, dg_ref, kTol);
    EXPECT_CLOSE(du, du_ref, kTol);
  }
}

TEST(SwiGlu, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const long N = 200;
  Vec gate = rng.vec(N, -4.0f, 4.0f), up = rng.vec(N), proj = rng.vec(N), out(N);
  auto loss = [&] {
    ntp::ref::swiglu_forward(out.data(), gate.data(), up.data(), N);
    return dot(out, proj);
  };
  Vec dg(N, 0.0f), du(N, 0.0f);
  ntp::ref::swiglu_backward(dg.data(), du.data(), gate.data(), up.data(), proj.data(), N);
  EXPECT_LE(fd_err(dg, numeric_grad(gate, loss)), kFdTol);
  EXPECT_LE(fd_err(du, numeric_grad(up, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
TEST(Rope, ForwardBackward) {
  SEEDED_RNG(rng);
  struct Shape {
    int B, T, NH, HS;
    float theta;
  };
  for (auto s : {Shape{1, 1, 1, 2, 10000.0f}, Shape{2, 5, 3, 8, 10000.0f}, Shape{2, 33, 4, 16, 500000.0f},
                 Shape{1, 128, 2, 64, 10000.0f}}) {
    SCOPED_TRACE(shape({s.B, s.T, s.NH, s.HS}));
    const size_t n = size_t(s.B) * s.T * s.NH * s.HS;
    const Vec x0 = rng.vec(n, -2.0f, 2.0f);
    Vec x = x0, x_ref = x0;
    ntp::cpu::rope_forward(x.data(), s.B, s.T, s.NH, s.HS, s.theta);
    ntp::ref::rope_forward(x_ref.data(), s.B, s.T, s.NH, s.HS, s.theta);
    EXPECT_CLOSE(x, x_ref, kTol);
    EXPECT_GT(rel_err(x, x0), s.T > 1 ? 1e-3 : -1.0) << "positions after the first must rotate";

    const Vec g0 = rng.vec(n);
    Vec g = g0, g_ref = g0;
    ntp::cpu::rope_backward(g.data(), s.B, s.T, s.NH, s.HS, s.theta);
    ntp::ref::rope_backward(g_ref.data(), s.B, s.T, s.NH, s.HS, s.theta);
    EXPECT_CLOSE(g, g_ref, kTol);
    // The backward is the transpose: <R x, g> == <x, R^T g>.
    EXPECT_NEAR(dot(x_ref, g0), dot(x0, g_ref), 1e-4 * (1.0 + std::fabs(dot(x_ref, g0))));
  }
}

TEST(Rope, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const int B = 2, T = 4, NH = 2, HS = 6;
  Vec x = rng.vec(B * T * NH * HS), proj = rng.vec(x.size()), out(x.size());
  auto loss = [&] {
    out = x;
    ntp::ref::rope_forward(out.data(), B, T, NH, HS, 100.0f);
    return dot(out, proj);
  };
  Vec dx = proj;
  ntp::ref::rope_backward(dx.data(), B, T, NH, HS, 100.0f);
  EXPECT_LE(fd_err(dx, numeric_grad(x, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
TEST(GqaPack, ForwardBackward) {
  SEEDED_RNG(rng);
  struct Shape {
    int BT, NH, NKV, HS;
  };
  for (auto s : {Shape{1, 1, 1, 1}, Shape{5, 4, 2, 8}, Shape{7, 6, 2, 16}, Shape{3, 8, 1, 4}, Shape{64, 4, 4, 32}}) {
    SCOPED_TRACE(shape({s.BT, s.NH, s.NKV, s.HS}));
    const size_t nq = size_t(s.BT) * s.NH * s.HS, nkv = size_t(s.BT) * s.NKV * s.HS;
    Vec q = rng.vec(nq), k = rng.vec(nkv), v = rng.vec(nkv);
    Vec qkv(3 * nq), qkv_ref(3 * nq);
    ntp::cpu::gqa_pack_forward(qkv.data(), q.data(), k.data(), v.data(), s.BT, s.NH, s.NKV, s.HS);
    ntp::ref::gqa_pack_forward(qkv_ref.data(), q.data(), k.data(), v.data(), s.BT, s.NH, s.NKV, s.HS);
    EXPECT_CLOSE(qkv, qkv_ref, kTol);

    const Vec dqkv = rng.vec(3 * nq);
    Vec dq = rng.vec(nq), dk = rng.vec(nkv), dv = rng.vec(nkv);
    Vec dq_ref = dq, dk_ref = dk, dv_ref = dv;
    ntp::cpu::gqa_pack_backward(dq.data(), dk.data(), dv.data(), dqkv.data(), s.BT, s.NH, s.NKV, s.HS);
    ntp::ref::gqa_pack_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dqkv.data(), s.BT, s.NH, s.NKV, s.HS);
    EXPECT_CLOSE(dq, dq_ref, kTol);
    EXPECT_CLOSE(dk, dk_ref, kTol);
    EXPECT_CLOSE(dv, dv_ref, kTol);
  }
}

TEST(GqaPack, ReferenceBackwardIsTheTranspose) {
  // The pack is linear: <pack(q, k, v), g> == <q, dq> + <k, dk> + <v, dv> for the backward's output.
  SEEDED_RNG(rng);
  const int BT = 3, NH = 6, NKV = 2, HS = 4;
  Vec q = rng.vec(BT * NH * HS), k = rng.vec(BT * NKV * HS), v = rng.vec(BT * NKV * HS), g = rng.vec(3 * q.size());
  Vec qkv(g.size()), dq(q.size(), 0.0f), dk(k.size(), 0.0f), dv(v.size(), 0.0f);
  ntp::ref::gqa_pack_forward(qkv.data(), q.data(), k.data(), v.data(), BT, NH, NKV, HS);
  ntp::ref::gqa_pack_backward(dq.data(), dk.data(), dv.data(), g.data(), BT, NH, NKV, HS);
  EXPECT_NEAR(dot(qkv, g), dot(q, dq) + dot(k, dk) + dot(v, dv), 1e-4);
  // Query head 1 reads key/value head 0 (3 query heads per group).
  EXPECT_EQ(qkv[(0 * NH + 1) * 3 * HS + HS], k[0]);
  EXPECT_EQ(qkv[(0 * NH + 3) * 3 * HS + 2 * HS], v[HS]);
}

// ---------------------------------------------------------------------------------------------
TEST(Attention, ForwardBackward) {
  SEEDED_RNG(rng);
  struct Shape {
    int B, T, NH, HS;
  };
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 1, 3, 5}, Shape{2, 5, 3, 5}, Shape{3, 17, 4, 8}, Shape{2, 33, 1, 7},
                  Shape{1, 64, 2, 16}}) {
    SCOPED_TRACE(shape({s.B, s.T, s.NH, s.HS}));
    const size_t nqkv = static_cast<size_t>(s.B) * s.T * s.NH * 3 * s.HS;
    const size_t nout = static_cast<size_t>(s.B) * s.T * s.NH * s.HS;
    const size_t natt = static_cast<size_t>(s.B) * s.NH * s.T * s.T;
    Vec qkv = rng.vec(nqkv, -2.0f, 2.0f), dout = rng.vec(nout);
    Vec out = rng.vec(nout), att = rng.vec(natt);  // garbage: the forward overwrites, mask included
    Vec out_ref(nout), att_ref(natt);
    ntp::cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
    ntp::ref::attention_forward(out_ref.data(), att_ref.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
    EXPECT_CLOSE(out, out_ref, kTol);
    EXPECT_CLOSE(att, att_ref, kTol);
    for (int bh = 0; bh < s.B * s.NH; bh++)
      for (int t = 0; t < s.T; t++)
        for (int j = t + 1; j < s.T; j++) ASSERT_EQ(att[(static_cast<size_t>(bh) * s.T + t) * s.T + j], 0.0f);

    Vec dqkv = rng.vec(nqkv), dqkv_ref = dqkv;
    Vec scratch = rng.vec(natt), scratch_ref = rng.vec(natt);
    ntp::cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.NH,
                                 s.HS);
    ntp::ref::attention_backward(dqkv_ref.data(), scratch_ref.data(), dout.data(), qkv.data(), att_ref.data(), s.B, s.T,
                                 s.NH, s.HS);
    EXPECT_CLOSE(dqkv, dqkv_ref, kTol);
  }
}

TEST(Attention, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const int B = 2, T = 4, NH = 3, HS = 5;
  const size_t nqkv = static_cast<size_t>(B) * T * NH * 3 * HS, nout = static_cast<size_t>(B) * T * NH * HS;
  Vec qkv = rng.vec(nqkv, -1.5f, 1.5f), proj = rng.vec(nout);
  Vec out(nout), att(static_cast<size_t>(B) * NH * T * T), scratch(att.size());
  auto loss = [&] {
    ntp::ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    return dot(out, proj);
  };
  loss();
  Vec dqkv(nqkv, 0.0f);
  ntp::ref::attention_backward(dqkv.data(), scratch.data(), proj.data(), qkv.data(), att.data(), B, T, NH, HS);
  EXPECT_LE(fd_err(dqkv, numeric_grad(qkv, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
// The full 3-stage protocol on one rank (no all-reduce needed); returns losses, fills dlogits.
template <class RowMax, class Sums, class Loss, class Backward>
Vec crossentropy_single_rank(Vec& dlogits, const Vec& logits, const std::vector<int>& targets,
                             const std::vector<int>& local_row, int BT, int Vl, float dloss, RowMax row_max_fn,
                             Sums sums_fn, Loss loss_fn, Backward backward_fn) {
  Vec row_max(BT), sums(2 * BT), losses(BT);
  row_max_fn(row_max.data(), logits.data(), BT, Vl);
  sums_fn(sums.data(), logits.data(), row_max.data(), targets.data(), local_row.data(), BT, Vl);
  loss_fn(losses.data(), row_max.data(), sums.data(), BT);
  dlogits.resize(logits.size());
  backward_fn(dlogits.data(), logits.data(), row_max.data(), sums.data(), targets.data(), local_row.data(), dloss, BT,
              Vl);
  return losses;
}

Vec ce_fast(Vec& dlogits, const Vec& logits, const std::vector<int>& targets, const std::vector<int>& local_row, int BT,
            int Vl, float dloss) {
  return crossentropy_single_rank(dlogits, logits, targets, local_row, BT, Vl, dloss, ntp::cpu::crossentropy_local_max,
                                  ntp::cpu::crossentropy_local_sums, ntp::cpu::crossentropy_loss,
                                  ntp::cpu::crossentropy_backward);
}

Vec ce_ref(Vec& dlogits, const Vec& logits, const std::vector<int>& targets, const std::vector<int>& local_row, int BT,
           int Vl, float dloss) {
  return crossentropy_single_rank(dlogits, logits, targets, local_row, BT, Vl, dloss, ntp::ref::crossentropy_local_max,
                                  ntp::ref::crossentropy_local_sums, ntp::ref::crossentropy_loss,
                                  ntp::ref::crossentropy_backward);
}

std::vector<int> identity_rows(int V) {
  std::vector<int> r(V);
  for (int i = 0; i < V; i++) r[i] = i;
  return r;
}

TEST(CrossEntropy, FullVocabulary) {
  SEEDED_RNG(rng);
  for (auto [BT, V] : {std::pair{1, 1}, std::pair{3, 7}, std::pair{16, 100}, std::pair{5, 1000}}) {
    SCOPED_TRACE(shape({BT, V}));
    Vec logits = rng.vec(static_cast<size_t>(BT) * V, -5.0f, 5.0f);
    std::vector<int> targets(BT), rows = identity_rows(V);
    for (int& t : targets) t = rng.uniform(0, V - 1);
    const float dloss = 1.0f / BT;
    Vec dlogits, dlogits_ref;
    Vec losses = ce_fast(dlogits, logits, targets, rows, BT, V, dloss);
    Vec losses_ref = ce_ref(dlogits_ref, logits, targets, rows, BT, V, dloss);
    EXPECT_CLOSE(losses, losses_ref, kTol);
    EXPECT_CLOSE(dlogits, dlogits_ref, kTol);

    // The backward may run in place (dlogits aliasing logits).
    Vec row_max(BT), sums(2 * BT), inplace = logits;
    ntp::cpu::crossentropy_local_max(row_max.data(), logits.data(), BT, V);
    ntp::cpu::crossentropy_local_sums(sums.data(), logits.data(), row_max.data(), targets.data(), rows.data(), BT, V);
    ntp::cpu::crossentropy_backward(inplace.data(), inplace.data(), row_max.data(), sums.data(), targets.data(),
                                    rows.data(), dloss, BT, V);
    EXPECT_CLOSE(inplace, dlogits, 0.0);
  }
}

TEST(CrossEntropy, EmptyLocalVocabulary) {
  SEEDED_RNG(rng);
  const int BT = 4, V = 6;
  std::vector<int> targets(BT), rows(V, -1);
  for (int& t : targets) t = rng.uniform(0, V - 1);
  Vec none;
  for (auto row_max_fn : {ntp::cpu::crossentropy_local_max, ntp::ref::crossentropy_local_max}) {
    Vec row_max(BT, 0.0f);
    row_max_fn(row_max.data(), none.data(), BT, 0);
    for (float m : row_max) EXPECT_EQ(m, -INFINITY);
  }
  for (auto sums_fn : {ntp::cpu::crossentropy_local_sums, ntp::ref::crossentropy_local_sums}) {
    Vec row_max(BT, 1.5f), sums(2 * BT, 7.0f);  // the global max, as after the all-reduce
    sums_fn(sums.data(), none.data(), row_max.data(), targets.data(), rows.data(), BT, 0);
    for (float s : sums) EXPECT_EQ(s, 0.0f);
  }
}

TEST(CrossEntropy, VocabParallelMatchesSingleRank) {
  SEEDED_RNG(rng);
  const int BT = 6, V = 23, R = 3;
  for (bool idle_rank : {false, true}) {  // idle_rank: rank 2 owns no token at all (Vl = 0)
    SCOPED_TRACE(idle_rank ? "rank 2 idle" : "all ranks own tokens");
    // Random (so non-contiguous and, with V = 23, uneven) ownership.
    std::vector<int> owner(V);
    for (int& o : owner) o = rng.uniform(0, idle_rank ? R - 2 : R - 1);
    Vec logits = rng.vec(static_cast<size_t>(BT) * V, -5.0f, 5.0f);
    std::vector<int> targets(BT);
    for (int& t : targets) t = rng.uniform(0, V - 1);
    const float dloss = 1.0f / BT;

    Vec dlogits_full;
    Vec losses_full = ce_fast(dlogits_full, logits, targets, identity_rows(V), BT, V, dloss);

    // Shard: rank r holds the columns of the tokens it owns, in ascending token order.
    std::vector<std::vector<int>> local_row(R, std::vector<int>(V, -1));
    std::vector<std::vector<int>> tokens_of(R);
    for (int tok = 0; tok < V; tok++) {
      local_row[owner[tok]][tok] = static_cast<int>(tokens_of[owner[tok]].size());
      tokens_of[owner[tok]].push_back(tok);
    }
    std::vector<Vec> shard(R);
    for (int r = 0; r < R; r++) {
      const int Vl = static_cast<int>(tokens_of[r].size());
      shard[r].resize(static_cast<size_t>(BT) * Vl);
      for (int bt = 0; bt < BT; bt++)
        for (int j = 0; j < Vl; j++) shard[r][bt * Vl + j] = logits[bt * V + tokens_of[r][j]];
    }
    auto vl = [&](int r) { return static_cast<int>(tokens_of[r].size()); };

    // Stage 1 + all-reduce MAX.
    Vec row_max(BT, -INFINITY);
    for (int r = 0; r < R; r++) {
      Vec m(BT);
      ntp::cpu::crossentropy_local_max(m.data(), shard[r].data(), BT, vl(r));
      for (int bt = 0; bt < BT; bt++) row_max[bt] = std::max(row_max[bt], m[bt]);
    }
    // Stage 2 + all-reduce SUM.
    Vec sums(2 * BT, 0.0f);
    for (int r = 0; r < R; r++) {
      Vec s(2 * BT);
      ntp::cpu::crossentropy_local_sums(s.data(), shard[r].data(), row_max.data(), targets.data(), local_row[r].data(),
                                        BT, vl(r));
      for (int i = 0; i < 2 * BT; i++) sums[i] += s[i];
    }
    // Stage 3 on every rank: identical losses, and each rank's dlogits are its columns of the full ones.
    for (int r = 0; r < R; r++) {
      SCOPED_TRACE("rank " + std::to_string(r));
      Vec losses(BT);
      ntp::cpu::crossentropy_loss(losses.data(), row_max.data(), sums.data(), BT);
      EXPECT_CLOSE(losses, losses_full, kTol);
      Vec d = shard[r];  // in place, as the engine does
      ntp::cpu::crossentropy_backward(d.data(), d.data(), row_max.data(), sums.data(), targets.data(),
                                      local_row[r].data(), dloss, BT, vl(r));
      Vec expect(d.size());
      for (int bt = 0; bt < BT; bt++)
        for (int j = 0; j < vl(r); j++) expect[bt * vl(r) + j] = dlogits_full[bt * V + tokens_of[r][j]];
      EXPECT_CLOSE(d, expect, kTol);
    }
  }
}

TEST(CrossEntropy, ReferenceMatchesFiniteDifferences) {
  SEEDED_RNG(rng);
  const int BT = 3, V = 9;
  Vec logits = rng.vec(BT * V, -3.0f, 3.0f), dlogits;
  std::vector<int> targets(BT), rows = identity_rows(V);
  for (int& t : targets) t = rng.uniform(0, V - 1);
  auto loss = [&] {
    Vec unused, losses = ce_ref(unused, logits, targets, rows, BT, V, 1.0f);
    double s = 0.0;
    for (float l : losses) s += l;
    return s;
  };
  ce_ref(dlogits, logits, targets, rows, BT, V, 1.0f);
  EXPECT_LE(fd_err(dlogits, numeric_grad(logits, loss)), kFdTol);
}

// ---------------------------------------------------------------------------------------------
TEST(Determinism, ReductionsRepeatBitwise) {
  // Cross-row reductions must not depend on thread timing: two runs give identical bits.
  SEEDED_RNG(rng);
  const int BT = 513, C = 97;
  Vec inp = rng.vec(BT * C), w = rng.vec(C), b = rng.vec(C), dout = rng.vec(BT * C);
  Vec out(BT * C), mean(BT), rstd(BT);
  ntp::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), BT, C);
  std::vector<int> tokens(BT), rows = identity_rows(4);
  for (int& t : tokens) t = rng.uniform(0, 3);
  auto run = [&] {
    Vec dinp(BT * C, 0.0f), dw(C, 0.0f), db(C, 0.0f), dbias(C, 0.0f), dwte(4 * C, 0.0f), dwpe(C, 0.0f);
    ntp::cpu::layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), mean.data(),
                                 rstd.data(), BT, C);
    ntp::cpu::bias_backward(dbias.data(), dout.data(), BT, C);
    ntp::cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), rows.data(), BT, C);
    ntp::cpu::position_embedding_backward(dwpe.data(), dout.data(), BT, 1, C);
    Vec all;
    for (const Vec* v : {&dinp, &dw, &db, &dbias, &dwte, &dwpe}) all.insert(all.end(), v->begin(), v->end());
    all.push_back(static_cast<float>(ntp::cpu::sum_squares(dout.data(), BT * C)));
    return all;
  };
  const Vec first = run();
  for (int rep = 0; rep < 3; rep++) {
    const Vec again = run();
    EXPECT_TRUE(std::equal(first.begin(), first.end(), again.begin()));
  }
}

}  // namespace
