// The CUDA backend against the CPU kernels (kernels/cpu) on fresh random inputs, through the
// Backend seam (device memory, copies and every kernel), forward and backward: fp32 within 1e-5
// relative. The CudaBf16 tests run the GEMM kernels (matmul, attention) of a --precision bf16
// backend: within 2e-2 relative of the fp32 CPU kernels, and where the CPU can reproduce the
// bf16 arithmetic (bf16-rounded operands, fp32 accumulation), within fp32 summation error of it.
// Every test skips, naming the CUDA error, where no GPU is usable (cudaGetDeviceCount fails with
// cudaErrorInsufficientDriver (35) or cudaErrorNoDevice (100), or finds none).
// Every test draws a fresh seed; it is printed on failure.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/gqa.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/residual.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernel_check.hpp"

namespace ntp {
std::unique_ptr<Backend> make_cuda_backend(int local_rank, Precision precision);  // src/backend/backend_cuda.cu
}

namespace {

using ntp::test::Vec;
using ntp::test::rel_err;
using Ints = std::vector<int>;
using ntp::cpu::WeightLayout;

constexpr double kTol = 1e-5;
// bf16 GEMMs against fp32 ones: operands rounded to 8 significant bits (2^-9 relative each).
constexpr double kTolBf16 = 2e-2;
// bf16 GEMMs against the CPU on the same bf16-rounded operands: the products are exact in fp32,
// so only the order and rounding of the fp32 sums differ. Well below the rounding of the
// operands themselves (~1e-3 here), so it shows the operands really were bf16.
constexpr double kTolBf16Operands = 1e-4;

std::string shape(std::initializer_list<long> dims) {
  std::string s = "shape=";
  for (long d : dims) s += std::to_string(d) + " ";
  return s;
}

// Empty when a GPU is usable; otherwise why not.
std::string gpu_unavailable() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(e) + " (" + std::to_string(int(e)) +
           "): " + cudaGetErrorString(e);
  }
  if (count == 0) return "cudaGetDeviceCount found no GPU";
  return "";
}

// x rounded to the nearest bf16, ties to even (__float2bfloat16_rn for finite x).
float round_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  u += 0x7fffu + ((u >> 16) & 1u);
  u &= 0xffff0000u;
  std::memcpy(&x, &u, sizeof x);
  return x;
}
Vec round_bf16(Vec v) {
  for (float& x : v) x = round_bf16(x);
  return v;
}

// A vocabulary-parallel ownership map: local rows in ascending token order, -1 if not owned.
Ints random_local_rows(ntp::test::Rng& rng, int V, int& Vl) {
  Ints local_row(V);
  Vl = 0;
  for (int tok = 0; tok < V; tok++) local_row[tok] = rng.uniform(0, 1) ? Vl++ : -1;
  return local_row;
}

// Each test gets a fresh CUDA backend on GPU 0 and device copies of its host vectors.
class Cuda : public ::testing::Test {
 protected:
  explicit Cuda(ntp::Precision precision = ntp::Precision::Fp32) : precision_(precision) {}

  void SetUp() override {
    const std::string why = gpu_unavailable();
    if (!why.empty()) GTEST_SKIP() << "no usable GPU, CUDA tests skipped: " << why;
    be_ = ntp::make_cuda_backend(0, precision_);
  }
  void TearDown() override {
    for (float* p : floats_) be_->release(p);
    for (int* p : ints_) be_->release_ints(p);
    be_.reset();
  }

  float* dev(const Vec& h) {
    float* p = be_->allocate(h.size());
    floats_.push_back(p);
    be_->from_host(p, h.data(), h.size());
    return p;
  }
  float* dev(size_t n) { return dev(Vec(n, 0.0f)); }
  int* dev(const Ints& h) {
    int* p = be_->allocate_ints(h.size());
    ints_.push_back(p);
    be_->ints_from_host(p, h.data(), h.size());
    return p;
  }
  Vec host(const float* d, size_t n) {
    Vec h(n);
    be_->to_host(h.data(), d, n);
    return h;
  }

  const ntp::Precision precision_;
  std::unique_ptr<ntp::Backend> be_;
  std::vector<float*> floats_;
  std::vector<int*> ints_;
};

// The same on a --precision bf16 backend.
class CudaBf16 : public Cuda {
 protected:
  CudaBf16() : Cuda(ntp::Precision::Bf16) {}
};

// ---------------------------------------------------------------------------------------------
TEST_F(Cuda, Memory) {
  SEEDED_RNG(rng);
  const size_t n = 1000;
  float* a = dev(n);
  EXPECT_EQ(host(a, n), Vec(n, 0.0f)) << "allocate() must zero";
  const Vec x = rng.vec(n);
  be_->from_host(a, x.data(), n);
  EXPECT_EQ(host(a, n), x);
  float* b = dev(n);
  be_->copy(b, a, n);
  EXPECT_EQ(host(b, n), x);
  Vec h(n, 0.0f);  // copy() to and from host memory also works (cudaMemcpyDefault)
  be_->copy(h.data(), b, n);
  EXPECT_EQ(h, x);
  be_->zero(b, n / 2);
  const Vec hb = host(b, n);
  EXPECT_EQ(Vec(hb.begin(), hb.begin() + n / 2), Vec(n / 2, 0.0f));
  EXPECT_EQ(Vec(hb.begin() + n / 2, hb.end()), Vec(x.begin() + n / 2, x.end()));
}

TEST_F(Cuda, Residual) {
  SEEDED_RNG(rng);
  for (long N : {1L, 7L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({N}));
    const Vec a = rng.vec(N), b = rng.vec(N), dout = rng.vec(N);
    Vec out(N);
    ntp::cpu::residual_forward(out.data(), a.data(), b.data(), N);
    float* d_out = dev(size_t(N));
    be_->residual_forward(d_out, dev(a), dev(b), N);
    EXPECT_CLOSE(host(d_out, N), out, kTol);

    Vec da = rng.vec(N), db = rng.vec(N);
    float *d_da = dev(da), *d_db = dev(db);
    ntp::cpu::residual_backward(da.data(), db.data(), dout.data(), N);
    be_->residual_backward(d_da, d_db, dev(dout), N);
    EXPECT_CLOSE(host(d_da, N), da, kTol);
    EXPECT_CLOSE(host(d_db, N), db, kTol);
  }
}

TEST_F(Cuda, Gelu) {
  SEEDED_RNG(rng);
  for (long N : {1L, 7L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({N}));
    const Vec x = rng.vec(N, -6.0f, 6.0f), dout = rng.vec(N);
    Vec out(N);
    ntp::cpu::gelu_forward(out.data(), x.data(), N);
    float *d_x = dev(x), *d_out = dev(size_t(N));
    be_->gelu_forward(d_out, d_x, N);
    EXPECT_CLOSE(host(d_out, N), out, kTol);

    Vec dx = rng.vec(N);
    float* d_dx = dev(dx);
    ntp::cpu::gelu_backward(dx.data(), x.data(), dout.data(), N);
    be_->gelu_backward(d_dx, d_x, dev(dout), N);
    EXPECT_CLOSE(host(d_dx, N), dx, kTol);
  }
}

TEST_F(Cuda, Embedding) {
  SEEDED_RNG(rng);
  struct Shape {
    int B, T, C, V;
  };
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{2, 5, 13, 11}, Shape{4, 32, 100, 64}, Shape{3, 17, 300, 257},
                  Shape{2, 64, 40, 3}}) {  // the last: many repeats of few tokens
    SCOPED_TRACE(shape({s.B, s.T, s.C, s.V}));
    const int BT = s.B * s.T, C = s.C;
    int Vl = 0;
    const Ints local_row = random_local_rows(rng, s.V, Vl);
    Ints tokens(BT);
    for (int& t : tokens) t = rng.uniform(0, s.V - 1);
    const Vec wte = rng.vec(size_t(Vl) * C), wpe = rng.vec(size_t(s.T) * C);
    int *d_tok = dev(tokens), *d_rows = dev(local_row);

    Vec out(size_t(BT) * C);
    float* d_out = dev(rng.vec(out.size()));  // garbage: the forward overwrites
    ntp::cpu::embedding_forward(out.data(), tokens.data(), wte.data(), local_row.data(), BT, C);
    be_->embedding_forward(d_out, d_tok, dev(wte), d_rows, BT, C);
    EXPECT_CLOSE(host(d_out, out.size()), out, 0.0);
    ntp::cpu::position_embedding_forward(out.data(), wpe.data(), s.B, s.T, C);
    be_->position_embedding_forward(d_out, dev(wpe), s.B, s.T, C);
    EXPECT_CLOSE(host(d_out, out.size()), out, kTol);

    const Vec dout = rng.vec(size_t(BT) * C);
    Vec dwte = rng.vec(wte.size()), dwpe = rng.vec(wpe.size());
    float *d_dwte = dev(dwte), *d_dwpe = dev(dwpe), *d_dout = dev(dout);
    ntp::cpu::embedding_backward(dwte.data(), dout.data(), tokens.data(), local_row.data(), BT, C);
    be_->embedding_backward(d_dwte, d_dout, d_tok, d_rows, BT, C);
    EXPECT_CLOSE(host(d_dwte, dwte.size()), dwte, kTol);
    ntp::cpu::position_embedding_backward(dwpe.data(), dout.data(), s.B, s.T, C);
    be_->position_embedding_backward(d_dwpe, d_dout, s.B, s.T, C);
    EXPECT_CLOSE(host(d_dwpe, dwpe.size()), dwpe, kTol);
  }
}

TEST_F(Cuda, LayerNorm) {
  SEEDED_RNG(rng);
  for (auto [BT, C] : {std::pair{1, 1}, std::pair{3, 7}, std::pair{64, 768}, std::pair{300, 97}}) {
    SCOPED_TRACE(shape({BT, C}));
    const size_t n = size_t(BT) * C;
    const Vec x = rng.vec(n, -2.0f, 3.0f), w = rng.vec(C), b = rng.vec(C), dout = rng.vec(n);
    Vec out(n), mean(BT), rstd(BT);
    ntp::cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), BT, C);
    float *d_out = dev(n), *d_mean = dev(size_t(BT)), *d_rstd = dev(size_t(BT));
    float *d_x = dev(x), *d_w = dev(w);
    be_->layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, dev(b), BT, C);
    EXPECT_CLOSE(host(d_out, n), out, kTol);
    EXPECT_CLOSE(host(d_mean, BT), mean, kTol);
    EXPECT_CLOSE(host(d_rstd, BT), rstd, kTol);

    Vec dx = rng.vec(n), dw = rng.vec(C), db = rng.vec(C);
    float *d_dx = dev(dx), *d_dw = dev(dw), *d_db = dev(db);
    ntp::cpu::layernorm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), mean.data(),
                                 rstd.data(), BT, C);
    be_->layernorm_backward(d_dx, d_dw, d_db, dev(dout), d_x, d_w, d_mean, d_rstd, BT, C);
    EXPECT_CLOSE(host(d_dx, n), dx, kTol);
    EXPECT_CLOSE(host(d_dw, C), dw, kTol);
    EXPECT_CLOSE(host(d_db, C), db, kTol);
  }
}

TEST_F(Cuda, RmsNorm) {
  SEEDED_RNG(rng);
  for (auto [BT, C] : {std::pair{1, 1}, std::pair{3, 7}, std::pair{64, 768}, std::pair{300, 97}}) {
    SCOPED_TRACE(shape({BT, C}));
    const size_t n = size_t(BT) * C;
    const Vec x = rng.vec(n, -2.0f, 3.0f), w = rng.vec(C), dout = rng.vec(n);
    Vec out(n), rstd(BT);
    ntp::cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), BT, C);
    float *d_out = dev(n), *d_rstd = dev(size_t(BT)), *d_x = dev(x), *d_w = dev(w);
    be_->rmsnorm_forward(d_out, d_rstd, d_x, d_w, BT, C);
    EXPECT_CLOSE(host(d_out, n), out, kTol);
    EXPECT_CLOSE(host(d_rstd, BT), rstd, kTol);

    Vec dx = rng.vec(n), dw = rng.vec(C);
    float *d_dx = dev(dx), *d_dw = dev(dw);
    ntp::cpu::rmsnorm_backward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), BT, C);
    be_->rmsnorm_backward(d_dx, d_dw, dev(dout), d_x, d_w, d_rstd, BT, C);
    EXPECT_CLOSE(host(d_dx, n), dx, kTol);
    EXPECT_CLOSE(host(d_dw, C), dw, kTol);
  }
}

TEST_F(Cuda, SwiGlu) {
  SEEDED_RNG(rng);
  for (long N : {1L, 7L, 1000L, 4099L}) {
    SCOPED_TRACE(shape({N}));
    const Vec g = rng.vec(N, -8.0f, 8.0f), u = rng.vec(N, -2.0f, 2.0f), dout = rng.vec(N);
    Vec out(N);
    ntp::cpu::swiglu_forward(out.data(), g.data(), u.data(), N);
    float *d_g = dev(g), *d_u = dev(u), *d_out = dev(size_t(N));
    be_->swiglu_forward(d_out, d_g, d_u, N);
    EXPECT_CLOSE(host(d_out, N), out, kTol);

    Vec dg = rng.vec(N), du = rng.vec(N);
    float *d_dg = dev(dg), *d_du = dev(du);
    ntp::cpu::swiglu_backward(dg.data(), du.data(), g.data(), u.data(), dout.data(), N);
    be_->swiglu_backward(d_dg, d_du, d_g, d_u, dev(dout), N);
    EXPECT_CLOSE(host(d_dg, N), dg, kTol);
    EXPECT_CLOSE(host(d_du, N), du, kTol);
  }
}

TEST_F(Cuda, Rope) {
  SEEDED_RNG(rng);
  struct Shape {
    int B, T, NH, HS;
    float theta;
  };
  for (Shape s : {Shape{1, 1, 1, 2, 10000.0f}, Shape{2, 33, 4, 16, 500000.0f}, Shape{1, 1024, 2, 128, 500000.0f}}) {
    SCOPED_TRACE(shape({s.B, s.T, s.NH, s.HS}));
    const size_t n = size_t(s.B) * s.T * s.NH * s.HS;
    Vec x = rng.vec(n, -2.0f, 2.0f), g = rng.vec(n);
    float *d_x = dev(x), *d_g = dev(g);
    ntp::cpu::rope_forward(x.data(), s.B, s.T, s.NH, s.HS, s.theta);
    be_->rope_forward(d_x, s.B, s.T, s.NH, s.HS, s.theta);
    EXPECT_CLOSE(host(d_x, n), x, kTol);
    ntp::cpu::rope_backward(g.data(), s.B, s.T, s.NH, s.HS, s.theta);
    be_->rope_backward(d_g, s.B, s.T, s.NH, s.HS, s.theta);
    EXPECT_CLOSE(host(d_g, n), g, kTol);
  }
}

TEST_F(Cuda, GqaPack) {
  SEEDED_RNG(rng);
  struct Shape {
    int BT, NH, NKV, HS;
  };
  for (Shape s : {Shape{1, 1, 1, 1}, Shape{7, 6, 2, 16}, Shape{64, 32, 8, 128}}) {
    SCOPED_TRACE(shape({s.BT, s.NH, s.NKV, s.HS}));
    const size_t nq = size_t(s.BT) * s.NH * s.HS, nkv = size_t(s.BT) * s.NKV * s.HS;
    const Vec q = rng.vec(nq), k = rng.vec(nkv), v = rng.vec(nkv), dqkv = rng.vec(3 * nq);
    Vec qkv(3 * nq);
    ntp::cpu::gqa_pack_forward(qkv.data(), q.data(), k.data(), v.data(), s.BT, s.NH, s.NKV, s.HS);
    float* d_qkv = dev(3 * nq);
    be_->gqa_pack_forward(d_qkv, dev(q), dev(k), dev(v), s.BT, s.NH, s.NKV, s.HS);
    EXPECT_CLOSE(host(d_qkv, 3 * nq), qkv, 0.0);

    Vec dq = rng.vec(nq), dk = rng.vec(nkv), dv = rng.vec(nkv);
    float *d_dq = dev(dq), *d_dk = dev(dk), *d_dv = dev(dv);
    ntp::cpu::gqa_pack_backward(dq.data(), dk.data(), dv.data(), dqkv.data(), s.BT, s.NH, s.NKV, s.HS);
    be_->gqa_pack_backward(d_dq, d_dk, d_dv, dev(dqkv), s.BT, s.NH, s.NKV, s.HS);
    EXPECT_CLOSE(host(d_dq, nq), dq, kTol);
    EXPECT_CLOSE(host(d_dk, nkv), dk, kTol);
    EXPECT_CLOSE(host(d_dv, nkv), dv, kTol);
  }
}

// Every matmul test case: both weight layouts, a spread of shapes, with and without a bias.
struct MatmulCase {
  int BT, C, OC;
};
template <typename F>
void for_each_matmul_case(F&& test) {
  for (WeightLayout layout : {WeightLayout::OutIn, WeightLayout::InOut})
    for (MatmulCase s : {MatmulCase{1, 1, 1}, MatmulCase{5, 3, 7}, MatmulCase{64, 96, 40}, MatmulCase{130, 768, 300}})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(shape({s.BT, s.C, s.OC, layout == WeightLayout::OutIn ? 0 : 1, with_bias}));
        test(s, layout, with_bias);
      }
}

TEST_F(Cuda, Matmul) {
  SEEDED_RNG(rng);
  for_each_matmul_case([&](MatmulCase s, WeightLayout layout, bool with_bias) {
    const size_t ni = size_t(s.BT) * s.C, no = size_t(s.BT) * s.OC, nw = size_t(s.C) * s.OC;
    const Vec x = rng.vec(ni), w = rng.vec(nw), b = rng.vec(s.OC), dout = rng.vec(no);
    Vec out(no);
    ntp::cpu::matmul_forward(out.data(), x.data(), w.data(), with_bias ? b.data() : nullptr, s.BT, s.C, s.OC,
                             layout);
    float *d_out = dev(rng.vec(no)), *d_x = dev(x), *d_w = dev(w);
    be_->matmul_forward(d_out, d_x, d_w, with_bias ? dev(b) : nullptr, s.BT, s.C, s.OC, layout);
    EXPECT_CLOSE(host(d_out, no), out, kTol);

    // Backward accumulates; without a bias, also without dinp (as the engine's LM head).
    Vec dx = rng.vec(ni), dw = rng.vec(nw), db = rng.vec(s.OC);
    float *d_dx = dev(dx), *d_dw = dev(dw), *d_db = dev(db);
    ntp::cpu::matmul_backward(with_bias ? dx.data() : nullptr, dw.data(), with_bias ? db.data() : nullptr,
                              dout.data(), x.data(), w.data(), s.BT, s.C, s.OC, layout);
    be_->matmul_backward(with_bias ? d_dx : nullptr, d_dw, with_bias ? d_db : nullptr, dev(dout), d_x, d_w, s.BT,
                         s.C, s.OC, layout);
    EXPECT_CLOSE(host(d_dx, ni), dx, kTol);
    EXPECT_CLOSE(host(d_dw, nw), dw, kTol);
    EXPECT_CLOSE(host(d_db, s.OC), db, kTol);
  });
}

TEST_F(Cuda, Bias) {
  SEEDED_RNG(rng);
  for (auto [BT, OC] : {std::pair{1, 1}, std::pair{7, 33}, std::pair{200, 768}}) {
    SCOPED_TRACE(shape({BT, OC}));
    const size_t n = size_t(BT) * OC;
    Vec out = rng.vec(n), db = rng.vec(OC);
    const Vec b = rng.vec(OC), dout = rng.vec(n);
    float *d_out = dev(out), *d_db = dev(db);
    ntp::cpu::bias_forward(out.data(), b.data(), BT, OC);
    be_->bias_forward(d_out, dev(b), BT, OC);
    EXPECT_CLOSE(host(d_out, n), out, kTol);
    ntp::cpu::bias_backward(db.data(), dout.data(), BT, OC);
    be_->bias_backward(d_db, dev(dout), BT, OC);
    EXPECT_CLOSE(host(d_db, OC), db, kTol);
  }
}

// Attention shapes shared by the fp32 and bf16 tests; sizes of qkv, out and att.
struct AttentionCase {
  int B, T, NH, HS;
  size_t nqkv() const { return size_t(B) * T * NH * 3 * HS; }
  size_t nout() const { return size_t(B) * T * NH * HS; }
  size_t natt() const { return size_t(B) * NH * T * T; }
};
template <typename F>
void for_each_attention_case(F&& test) {
  for (AttentionCase s : {AttentionCase{1, 1, 1, 1}, AttentionCase{2, 5, 3, 4}, AttentionCase{2, 33, 2, 16},
                          AttentionCase{1, 100, 4, 64}}) {
    SCOPED_TRACE(shape({s.B, s.T, s.NH, s.HS}));
    test(s);
  }
}

TEST_F(Cuda, Attention) {
  SEEDED_RNG(rng);
  for_each_attention_case([&](AttentionCase s) {
    const size_t nqkv = s.nqkv(), nout = s.nout(), natt = s.natt();
    const Vec qkv = rng.vec(nqkv, -2.0f, 2.0f), dout = rng.vec(nout);
    Vec out(nout), att(natt);
    ntp::cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
    float *d_out = dev(rng.vec(nout)), *d_att = dev(rng.vec(natt)), *d_qkv = dev(qkv);
    be_->attention_forward(d_out, d_att, d_qkv, s.B, s.T, s.NH, s.HS);
    EXPECT_CLOSE(host(d_out, nout), out, kTol);
    EXPECT_CLOSE(host(d_att, natt), att, kTol);

    Vec dqkv = rng.vec(nqkv), scratch(natt);
    float* d_dqkv = dev(dqkv);
    ntp::cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.NH,
                                 s.HS);
    be_->attention_backward(d_dqkv, dev(rng.vec(natt)), dev(dout), d_qkv, d_att, s.B, s.T, s.NH, s.HS);
    EXPECT_CLOSE(host(d_dqkv, nqkv), dqkv, kTol);
  });
}

// bf16 GEMMs, fp32 bias and bias gradient (from the fp32 dout).
TEST_F(CudaBf16, Matmul) {
  SEEDED_RNG(rng);
  for_each_matmul_case([&](MatmulCase s, WeightLayout layout, bool with_bias) {
    const size_t ni = size_t(s.BT) * s.C, no = size_t(s.BT) * s.OC, nw = size_t(s.C) * s.OC;
    const Vec x = rng.vec(ni), w = rng.vec(nw), b = rng.vec(s.OC), dout = rng.vec(no);
    const Vec xr = round_bf16(x), wr = round_bf16(w), doutr = round_bf16(dout);
    const float* bias = with_bias ? b.data() : nullptr;
    Vec out(no), out_r(no);
    ntp::cpu::matmul_forward(out.data(), x.data(), w.data(), bias, s.BT, s.C, s.OC, layout);
    ntp::cpu::matmul_forward(out_r.data(), xr.data(), wr.data(), bias, s.BT, s.C, s.OC, layout);
    float *d_out = dev(rng.vec(no)), *d_x = dev(x), *d_w = dev(w);
    be_->matmul_forward(d_out, d_x, d_w, with_bias ? dev(b) : nullptr, s.BT, s.C, s.OC, layout);
    const Vec got = host(d_out, no);
    EXPECT_CLOSE(got, out, kTolBf16);
    EXPECT_CLOSE(got, out_r, kTolBf16Operands);

    // Backward accumulates; without a bias, also without dinp (as the engine's LM head).
    Vec dx = rng.vec(ni), dw = rng.vec(nw), db = rng.vec(s.OC);
    Vec dx_r = dx, dw_r = dw;
    float *d_dx = dev(dx), *d_dw = dev(dw), *d_db = dev(db);
    ntp::cpu::matmul_backward(with_bias ? dx.data() : nullptr, dw.data(), with_bias ? db.data() : nullptr,
                              dout.data(), x.data(), w.data(), s.BT, s.C, s.OC, layout);
    ntp::cpu::matmul_backward(with_bias ? dx_r.data() : nullptr, dw_r.data(), nullptr, doutr.data(), xr.data(),
                              wr.data(), s.BT, s.C, s.OC, layout);
    be_->matmul_backward(with_bias ? d_dx : nullptr, d_dw, with_bias ? d_db : nullptr, dev(dout), d_x, d_w, s.BT,
                         s.C, s.OC, layout);
    const Vec got_dx = host(d_dx, ni), got_dw = host(d_dw, nw);
    EXPECT_CLOSE(got_dx, dx, kTolBf16);
    EXPECT_CLOSE(got_dw, dw, kTolBf16);
    EXPECT_CLOSE(got_dx, dx_r, kTolBf16Operands);
    EXPECT_CLOSE(got_dw, dw_r, kTolBf16Operands);
    EXPECT_CLOSE(host(d_db, s.OC), db, kTol);
  });
}

// bf16 score and value GEMMs, fp32 softmax. The scores' operands are q and k, so att can be
// reproduced from bf16-rounded qkv; out and dqkv also go through bf16 copies of att and of the
// softmax gradient. The backward is given the CPU's att, so each direction sees the same inputs.
TEST_F(CudaBf16, Attention) {
  SEEDED_RNG(rng);
  for_each_attention_case([&](AttentionCase s) {
    const size_t nqkv = s.nqkv(), nout = s.nout(), natt = s.natt();
    const Vec qkv = rng.vec(nqkv, -2.0f, 2.0f), dout = rng.vec(nout);
    Vec out(nout), att(natt), out_r(nout), att_r(natt);
    ntp::cpu::attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.NH, s.HS);
    ntp::cpu::attention_forward(out_r.data(), att_r.data(), round_bf16(qkv).data(), s.B, s.T, s.NH, s.HS);
    float *d_out = dev(rng.vec(nout)), *d_att = dev(rng.vec(natt)), *d_qkv = dev(qkv);
    be_->attention_forward(d_out, d_att, d_qkv, s.B, s.T, s.NH, s.HS);
    const Vec got_att = host(d_att, natt);
    EXPECT_CLOSE(host(d_out, nout), out, kTolBf16);
    EXPECT_CLOSE(got_att, att, kTolBf16);
    EXPECT_CLOSE(got_att, att_r, kTolBf16Operands);

    Vec dqkv = rng.vec(nqkv), scratch(natt);
    float* d_dqkv = dev(dqkv);
    ntp::cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T, s.NH,
                                 s.HS);
    be_->attention_backward(d_dqkv, dev(rng.vec(natt)), dev(dout), d_qkv, dev(att), s.B, s.T, s.NH, s.HS);
    EXPECT_CLOSE(host(d_dqkv, nqkv), dqkv, kTolBf16);
  });
}

// The three stages on one rank of a vocabulary split (no all-reduce between them: one rank).
TEST_F(Cuda, CrossEntropy) {
  SEEDED_RNG(rng);
  for (auto [BT, V] : {std::pair{1, 2}, std::pair{5, 11}, std::pair{64, 1000}, std::pair{17, 50257}}) {
    SCOPED_TRACE(shape({BT, V}));
    int Vl = 0;
    const Ints local_row = random_local_rows(rng, V, Vl);
    Ints targets(BT);
    for (int& t : targets) t = rng.uniform(0, V - 1);
    const Vec logits = rng.vec(size_t(BT) * Vl, -5.0f, 5.0f);
    Vec mx(BT), sums(2 * BT), losses(BT), dlogits = logits;
    ntp::cpu::crossentropy_local_max(mx.data(), logits.data(), BT, Vl);
    ntp::cpu::crossentropy_local_sums(sums.data(), logits.data(), mx.data(), targets.data(), local_row.data(), BT, Vl);
    ntp::cpu::crossentropy_loss(losses.data(), mx.data(), sums.data(), BT);
    ntp::cpu::crossentropy_backward(dlogits.data(), dlogits.data(), mx.data(), sums.data(), targets.data(),
                                    local_row.data(), 0.37f, BT, Vl);

    float *d_logits = dev(logits), *d_mx = dev(size_t(BT)), *d_sums = dev(size_t(2 * BT)), *d_loss = dev(size_t(BT));
    int *d_tg = dev(targets), *d_rows = dev(local_row);
    be_->crossentropy_local_max(d_mx, d_logits, BT, Vl);
    EXPECT_CLOSE(host(d_mx, BT), mx, kTol);
    be_->crossentropy_local_sums(d_sums, d_logits, d_mx, d_tg, d_rows, BT, Vl);
    EXPECT_CLOSE(host(d_sums, 2 * BT), sums, kTol);
    be_->crossentropy_loss(d_loss, d_mx, d_sums, BT);
    EXPECT_CLOSE(host(d_loss, BT), losses, kTol);
    be_->crossentropy_backward(d_logits, d_logits, d_mx, d_sums, d_tg, d_rows, 0.37f, BT, Vl);  // in place
    EXPECT_CLOSE(host(d_logits, dlogits.size()), dlogits, kTol);
  }
}

TEST_F(Cuda, CrossEntropyNoLocalVocabulary) {
  const int BT = 3;
  float *d_mx = dev(size_t(BT)), *d_sums = dev(size_t(2 * BT));
  int *d_tg = dev(Ints{0, 1, 0}), *d_rows = dev(Ints{-1, -1});
  be_->crossentropy_local_max(d_mx, dev(size_t(1)), BT, 0);
  for (float m : host(d_mx, BT)) EXPECT_TRUE(std::isinf(m) && m < 0);
  be_->crossentropy_local_sums(d_sums, dev(size_t(1)), d_mx, d_tg, d_rows, BT, 0);
  EXPECT_EQ(host(d_sums, 2 * BT), Vec(2 * BT, 0.0f));
}

TEST_F(Cuda, AdamWAndSumSquares) {
  SEEDED_RNG(rng);
  for (long n : {1L, 13L, 1000L, 300001L}) {
    SCOPED_TRACE(shape({n}));
    Vec p = rng.vec(n), m = rng.vec(n, -0.1f, 0.1f), v = rng.vec(n, 0.0f, 0.01f);
    float *d_p = dev(p), *d_m = dev(m), *d_v = dev(v);
    for (int t = 1; t <= 3; t++) {
      const Vec g = rng.vec(n);
      ntp::cpu::adamw_update(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
      be_->adamw_update(d_p, dev(g), d_m, d_v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, t);
    }
    EXPECT_CLOSE(host(d_p, n), p, kTol);
    EXPECT_CLOSE(host(d_m, n), m, kTol);
    EXPECT_CLOSE(host(d_v, n), v, kTol);

    const double s = be_->sum_squares(d_p, n), s_ref = ntp::cpu::sum_squares(p.data(), n);
    const Vec hp = host(d_p, n);
    EXPECT_NEAR(s, ntp::cpu::sum_squares(hp.data(), n), 1e-12 * std::max(1.0, s_ref));
    EXPECT_EQ(s, be_->sum_squares(d_p, n)) << "sum_squares must be deterministic";
  }
  EXPECT_EQ(be_->sum_squares(nullptr, 0), 0.0);
}

// The reductions use no atomics: a rerun gives the same bits (llm.c's GPU test checks this for
// the whole step).
TEST_F(Cuda, BackwardReductionsAreDeterministic) {
  SEEDED_RNG(rng);
  const int B = 4, T = 64, C = 96, V = 7, BT = B * T;
  Ints tokens(BT), rows(V);
  for (int& t : tokens) t = rng.uniform(0, V - 1);
  for (int i = 0; i < V; i++) rows[i] = i;
  const Vec dout = rng.vec(size_t(BT) * C), x = rng.vec(size_t(BT) * C), w = rng.vec(C), b = rng.vec(C);
  float *d_dout = dev(dout), *d_x = dev(x), *d_w = dev(w);
  int *d_tok = dev(tokens), *d_rows = dev(rows);
  float *d_mean = dev(size_t(BT)), *d_rstd = dev(size_t(BT)), *d_out = dev(size_t(BT) * C);
  be_->layernorm_forward(d_out, d_mean, d_rstd, d_x, d_w, dev(b), BT, C);
  auto run = [&] {
    float *dwte = dev(size_t(V) * C), *dx = dev(size_t(BT) * C), *dw = dev(size_t(C)), *db = dev(size_t(C));
    be_->embedding_backward(dwte, d_dout, d_tok, d_rows, BT, C);
    be_->layernorm_backward(dx, dw, db, d_dout, d_x, d_w, d_mean, d_rstd, BT, C);
    be_->bias_backward(db, d_dout, BT, C);
    Vec all = host(dwte, size_t(V) * C);
    for (const Vec& part : {host(dx, size_t(BT) * C), host(dw, C), host(db, C)}) all.insert(all.end(), part.begin(), part.end());
    return all;
  };
  const Vec first = run(), second = run();
  ASSERT_EQ(first.size(), second.size());
  EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0);
}

}  // namespace
