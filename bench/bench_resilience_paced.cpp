// The NTP gradient sync on an emulated DGX (--timing paced's model: pacer.hpp), where a CPU
// copy on this machine's shared cores stands for an NVLink or InfiniBand transfer.
//
// ntp_sync_paced/<model>/<n1>-><n2>: as ntp_sync's overlapped figure (bench_resilience.cpp), with
//   paced devices and links: two replicas, one healthy at TP n1 and one degraded at TP n2, against
//   both at TP n2 (the same all-reduce bytes). Each round runs one training backward of the
//   emulated device, layer by layer (compute, then the layer's two TP all-reduces of activation
//   gradients on the scale-up link, then its regroup posted), then the sync. exposed_* is the time
//   from the slowest rank's backward end to the slowest rank's sync end; the target is
//   exposed_ntp/uniform <= 1.10. backward_* is the slowest rank's backward (NTP's: its TP
//   all-reduces queued behind the regroups on the scale-up link; reshard_slowdown measures that).
// reshard_slowdown/<model>/<n1>-><n2>/tokens<N>: the paper's Figure 8. The healthy replica's
//   backward with the reshard (to the last regroup's end) in the NTP configuration, over the same
//   backward in a uniform run (both replicas at TP n1): `slowdown` (1.0: none). N tokens per
//   healthy replica (1, 2 or 8 sequences of 4096) sweep `reshard_over_compute`: the regroup's bytes
//   on one GPU at the scale-up rate over the backward's compute time at the device rate.
//
// The emulated machine is a DGX A100 (kDgx), slowed by one common factor (time_scale, a power of 2)
// chosen so that the real exchanges here take at most 1/headroom of their emulated time: paced
// timing is honest only where the emulated time exceeds the real one. Latency scales with it, so
// every ratio is the one at the DGX's own rates, and times are reported divided by the factor (DGX
// microseconds). link_overruns counts the transfers of the timed rounds that still ended late (a
// real exchange slower than emulated, or waiting for a late peer; ideally 0).
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/sync_setup.hpp"
#include "comm.hpp"
#include "model_config.hpp"
#include "pacer.hpp"

namespace ntp::bench {
namespace {

// A DGX A100: NVLink 3 gives each GPU 600 GB/s both ways, 300 GB/s each way; each GPU has one HDR
// InfiniBand HCA (200 Gb/s, 25 GB/s); bf16 dense peak 312 TFLOP/s; 5 us a message on either link.
struct Dgx {
  double gflops = 312e3, nvlink_gbps = 300, ib_gbps = 25, latency_us = 5;
};
constexpr Dgx kDgx;
// A backward's tokens per replica: two sequences of 4096 (the prototype's shortest), whose
// activation gradients cross the TP link in bf16.
constexpr double kSeq = 4096, kTokens = 2 * kSeq, kActivationBytes = 2;
constexpr int kPacedRounds = 9;
// The emulated sync is made at least this many times its real time here (choose_time_scale):
// NTPBENCH_PACED_HEADROOM in rank 0's environment, default 2. More headroom makes the exchanges'
// host work (copies, done while the emulated device computes) a smaller share of the emulated
// time, and every round as many times longer.
double g_headroom = 2;

PacingConfig dgx_paced(double scale, double nvlink_gbps) {
  PacingConfig c;
  c.enabled = true;
  c.device_gflops = kDgx.gflops / scale;
  c.tp_gbps = nvlink_gbps / scale;
  c.dp_gbps = kDgx.ib_gbps / scale;
  c.latency_us = kDgx.latency_us * scale;
  return c;
}

// One layer's backward FLOPs for a replica's `tokens` (Megatron's count: 2x the forward's 24 h^2
// per token for the matrices and 4 T h per token for attention scores and values).
double layer_backward_flops(const ModelConfig& m, double tokens) {
  const double h = m.hidden;
  return 2 * (24 * h * h * tokens + 4 * tokens * kSeq * h);
}

// A setup's paced round. Under plain NTP a replica at TP n trains n / n1 of the healthy replica's
// batch, so every rank computes as much as a healthy one; its TP all-reduces carry its own tokens.
struct Paced {
  SyncSetup* s;
  const ModelConfig* m;
  int n1;
  double healthy_tokens = kTokens;  // a healthy replica's in one backward
  SyncSetup::PacedTimes run() const {
    if (!s->in()) return {};
    const int n = s->tp->size();
    const double tokens = healthy_tokens * n / n1;
    return s->run_paced(m->layers, layer_backward_flops(*m, tokens) / n, tokens * m->hidden * kActivationBytes);
  }
};

int link_overruns(SyncSetup& s) {
  int n = s.pacer.take_link_overruns();
  MPI_Allreduce(MPI_IN_PLACE, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return n;
}

// One round of one setup, max over ranks (ranks outside it sleep in the barriers).
template <class F>
double each_round(F&& value) {
  sleepy_barrier(MPI_COMM_WORLD);
  const double v = value();
  sleepy_barrier(MPI_COMM_WORLD);
  return max_over(MPI_COMM_WORLD, v);
}

// The common factor by which the DGX is slowed: g_headroom times the worst ratio, over the setups, of a serial
// (wall-clock) sync's real time here to a lower bound of its emulated time at the DGX's rates (its
// all-reduce bytes over InfiniBand, the rest over NVLink, no latency), slowest rank of each, median
// of 3; rounded up to a power of 2.
double choose_time_scale(const std::vector<SyncSetup*>& setups, double nvlink_gbps) {
  double worst = 1;
  for (SyncSetup* s : setups) {
    s->set_pacing(PacingConfig{});
    std::vector<double> ratios;
    for (int r = 0; r < 3; ++r) {
      const double real = max_timed(MPI_COMM_WORLD, [&] { s->run(); }, true);
      double emulated = 0;
      if (s->in()) {
        const double ar = s->sync->allreduce_bytes(), rest = s->sync->bytes_sent() - ar;
        emulated = ar / (kDgx.ib_gbps * 1e9) + rest / (nvlink_gbps * 1e9);
      }
      ratios.push_back(real / max_over(MPI_COMM_WORLD, emulated));
    }
    worst = std::max(worst, median(ratios));
  }
  const double scale = std::exp2(std::ceil(std::log2(g_headroom * worst)));
  for (SyncSetup* s : setups) s->set_pacing(dgx_paced(scale, nvlink_gbps));
  return scale;
}

void skip_needs(benchmark::State& st, int need, const std::string& filter) {
  st.SkipWithError(("needs " + std::to_string(need) + " ranks: mpirun --oversubscribe -np " + std::to_string(need) +
                    " ... --benchmark_filter='" + filter + "'")
                       .c_str());
  for (auto _ : st) {
  }
}

void register_sync_paced(const char* model_name, int n1, int n2) {
  const std::string name =
      std::string("ntp_sync_paced/") + model_name + "/" + std::to_string(n1) + "->" + std::to_string(n2);
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
    if (world_size() < n1 + n2) return skip_needs(st, n1 + n2, "ntp_sync_paced/");
    const ModelConfig m = preset(model_name);
    auto world = world_comm();
    SyncSetup ntp_s(*world, m, {n1, n2}), uni(*world, m, {n2, n2});
    const Paced pn{&ntp_s, &m, n1}, pu{&uni, &m, n1};
    std::vector<double> en, eu, bn, bu, r0_reshard, r0_allreduce;
    double scale = 0;
    int late = 0;
    for (auto _ : st) {
      scale = choose_time_scale({&ntp_s, &uni}, kDgx.nvlink_gbps);
      each_round([&] { return pn.run().sync_end; }), each_round([&] { return pu.run().sync_end; });  // warm-up
      link_overruns(ntp_s), link_overruns(uni);
      for (int r = 0; r < kPacedRounds; ++r) {  // interleaved
        // The sync's end after the slowest rank's backward: a rank whose backward ended early (the
        // degraded replica's, without regroups) waits for the others inside the sync.
        SyncSetup::PacedTimes t;
        const double end_n = each_round([&] { return (t = pn.run()).sync_end; });
        bn.push_back(max_over(MPI_COMM_WORLD, t.backward));
        en.push_back(end_n - bn.back());
        r0_reshard.push_back(ntp_s.reshard_s), r0_allreduce.push_back(ntp_s.allreduce_s);
        const double end_u = each_round([&] { return (t = pu.run()).sync_end; });
        bu.push_back(max_over(MPI_COMM_WORLD, t.backward));
        eu.push_back(end_u - bu.back());
      }
      late = link_overruns(ntp_s) + link_overruns(uni);
      st.SetIterationTime(median(en));
    }
    const double us = 1e6 / scale;  // emulated seconds to DGX microseconds
    st.counters["exposed_ntp_us"] = median(en) * us;
    st.counters["exposed_uniform_us"] = median(eu) * us;
    st.counters["exposed_ntp/uniform"] = median(en) / median(eu);
    st.counters["backward_ntp_us"] = median(bn) * us;
    st.counters["backward_uniform_us"] = median(bu) * us;
    st.counters["r0_reshard_us"] = median(r0_reshard) * us;
    st.counters["r0_allreduce_us"] = median(r0_allreduce) * us;
    st.counters["time_scale"] = scale;
    st.counters["headroom"] = g_headroom;
    st.counters["link_overruns"] = late;
    st.counters["ranks"] = n1 + n2;
    st.SetLabel("DGX A100 links and device, " + std::to_string(int(kTokens)) + " tokens per replica; medians of " +
                std::to_string(kPacedRounds) + " interleaved rounds; uniform = TP " + std::to_string(n2) + "x2");
  })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

void register_slowdown(const char* model_name, int n1, int n2, int sequences) {
  const double nvlink_gbps = kDgx.nvlink_gbps, tokens = sequences * kSeq;
  const std::string name = std::string("reshard_slowdown/") + model_name + "/" + std::to_string(n1) + "->" +
                           std::to_string(n2) + "/tokens" + std::to_string(int(tokens));
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
    if (world_size() < 2 * n1) return skip_needs(st, 2 * n1, "reshard_slowdown/");
    const ModelConfig m = preset(model_name);
    auto world = world_comm();
    SyncSetup ntp_s(*world, m, {n1, n2}), healthy(*world, m, {n1, n1});
    const Paced pn{&ntp_s, &m, n1, tokens}, ph{&healthy, &m, n1, tokens};
    // The healthy replica's ranks (replica 0, TP n1 in both) are the ones measured.
    auto mine = [](const SyncSetup& s, double x) { return s.q == 0 ? x : 0.0; };
    std::vector<double> with, without, bytes;
    double scale = 0;
    int late = 0;
    for (auto _ : st) {
      scale = choose_time_scale({&ntp_s, &healthy}, nvlink_gbps);
      each_round([&] { return pn.run().sync_end; }), each_round([&] { return ph.run().sync_end; });  // warm-up
      link_overruns(ntp_s), link_overruns(healthy);
      for (int r = 0; r < kPacedRounds; ++r) {
        with.push_back(each_round([&] { return mine(ntp_s, pn.run().reshard_end); }));
        bytes.push_back(max_over(MPI_COMM_WORLD, mine(ntp_s, ntp_s.in() ? ntp_s.sync->regroup_bytes() : 0)));
        without.push_back(each_round([&] { return mine(healthy, ph.run().backward); }));
      }
      late = link_overruns(ntp_s) + link_overruns(healthy);
      st.SetIterationTime(median(with));
    }
    const double compute_s = m.layers * layer_backward_flops(m, tokens) / n1 / (kDgx.gflops * 1e9);
    const double reshard_s = median(bytes) / (nvlink_gbps * 1e9);
    const double us = 1e6 / scale;
    st.counters["slowdown"] = median(with) / median(without);
    st.counters["reshard_over_compute"] = reshard_s / compute_s;
    st.counters["reshard_MB"] = median(bytes) / 1e6;
    st.counters["backward_us"] = median(without) * us;
    st.counters["backward_with_reshard_us"] = median(with) * us;
    st.counters["time_scale"] = scale;
    st.counters["headroom"] = g_headroom;
    st.counters["link_overruns"] = late;
    st.counters["ranks"] = 2 * n1;
    st.SetLabel("DGX A100 links and device, " + std::to_string(sequences) + " sequence(s) of " +
                std::to_string(int(kSeq)) + " tokens per replica; medians of " + std::to_string(kPacedRounds) +
                " rounds; against TP " + std::to_string(n1) + "x2");
  })
      ->UseManualTime()
      ->Iterations(1)
      ->Unit(benchmark::kMillisecond);
}

void register_all() {
  double headroom = 2;
  if (world_rank() == 0)
    if (const char* v = std::getenv("NTPBENCH_PACED_HEADROOM")) headroom = std::max(1.0, std::atof(v));
  MPI_Bcast(&headroom, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  g_headroom = headroom;
  for (const char* model : {"small", "gpt2"})
    for (auto [n1, n2] : {std::pair{4, 3}, std::pair{8, 7}}) register_sync_paced(model, n1, n2);
  // Fewer tokens, less compute for the same reshard bytes: the ratio rises.
  for (const char* model : {"small", "gpt2"})
    for (int sequences : {8, 2, 1}) register_slowdown(model, 4, 3, sequences);
}

const Registrar registrar(register_all);

}  // namespace
}  // namespace ntp::bench
