// One transformer layer, forward + backward, at TP 1..4 (strong scaling: the global shapes stay
// fixed and each TP rank holds 1/TP of the heads and MLP columns). The layer is composed exactly
// as GptModel composes it: Megatron's column-/row-parallel layers (tp_layers) around the CPU
// backend's LayerNorm, attention, GELU and residual kernels; 2 all-reduces forward and 2 backward.
//
// Run under `mpirun -np 4`: for TP k the first k ranks form the TP group, the others sleep (they
// must not spin on oversubscribed cores). Time per iteration is the slowest rank's.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "bench/bench_util.hpp"
#include "comm.hpp"
#include "phase_clock.hpp"
#include "tp_layers.hpp"

namespace ntp::bench {
namespace {

struct LayerShape {
  const char* name;
  int B, T, d, H;
};
constexpr LayerShape kShapes[] = {{"small", 4, 128, 256, 8}, {"gpt2", 4, 64, 768, 12}};

// Units [0, units) over tp ranks, Megatron-even with the remainder on the first ranks.
int local_units(int units, int tp, int slot) { return units / tp + (slot < units % tp ? 1 : 0); }

struct Layer {
  Backend& be;
  int B, T, d, hs, Hl, dl, fl;
  std::vector<float*> owned;
  float *ln1w, *ln1b, *wqkv, *bqkv, *wo, *bo, *ln2w, *ln2b, *wfc, *bfc, *wfp, *bfp;            // params
  float *gln1w, *gln1b, *gwqkv, *gbqkv, *gwo, *gbo, *gln2w, *gln2b, *gwfc, *gbfc, *gwfp, *gbfp;  // grads
  float *x, *ln1, *ln1m, *ln1r, *qkv, *atty, *att, *attproj, *res2, *ln2, *ln2m, *ln2r, *fch, *fchg, *fcproj,
      *res3;                                                                       // activations
  float *dout, *dres, *dln, *dqkv, *datty, *dfch, *dfchg, *scratch;                // backward

  Layer(Backend& backend, const LayerShape& s, int tp, int slot) : be(backend) {
    B = s.B, T = s.T, d = s.d, hs = s.d / s.H;
    Hl = local_units(s.H, tp, slot), dl = Hl * hs, fl = local_units(4 * s.d, tp, slot);
    const std::size_t BT = std::size_t(B) * T, att_n = std::size_t(B) * Hl * T * T;
    auto rnd = [&](std::size_t n, float scale, std::uint64_t seed) {
      float* p = alloc(n);
      std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
      for (std::size_t i = 0; i < n; i++) {
        z ^= z << 13, z ^= z >> 7, z ^= z << 17;
        p[i] = scale * (float(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
      }
      return p;
    };
    auto ones = [&](std::size_t n) {
      float* p = alloc(n);
      std::fill(p, p + n, 1.0f);
      return p;
    };
    ln1w = ones(d), ln1b = alloc(d), ln2w = ones(d), ln2b = alloc(d);
    wqkv = rnd(std::size_t(3) * dl * d, 0.02f, 1), bqkv = alloc(3 * dl), wo = rnd(std::size_t(dl) * d, 0.02f, 2);
    bo = alloc(d), wfc = rnd(std::size_t(fl) * d, 0.02f, 3), bfc = alloc(fl), wfp = rnd(std::size_t(fl) * d, 0.02f, 4);
    bfp = alloc(d);
    gln1w = alloc(d), gln1b = alloc(d), gln2w = alloc(d), gln2b = alloc(d), gwqkv = alloc(std::size_t(3) * dl * d);
    gbqkv = alloc(3 * dl), gwo = alloc(std::size_t(dl) * d), gbo = alloc(d), gwfc = alloc(std::size_t(fl) * d);
    gbfc = alloc(fl), gwfp = alloc(std::size_t(fl) * d), gbfp = alloc(d);
    x = rnd(BT * d, 1.0f, 5), ln1 = alloc(BT * d), ln1m = alloc(BT), ln1r = alloc(BT), qkv = alloc(BT * 3 * dl);
    atty = alloc(BT * dl), att = alloc(att_n), attproj = alloc(BT * d), res2 = alloc(BT * d), ln2 = alloc(BT * d);
    ln2m = alloc(BT), ln2r = alloc(BT), fch = alloc(BT * fl), fchg = alloc(BT * fl), fcproj = alloc(BT * d);
    res3 = alloc(BT * d);
    dout = rnd(BT * d, 1e-3f, 6), dres = alloc(BT * d), dln = alloc(BT * d), dqkv = alloc(BT * 3 * dl);
    datty = alloc(BT * dl), dfch = alloc(BT * fl), dfchg = alloc(BT * fl), scratch = alloc(att_n);
  }
  ~Layer() {
    for (float* p : owned) be.release(p);
  }
  float* alloc(std::size_t n) {
    owned.push_back(be.allocate(n));
    return owned.back();
  }

  void forward(const TpContext& tp) {
    const int BT = B * T;
    be.layernorm_forward(ln1, ln1m, ln1r, x, ln1w, ln1b, BT, d);
    column_parallel_forward(tp, qkv, ln1, wqkv, bqkv, BT, d, 3 * dl);
    be.attention_forward(atty, att, qkv, B, T, Hl, hs);
    row_parallel_forward(tp, attproj, atty, wo, bo, BT, dl, d);
    be.residual_forward(res2, x, attproj, long(BT) * d);
    be.layernorm_forward(ln2, ln2m, ln2r, res2, ln2w, ln2b, BT, d);
    column_parallel_forward(tp, fch, ln2, wfc, bfc, BT, d, fl);
    be.gelu_forward(fchg, fch, long(BT) * fl);
    row_parallel_forward(tp, fcproj, fchg, wfp, bfp, BT, fl, d);
    be.residual_forward(res3, res2, fcproj, long(BT) * d);
  }

  void backward(const TpContext& tp) {
    const int BT = B * T;
    be.copy(dres, dout, std::size_t(BT) * d);  // the residual stream's gradient from above
    row_parallel_backward(tp, dfchg, gwfp, gbfp, dres, fchg, wfp, BT, fl, d);
    be.zero(dfch, std::size_t(BT) * fl);
    be.gelu_backward(dfch, fch, dfchg, long(BT) * fl);
    column_parallel_backward(tp, dln, gwfc, gbfc, dfch, ln2, wfc, BT, d, fl);
    be.layernorm_backward(dres, gln2w, gln2b, dln, res2, ln2w, ln2m, ln2r, BT, d);
    row_parallel_backward(tp, datty, gwo, gbo, dres, atty, wo, BT, dl, d);
    be.zero(dqkv, std::size_t(BT) * 3 * dl);
    be.attention_backward(dqkv, scratch, datty, qkv, att, B, T, Hl, hs);
    column_parallel_backward(tp, dln, gwqkv, gbqkv, dqkv, ln1, wqkv, BT, d, 3 * dl);
    be.layernorm_backward(dres, gln1w, gln1b, dln, x, ln1w, ln1m, ln1r, BT, d);
  }
};

// Forward + backward FLOPs of one layer over the whole TP group (training_flops' convention).
double layer_flops(const LayerShape& s) {
  const double BT = double(s.B) * s.T, d = s.d;
  return 3.0 * (2.0 * BT * 12 * d * d + 2.0 * 2.0 * s.B * double(s.T) * s.T * d);
}

std::vector<std::unique_ptr<Comm>> g_groups;  // g_groups[tp]: the first tp ranks (null elsewhere)
std::unique_ptr<Backend> g_backend;

void register_all() {
  auto world = world_comm();
  const int n = world->size(), rank = world->rank();
  g_backend = make_cpu_backend();
  const int max_tp = std::min(4, n);
  g_groups.resize(max_tp + 1);
  for (int tp = 1; tp <= max_tp; tp++) g_groups[tp] = world->split(rank < tp ? 0 : -1, rank);

  for (const LayerShape& s : kShapes) {
    for (int tp = 1; tp <= max_tp; tp++) {
      const std::string name = std::string("layer_fwd_bwd/") + s.name + "/tp:" + std::to_string(tp);
      benchmark::RegisterBenchmark(name.c_str(), [s, tp, rank](benchmark::State& st) {
        Comm* group = g_groups[tp].get();
        std::unique_ptr<Layer> layer;
        PhaseClock clock;
        std::unique_ptr<TpContext> ctx;
        if (group) {
          layer = std::make_unique<Layer>(*g_backend, s, tp, rank);
          ctx = std::make_unique<TpContext>(TpContext{*g_backend, *group, &clock});
          layer->forward(*ctx);  // warm-up
          layer->backward(*ctx);
        }
        clock.take();
        for (auto _ : st)
          mpi_timed(
              st, MPI_COMM_WORLD,
              [&] {
                if (!layer) return;
                layer->forward(*ctx);
                layer->backward(*ctx);
              },
              /*sleepy=*/true);
        // Fraction of rank 0's time inside the TP all-reduces.
        const auto ph = clock.take();
        double total = 0;
        for (double v : ph) total += v;
        st.counters["tp_comm_frac"] = total > 0 ? ph[int(Phase::TpComm)] / total : 0.0;
        st.counters["tp"] = tp;
        st.counters["GFLOP/s"] = gflops(layer_flops(s));
        st.counters["tokens/s"] = benchmark::Counter(double(s.B) * s.T, benchmark::Counter::kIsIterationInvariantRate);
      })
          ->UseManualTime()
          ->Iterations(s.d >= 768 ? 4 : 8)
          ->Repetitions(3)
          ->ReportAggregatesOnly(true)
          ->Unit(benchmark::kMillisecond);
    }
  }
}

const Registrar registrar(register_all, [] {
  g_groups.clear();
  g_backend.reset();
});

}  // namespace
}  // namespace ntp::bench
