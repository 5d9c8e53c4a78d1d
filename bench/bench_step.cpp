// The whole training step against plain sgemm at the step's own GEMM shapes:
// one rank, gpt2 (and small) at B=4, T=64, BLAS/OpenMP threads = cores.
//
// One benchmark iteration runs R interleaved rounds of (a) one real Trainer step (forward,
// backward, gradient norm, AdamW; data sampling included) and (b) every cblas_sgemm the step
// issues, with the same shapes, transposes and leading dimensions (12 layers x 4 linears forward
// and 8 backward, the tied LM head's 3, and attention's per-head T x T products batched over
// (b, h) under OpenMP as the attention kernel runs them), and reports the medians:
//   step_GFLOP/s  = training_flops(model, B, T) / median step time
//   sgemm_GFLOP/s = the same FLOPs / median time of the GEMM set alone
//   step_vs_sgemm = their ratio (target >= 0.70).
#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "comm.hpp"
#include "machine.hpp"
#include "model_config.hpp"
#include "options.hpp"
#include "phase_clock.hpp"
#include "trainer.hpp"

namespace ntp::bench {
namespace {

constexpr int kRounds = 5;

struct Gemm {
  CBLAS_TRANSPOSE ta, tb;
  int M, N, K;
  double flops() const { return 2.0 * M * N * K; }
};

// The dense GEMMs of one step, in the order the step issues them.
std::vector<Gemm> step_gemms(const ModelConfig& m, int B, int T) {
  const int BT = B * T, d = m.hidden;
  std::vector<Gemm> g;
  struct Lin {
    int C, OC;
    bool outin;
  };
  const Lin lins[] = {{d, 3 * d, true}, {d, d, false}, {d, 4 * d, true}, {4 * d, d, false}};
  for (int l = 0; l < m.layers; l++)
    for (const Lin& x : lins)
      g.push_back({CblasNoTrans, x.outin ? CblasTrans : CblasNoTrans, BT, x.OC, x.C});
  g.push_back({CblasNoTrans, CblasTrans, BT, m.vocab, d});  // LM head forward
  g.push_back({CblasNoTrans, CblasNoTrans, BT, d, m.vocab});  // LM head dinp
  g.push_back({CblasTrans, CblasNoTrans, m.vocab, d, BT});    // LM head dW
  for (int l = 0; l < m.layers; l++)
    for (const Lin& x : lins) {
      if (x.outin) {
        g.push_back({CblasNoTrans, CblasNoTrans, BT, x.C, x.OC});
        g.push_back({CblasTrans, CblasNoTrans, x.OC, x.C, BT});
      } else {
        g.push_back({CblasNoTrans, CblasTrans, BT, x.C, x.OC});
        g.push_back({CblasTrans, CblasNoTrans, x.C, x.OC, BT});
      }
    }
  return g;
}

class GemmSet {
 public:
  GemmSet(const ModelConfig& m, int B, int T) : m_(m), B_(B), T_(T), gemms_(step_gemms(m, B, T)) {
    std::size_t a = 0, b = 0, c = 0;
    for (const Gemm& x : gemms_) {
      a = std::max(a, std::size_t(x.M) * x.K), b = std::max(b, std::size_t(x.K) * x.N);
      c = std::max(c, std::size_t(x.M) * x.N);
    }
    A_.assign(a, 0.01f), B__.assign(b, 0.02f), C_.assign(c, 0.0f);
    const std::size_t H = m.heads, HS = m.head_size();
    qkv_.assign(std::size_t(B) * T * H * 3 * HS, 0.1f), out_.assign(std::size_t(B) * T * H * HS, 0.0f);
    att_.assign(std::size_t(B) * H * T * T, 0.01f);
  }
  double flops() const {
    double f = 0;
    for (const Gemm& x : gemms_) f += x.flops();
    return f + double(m_.layers) * 6 * attention_gemm_flops();
  }
  void run() {
    for (const Gemm& x : gemms_) {
      const int lda = x.ta == CblasNoTrans ? x.K : x.M, ldb = x.tb == CblasNoTrans ? x.N : x.K;
      cblas_sgemm(CblasRowMajor, x.ta, x.tb, x.M, x.N, x.K, 1.0f, A_.data(), lda, B__.data(), ldb, 1.0f, C_.data(),
                  x.N);
    }
    for (int l = 0; l < m_.layers; l++) attention_gemms();
  }

 private:
  double attention_gemm_flops() const { return 2.0 * B_ * m_.heads * double(T_) * T_ * m_.head_size(); }
  // Forward's 2 and backward's 4 per-head products, as attention_forward/backward issue them.
  void attention_gemms() {
    const int T = T_, NH = m_.heads, HS = m_.head_size(), ld = NH * 3 * HS, ldo = NH * HS;
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B_; b++)
      for (int h = 0; h < NH; h++) {
        float* q = qkv_.data() + std::size_t(b) * T * ld + std::size_t(h) * 3 * HS;
        float* a = att_.data() + (std::size_t(b) * NH + h) * T * T;
        float* o = out_.data() + std::size_t(b) * T * ldo + std::size_t(h) * HS;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, q, ld, q + HS, ld, 0.0f, a, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, q + 2 * HS, ld, 0.0f, o, ldo);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, o, ldo, 1.0f, q + 2 * HS, ld);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, o, ldo, q + 2 * HS, ld, 0.0f, a, T);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, q + HS, ld, 1.0f, q, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, q, ld, 1.0f, q + HS, ld);
      }
  }

  ModelConfig m_;
  int B_, T_;
  std::vector<Gemm> gemms_;
  std::vector<float> A_, B__, C_, qkv_, out_, att_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::unique_ptr<Comm> g_self;

void register_all() {
  g_self = world_comm()->split(world_rank(), 0);  // one rank per run, whatever mpirun started
  for (const char* preset_name : {"small", "gpt2"}) {
    const std::string name = std::string("step_vs_sgemm/") + preset_name + "/B:4/T:64";
    benchmark::RegisterBenchmark(name.c_str(), [preset_name](benchmark::State& st) {
      Options o;
      o.preset = preset_name;
      o.model = preset(preset_name);
      o.seq = 64;
      o.micro_batch = 4;
      o.tp = 1;
      o.quiet = true;
      const int threads = configure_threads(0, *world_comm());  // ranks on the node share its cores
      Trainer trainer(o, *g_self, o.micro_batch);
      GemmSet gemms(o.model, o.micro_batch, o.seq);
      const double step_flops = training_flops(o.model, o.micro_batch, o.seq);
      const std::vector<int> batch{o.micro_batch};
      trainer.step(batch);  // warm-up: first-touch page faults, BLAS buffers
      gemms.run();
      std::vector<double> step_s, gemm_s, fwd_s, bwd_s, opt_s;
      for (auto _ : st) {
        for (int r = 0; r < kRounds; r++) {  // A and B interleaved
          auto t0 = std::chrono::steady_clock::now();
          const StepResult res = trainer.step(batch);
          step_s.push_back(seconds_since(t0));
          fwd_s.push_back(res.phase_seconds[int(Phase::Forward)]);
          bwd_s.push_back(res.phase_seconds[int(Phase::Backward)]);
          opt_s.push_back(res.phase_seconds[int(Phase::Optimizer)]);
          t0 = std::chrono::steady_clock::now();
          gemms.run();
          gemm_s.push_back(seconds_since(t0));
        }
        st.SetIterationTime(median(step_s));
      }
      const double ms = median(step_s), mg = median(gemm_s);
      st.counters["threads"] = threads;
      st.counters["step_ms"] = ms * 1e3;
      st.counters["sgemm_set_ms"] = mg * 1e3;
      st.counters["forward_ms"] = median(fwd_s) * 1e3;
      st.counters["backward_ms"] = median(bwd_s) * 1e3;
      st.counters["optimizer_ms"] = median(opt_s) * 1e3;
      st.counters["step_GFLOP/s"] = step_flops / ms / 1e9;
      st.counters["sgemm_GFLOP/s"] = gemms.flops() / mg / 1e9;
      st.counters["step_vs_sgemm"] = (step_flops / ms) / (gemms.flops() / mg);
      st.counters["rounds"] = kRounds;
      st.SetLabel("medians of " + std::to_string(kRounds) + " interleaved rounds");
    })
        ->UseManualTime()
        ->Iterations(1)
        ->Unit(benchmark::kMillisecond);
  }
}

const Registrar registrar(register_all, [] { g_self.reset(); });

}  // namespace
}  // namespace ntp::bench
