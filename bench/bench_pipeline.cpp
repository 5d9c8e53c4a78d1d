// Pipeline parallelism under paced timing (8 ranks; the emulated device and links of pacer.hpp, so
// the oversubscribed cores do not distort the schedule):
//
//   pipeline_bubble/P<p>/M<m>  TP 1 x PP p x DP 8/p, m micro-batches of 1 sequence per replica.
//     bubble   = mean over ranks of the time a stage waits or transfers between stages (pp_comm)
//                over its forward + backward + pp_comm time, the median step;
//     ideal    = (p - 1) / (m + p - 1), the non-interleaved 1F1B bubble with free transfers;
//     bubble/ideal (1 when the schedule is as good as the formula; above it, transfers and the
//                last stage's LM head show).
//   pipeline_layout/TP<t>xPP<p>xDP<d>  the same model and global batch (8 sequences per step in
//     micro-batches of 1) at every layout of 8 ranks: tokens per second of the emulated devices.
//
// Model: `small`'s shapes with 8 layers (so 8 stages hold a layer each), T = 64.
#include <mpi.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "bench/bench_util.hpp"
#include "comm.hpp"
#include "options.hpp"
#include "phase_clock.hpp"
#include "trainer.hpp"

namespace ntp::bench {
namespace {

constexpr int kSteps = 5;  // timed steps after one warm-up step

Options pipeline_options(int tp, int pp, int micro_batches) {
  Options o;
  o.preset = "small";
  o.model = preset("small");
  o.model.layers = 8;
  o.seq = 64;
  o.tp = tp, o.pp = pp;
  o.micro_batch = 1, o.micro_batches = micro_batches;
  o.quiet = true;
  o.timing = Timing::Paced;
  o.pacing.enabled = true;
  o.pacing.device_gflops = 2.0;  // slow enough that 8 ranks on 2 cores keep up with it
  o.pacing.tp_gbps = 50.0;
  o.pacing.dp_gbps = 10.0;
  return o;
}

struct Measured {
  double step_s = 0, bubble = 0;
  long long samples = 0;
};

// kSteps paced steps at the layout; the median step (max over ranks) and the bubble share of it.
Measured run_layout(Comm& world, int tp, int pp, int micro_batches) {
  const Options o = pipeline_options(tp, pp, micro_batches);
  Trainer t(o, world, 1);
  t.step();  // warm-up
  std::vector<double> step_s, bubble;
  Measured m;
  for (int s = 0; s < kSteps; ++s) {
    StepResult r;
    step_s.push_back(max_timed(MPI_COMM_WORLD, [&] { r = t.step(); }, true));
    const auto& ph = r.phase_seconds;
    const double pp_s = ph[int(Phase::PpComm)];
    const double busy = ph[int(Phase::Forward)] + ph[int(Phase::Backward)] + pp_s;
    double share = busy > 0 ? pp_s / busy : 0;
    MPI_Allreduce(MPI_IN_PLACE, &share, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    bubble.push_back(share / world_size());
    m.samples = r.samples;
  }
  m.step_s = median(step_s);
  m.bubble = median(bubble);
  return m;
}

void skip_unless_8(benchmark::State& st) {
  st.SkipWithError("needs 8 ranks: mpirun --oversubscribe -np 8 ... bench_pipeline");
  for (auto _ : st) {
  }
}

void register_bubble(int pp, int micro_batches) {
  const std::string name = fmt::format("pipeline_bubble/P{}/M{}", pp, micro_batches);
  benchmark::RegisterBenchmark(name.c_str(), [pp, micro_batches](benchmark::State& st) {
    if (world_size() != 8) return skip_unless_8(st);
    auto world = world_comm();
    Measured m;
    for (auto _ : st) {
      m = run_layout(*world, 1, pp, micro_batches);
      st.SetIterationTime(m.step_s);
    }
    const double ideal = double(pp - 1) / (micro_batches + pp - 1);
    st.counters["bubble"] = m.bubble;
    st.counters["ideal"] = ideal;
    st.counters["bubble/ideal"] = m.bubble / ideal;
  })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

void register_layout(int tp, int pp) {
  const int dp = 8 / (tp * pp);
  const std::string name = fmt::format("pipeline_layout/TP{}xPP{}xDP{}", tp, pp, dp);
  benchmark::RegisterBenchmark(name.c_str(), [tp, pp, dp](benchmark::State& st) {
    if (world_size() != 8) return skip_unless_8(st);
    auto world = world_comm();
    Measured m;
    for (auto _ : st) {
      m = run_layout(*world, tp, pp, 8 / dp);  // 8 sequences per step in every layout
      st.SetIterationTime(m.step_s);
    }
    st.counters["tokens_per_s"] = double(m.samples) * 64 / m.step_s;
    st.counters["bubble"] = m.bubble;
  })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

void register_all() {
  for (int pp : {2, 4, 8})
    for (int micro : {1, 2, 4, 8}) register_bubble(pp, micro);
  for (auto [tp, pp] : {std::pair{8, 1}, {4, 2}, {2, 4}, {1, 8}, {4, 1}, {2, 2}, {1, 4}, {2, 1}, {1, 2}, {1, 1}})
    register_layout(tp, pp);
}

const Registrar registrar(register_all);

}  // namespace
}  // namespace ntp::bench
