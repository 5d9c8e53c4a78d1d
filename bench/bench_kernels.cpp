// Every CPU kernel, forward and backward, at the `small` and `gpt2` shapes (single process).
//
//   fast/<shape>/<kernel>   kernels/cpu (what the engine runs)
//   ref/small/<kernel>      the frozen naive reference (kernels/cpu/reference), small shapes only
//   sgemm/<shape>/<kernel>  plain cblas_sgemm calls with the same shapes as the kernel's GEMMs
//
// Counters: GFLOP/s from analytic FLOP counts (2 per multiply-add; attention's T x T products
// counted in full, as model_config's training_flops does) for matmul and attention; GB/s of
// compulsory memory traffic (each array read or written once) for everything else.
#include <cblas.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/reference/adamw.hpp"
#include "kernels/cpu/reference/attention.hpp"
#include "kernels/cpu/reference/cross_entropy.hpp"
#include "kernels/cpu/reference/embedding.hpp"
#include "kernels/cpu/reference/gelu.hpp"
#include "kernels/cpu/reference/layernorm.hpp"
#include "kernels/cpu/reference/matmul.hpp"
#include "kernels/cpu/reference/residual.hpp"
#include "kernels/cpu/residual.hpp"

namespace ntp::bench {
namespace {

using Vec = std::vector<float>;
using cpu::WeightLayout;

struct Shape {
  const char* name;
  int B, T, d, H, V, L;
  int BT() const { return B * T; }
  int HS() const { return d / H; }
  // Parameter count of the whole model (context = T), LM head tied.
  long params() const { return long(V) * d + long(T) * d + long(L) * (12L * d * d + 13L * d) + 2L * d; }
};
constexpr Shape kSmall{"small", 4, 128, 256, 8, 256, 4};
constexpr Shape kGpt2{"gpt2", 4, 64, 768, 12, 50257, 12};

// Fast deterministic fill in [lo, hi) (xorshift), so gpt2-sized buffers are quick to set up.
Vec fill(std::size_t n, float lo = -1.0f, float hi = 1.0f, std::uint64_t seed = 88172645463325252ull) {
  Vec v(n);
  std::uint64_t x = seed;
  for (auto& e : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    e = lo + (hi - lo) * float(x >> 40) * (1.0f / 16777216.0f);
  }
  return v;
}

enum class Impl { Fast, Ref, Sgemm };
const char* impl_name(Impl i) { return i == Impl::Fast ? "fast" : i == Impl::Ref ? "ref" : "sgemm"; }

template <typename Setup>
void reg(Impl impl, const Shape& s, const std::string& kernel, Setup setup) {
  const std::string name = std::string(impl_name(impl)) + "/" + s.name + "/" + kernel;
  benchmark::RegisterBenchmark(name.c_str(), setup)->UseRealTime()->MinTime(0.2)->Unit(benchmark::kMicrosecond);
}

// ---- matmul: the model's five GEMM layers ------------------------------------------------------
struct Linear {
  const char* name;
  int C, OC;
  WeightLayout layout;
  bool bias;
};
std::vector<Linear> linears(const Shape& s) {
  const int d = s.d;
  return {{"qkv", d, 3 * d, WeightLayout::OutIn, true},
          {"attn_proj", d, d, WeightLayout::InOut, false},
          {"fc", d, 4 * d, WeightLayout::OutIn, true},
          {"fc_proj", 4 * d, d, WeightLayout::InOut, false},
          {"lm_head", d, s.V, WeightLayout::OutIn, false}};
}

void register_matmul(const Shape& s, const Linear& l, Impl impl) {
  const int BT = s.BT(), C = l.C, OC = l.OC;
  const double fwd_flops = 2.0 * BT * C * OC, bwd_flops = 2 * fwd_flops;
  reg(impl, s, std::string("matmul_fwd/") + l.name, [=](benchmark::State& st) {
    Vec inp = fill(std::size_t(BT) * C), w = fill(std::size_t(C) * OC, -0.1f, 0.1f), b = fill(OC), out(std::size_t(BT) * OC);
    const float* bias = l.bias ? b.data() : nullptr;
    for (auto _ : st) {
      if (impl == Impl::Fast)
        cpu::matmul_forward(out.data(), inp.data(), w.data(), bias, BT, C, OC, l.layout);
      else if (impl == Impl::Ref)
        ref::matmul_forward(out.data(), inp.data(), w.data(), bias, BT, C, OC, l.layout);
      else if (l.layout == WeightLayout::OutIn)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp.data(), C, w.data(), C, 0.0f,
                    out.data(), OC);
      else
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, OC, C, 1.0f, inp.data(), C, w.data(), OC, 0.0f,
                    out.data(), OC);
      benchmark::ClobberMemory();
    }
    st.counters["GFLOP/s"] = gflops(fwd_flops);
  });
  reg(impl, s, std::string("matmul_bwd/") + l.name, [=](benchmark::State& st) {
    Vec inp = fill(std::size_t(BT) * C), w = fill(std::size_t(C) * OC, -0.1f, 0.1f), dout = fill(std::size_t(BT) * OC);
    Vec dinp(std::size_t(BT) * C), dw(std::size_t(C) * OC), db(OC);
    float* dbias = l.bias ? db.data() : nullptr;
    for (auto _ : st) {
      if (impl == Impl::Fast) {
        cpu::matmul_backward(dinp.data(), dw.data(), dbias, dout.data(), inp.data(), w.data(), BT, C, OC, l.layout);
      } else if (impl == Impl::Ref) {
        ref::matmul_backward(dinp.data(), dw.data(), dbias, dout.data(), inp.data(), w.data(), BT, C, OC, l.layout);
      } else if (l.layout == WeightLayout::OutIn) {  // the same two GEMMs matmul_backward issues
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout.data(), OC, w.data(), C, 1.0f,
                    dinp.data(), C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout.data(), OC, inp.data(), C, 1.0f,
                    dw.data(), C);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, C, OC, 1.0f, dout.data(), OC, w.data(), OC, 1.0f,
                    dinp.data(), C);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, BT, 1.0f, inp.data(), C, dout.data(), OC, 1.0f,
                    dw.data(), OC);
      }
      benchmark::ClobberMemory();
    }
    st.counters["GFLOP/s"] = gflops(bwd_flops);
  });
}

// ---- attention ----------------------------------------------------------------------------------
void register_attention(const Shape& s, Impl impl) {
  const int B = s.B, T = s.T, NH = s.H, HS = s.HS();
  const std::size_t nqkv = std::size_t(B) * T * NH * 3 * HS, nout = std::size_t(B) * T * NH * HS;
  const std::size_t natt = std::size_t(B) * NH * T * T;
  const double gemm = 2.0 * B * NH * double(T) * T * HS;  // one T x T x HS product over all heads
  reg(impl, s, "attention_fwd", [=](benchmark::State& st) {
    Vec qkv = fill(nqkv, -2.0f, 2.0f), out(nout), att(natt);
    const int ld = NH * 3 * HS, ldo = NH * HS;
    for (auto _ : st) {
      if (impl == Impl::Fast) {
        cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
      } else if (impl == Impl::Ref) {
        ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
      } else {  // the two per-head GEMMs alone, batched over (b, h) as the kernel does
#pragma omp parallel for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
          for (int h = 0; h < NH; h++) {
            const float* q = qkv.data() + std::size_t(b) * T * ld + std::size_t(h) * 3 * HS;
            float* a = att.data() + (std::size_t(b) * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, q, ld, q + HS, ld, 0.0f, a, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, q + 2 * HS, ld, 0.0f,
                        out.data() + std::size_t(b) * T * ldo + std::size_t(h) * HS, ldo);
          }
      }
      benchmark::ClobberMemory();
    }
    st.counters["GFLOP/s"] = gflops(2 * gemm);
  });
  reg(impl, s, "attention_bwd", [=](benchmark::State& st) {
    Vec qkv = fill(nqkv, -2.0f, 2.0f), out(nout), att(natt), dout = fill(nout), dqkv(nqkv), scratch(natt);
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, NH, HS);
    const int ld = NH * 3 * HS, ldo = NH * HS;
    for (auto _ : st) {
      if (impl == Impl::Fast) {
        cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH, HS);
      } else if (impl == Impl::Ref) {
        ref::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, NH, HS);
      } else {
#pragma omp parallel for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
          for (int h = 0; h < NH; h++) {
            const std::size_t qo = std::size_t(b) * T * ld + std::size_t(h) * 3 * HS;
            const float* q = qkv.data() + qo;
            float* dq = dqkv.data() + qo;
            const float* a = att.data() + (std::size_t(b) * NH + h) * T * T;
            float* d = scratch.data() + (std::size_t(b) * NH + h) * T * T;
            const float* g = dout.data() + std::size_t(b) * T * ldo + std::size_t(h) * HS;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, g, ldo, 1.0f, dq + 2 * HS, ld);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, g, ldo, q + 2 * HS, ld, 0.0f, d, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, d, T, q + HS, ld, 1.0f, dq, ld);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, d, T, q, ld, 1.0f, dq + HS, ld);
          }
      }
      benchmark::ClobberMemory();
    }
    st.counters["GFLOP/s"] = gflops(4 * gemm);
  });
}

// ---- memory-bound kernels -------------------------------------------------------------------------
// Times fn() once per iteration, its writes kept.
template <typename Fn>
void time_loop(benchmark::State& st, Fn fn) {
  for (auto _ : st) {
    fn();
    benchmark::ClobberMemory();
  }
}

void register_norm_and_pointwise(const Shape& s, Impl impl) {
  const bool F = impl == Impl::Fast;
  const int BT = s.BT(), C = s.d;
  const long N4 = long(BT) * 4 * C, N1 = long(BT) * C;
  reg(impl, s, "layernorm_fwd", [=](benchmark::State& st) {
    Vec inp = fill(N1), w = fill(C), b = fill(C), out(N1), mean(BT), rstd(BT);
    time_loop(st, [&] {
      (F ? cpu::layernorm_forward : ref::layernorm_forward)(out.data(), mean.data(), rstd.data(), inp.data(), w.data(),
                                                             b.data(), BT, C);
    });
    st.counters["GB/s"] = gbytes(4.0 * (2.0 * N1 + 2.0 * BT + 2.0 * C));
  });
  reg(impl, s, "layernorm_bwd", [=](benchmark::State& st) {
    Vec inp = fill(N1), w = fill(C), b = fill(C), out(N1), mean(BT), rstd(BT), dout = fill(N1), dinp(N1), dw(C), db(C);
    cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), BT, C);
    time_loop(st, [&] {
      (F ? cpu::layernorm_backward : ref::layernorm_backward)(dinp.data(), dw.data(), db.data(), dout.data(),
                                                               inp.data(), w.data(), mean.data(), rstd.data(), BT, C);
    });
    st.counters["GB/s"] = gbytes(4.0 * (4.0 * N1 + 2.0 * BT + 5.0 * C));  // dout, inp, dinp r+w
  });
  reg(impl, s, "gelu_fwd", [=](benchmark::State& st) {
    Vec inp = fill(N4, -4.0f, 4.0f), out(N4);
    time_loop(st, [&] { (F ? cpu::gelu_forward : ref::gelu_forward)(out.data(), inp.data(), N4); });
    st.counters["GB/s"] = gbytes(4.0 * 2 * N4);
  });
  reg(impl, s, "gelu_bwd", [=](benchmark::State& st) {
    Vec inp = fill(N4, -4.0f, 4.0f), dout = fill(N4), dinp(N4);
    time_loop(st, [&] { (F ? cpu::gelu_backward : ref::gelu_backward)(dinp.data(), inp.data(), dout.data(), N4); });
    st.counters["GB/s"] = gbytes(4.0 * 4 * N4);
  });
  reg(impl, s, "residual_fwd", [=](benchmark::State& st) {
    Vec a = fill(N1), b = fill(N1), out(N1);
    time_loop(st, [&] { (F ? cpu::residual_forward : ref::residual_forward)(out.data(), a.data(), b.data(), N1); });
    st.counters["GB/s"] = gbytes(4.0 * 3 * N1);
  });
  reg(impl, s, "residual_bwd", [=](benchmark::State& st) {
    Vec da(N1), db(N1), dout = fill(N1);
    time_loop(st, [&] { (F ? cpu::residual_backward : ref::residual_backward)(da.data(), db.data(), dout.data(), N1); });
    st.counters["GB/s"] = gbytes(4.0 * 5 * N1);
  });
  reg(impl, s, "bias_fwd", [=](benchmark::State& st) {
    Vec out = fill(N1), b = fill(C);
    time_loop(st, [&] { (F ? cpu::bias_forward : ref::bias_forward)(out.data(), b.data(), BT, C); });
    st.counters["GB/s"] = gbytes(4.0 * (2 * N1 + C));
  });
  reg(impl, s, "bias_bwd", [=](benchmark::State& st) {
    Vec dout = fill(N1), db(C);
    time_loop(st, [&] { (F ? cpu::bias_backward : ref::bias_backward)(db.data(), dout.data(), BT, C); });
    st.counters["GB/s"] = gbytes(4.0 * (N1 + 2 * C));
  });
}

// Embeddings: tokens drawn over the whole vocabulary, one rank owning every row.
void register_embeddings(const Shape& s, Impl impl) {
  const bool F = impl == Impl::Fast;
  const int BT = s.BT(), C = s.d, B = s.B, T = s.T, V = s.V;
  const long N1 = long(BT) * C;
  auto tokens_rows = [=] {
    std::vector<int> tokens(BT), rows(V);
    for (int i = 0; i < V; i++) rows[i] = i;
    std::uint64_t x = 12345;
    for (auto& t : tokens) x = x * 6364136223846793005ull + 1442695040888963407ull, t = int((x >> 33) % V);
    return std::pair{tokens, rows};
  };
  reg(impl, s, "embedding_fwd", [=](benchmark::State& st) {
    auto [tokens, rows] = tokens_rows();
    Vec wte = fill(std::size_t(V) * C), out(N1);
    time_loop(st, [&] {
      (F ? cpu::embedding_forward : ref::embedding_forward)(out.data(), tokens.data(), wte.data(), rows.data(), BT, C);
    });
    st.counters["GB/s"] = gbytes(4.0 * 2 * N1);
  });
  reg(impl, s, "embedding_bwd", [=](benchmark::State& st) {
    auto [tokens, rows] = tokens_rows();
    Vec dwte(std::size_t(V) * C), dout = fill(N1);
    time_loop(st, [&] {
      (F ? cpu::embedding_backward : ref::embedding_backward)(dwte.data(), dout.data(), tokens.data(), rows.data(), BT,
                                                               C);
    });
    st.counters["GB/s"] = gbytes(4.0 * 3 * N1);
  });
  reg(impl, s, "pos_embedding_fwd", [=](benchmark::State& st) {
    Vec out = fill(N1), wpe = fill(std::size_t(T) * C);
    time_loop(st, [&] {
      (F ? cpu::position_embedding_forward : ref::position_embedding_forward)(out.data(), wpe.data(), B, T, C);
    });
    st.counters["GB/s"] = gbytes(4.0 * (2 * N1 + double(T) * C));
  });
  reg(impl, s, "pos_embedding_bwd", [=](benchmark::State& st) {
    Vec dwpe(std::size_t(T) * C), dout = fill(N1);
    time_loop(st, [&] {
      (F ? cpu::position_embedding_backward : ref::position_embedding_backward)(dwpe.data(), dout.data(), B, T, C);
    });
    st.counters["GB/s"] = gbytes(4.0 * (N1 + 2.0 * T * C));
  });
}

// Cross-entropy over the full vocabulary on one rank: [BT, V] logits.
void register_cross_entropy(const Shape& s, Impl impl) {
  const bool F = impl == Impl::Fast;
  const int BT = s.BT(), V = s.V;
  const long NL = long(BT) * V;
  auto ce_setup = [=] {
    std::vector<int> targets(BT), rows(V);
    for (int i = 0; i < V; i++) rows[i] = i;
    for (int i = 0; i < BT; i++) targets[i] = int((i * 2654435761u) % unsigned(V));
    return std::pair{targets, rows};
  };
  reg(impl, s, "ce_local_max", [=](benchmark::State& st) {
    Vec logits = fill(NL, -5.0f, 5.0f), mx(BT);
    time_loop(st, [&] {
      (F ? cpu::crossentropy_local_max : ref::crossentropy_local_max)(mx.data(), logits.data(), BT, V);
    });
    st.counters["GB/s"] = gbytes(4.0 * NL);
  });
  reg(impl, s, "ce_local_sums", [=](benchmark::State& st) {
    auto [targets, rows] = ce_setup();
    Vec logits = fill(NL, -5.0f, 5.0f), mx(BT), sums(2 * BT);
    cpu::crossentropy_local_max(mx.data(), logits.data(), BT, V);
    time_loop(st, [&] {
      (F ? cpu::crossentropy_local_sums : ref::crossentropy_local_sums)(sums.data(), logits.data(), mx.data(),
                                                                         targets.data(), rows.data(), BT, V);
    });
    st.counters["GB/s"] = gbytes(4.0 * NL);
  });
  reg(impl, s, "ce_bwd", [=](benchmark::State& st) {
    auto [targets, rows] = ce_setup();
    Vec logits = fill(NL, -5.0f, 5.0f), mx(BT), sums(2 * BT), dlogits(NL);
    cpu::crossentropy_local_max(mx.data(), logits.data(), BT, V);
    cpu::crossentropy_local_sums(sums.data(), logits.data(), mx.data(), targets.data(), rows.data(), BT, V);
    time_loop(st, [&] {
      (F ? cpu::crossentropy_backward : ref::crossentropy_backward)(dlogits.data(), logits.data(), mx.data(),
                                                                     sums.data(), targets.data(), rows.data(),
                                                                     1.0f / BT, BT, V);
    });
    st.counters["GB/s"] = gbytes(4.0 * 2 * NL);
  });
}

// The optimizer over the whole model's parameters.
void register_optimizer(const Shape& s, Impl impl) {
  const bool F = impl == Impl::Fast;
  const long P = s.params();
  reg(impl, s, "adamw", [=](benchmark::State& st) {
    Vec p = fill(P), g = fill(P, -1e-2f, 1e-2f, 7), m(P), v(P);
    int t = 0;
    time_loop(st, [&] {
      (F ? cpu::adamw_update : ref::adamw_update)(p.data(), g.data(), m.data(), v.data(), P, 3e-4f, 0.9f, 0.95f,
                                                  1e-8f, 0.1f, 1.0f, ++t);
    });
    st.counters["GB/s"] = gbytes(4.0 * 7 * P);  // p, m, v read and written; g read
    st.counters["params"] = double(P);
  });
  reg(impl, s, "sum_squares", [=](benchmark::State& st) {
    Vec g = fill(P);
    double acc = 0;
    for (auto _ : st) benchmark::DoNotOptimize(acc += (F ? cpu::sum_squares : ref::sum_squares)(g.data(), P));
    st.counters["GB/s"] = gbytes(4.0 * P);
  });
}

// Registered in this order (the order --benchmark_list_tests shows).
void register_elementwise(const Shape& s, Impl impl) {
  register_norm_and_pointwise(s, impl);
  register_embeddings(s, impl);
  register_cross_entropy(s, impl);
  register_optimizer(s, impl);
}

void register_all() {
  for (const Shape& s : {kSmall, kGpt2}) {
    for (const Linear& l : linears(s)) {
      register_matmul(s, l, Impl::Fast);
      register_matmul(s, l, Impl::Sgemm);
      if (s.name == kSmall.name) register_matmul(s, l, Impl::Ref);
    }
    register_attention(s, Impl::Fast);
    register_attention(s, Impl::Sgemm);
    if (s.name == kSmall.name) register_attention(s, Impl::Ref);
    register_elementwise(s, Impl::Fast);
    if (s.name == kSmall.name) register_elementwise(s, Impl::Ref);
  }
}

const Registrar registrar(register_all);

}  // namespace
}  // namespace ntp::bench
