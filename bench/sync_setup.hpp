#pragma once
// One configuration's gradient sync on this rank, for the resilience benchmarks (ntp_sync,
// ntp_sync_paced, reshard_slowdown): the communicators, layout, GradSync and a gradient arena of a
// Configuration of the given TP degrees, wall-clock or paced.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "backend.hpp"
#include "comm.hpp"
#include "configuration.hpp"
#include "grad_sync.hpp"
#include "model_config.hpp"
#include "ntp_layout.hpp"
#include "pacer.hpp"
#include "param_layout.hpp"
#include "phase_clock.hpp"

namespace ntp::bench {

// One configuration's sync on this rank (or nothing, when this rank is outside it). Construction
// is collective over the world (communicator splits).
struct SyncSetup {
  Configuration cfg;
  int q = -1, idx = -1;
  std::unique_ptr<Comm> tp, slot;
  std::unique_ptr<ParamLayout> layout;
  std::unique_ptr<Backend> be;
  PhaseClock clock;
  Pacer pacer;  // disabled (wall-clock timing) unless the setup is paced
  std::unique_ptr<GradSync> sync;
  std::vector<float> grads;

  SyncSetup(Comm& world, const ModelConfig& m, const std::vector<int>& degrees, const PacingConfig& pacing = {})
      : cfg(configuration_for_degrees(m, degrees)), pacer(pacing) {
    const int me = world.rank();
    const int need = int(cfg.alive.size());
    q = me < need ? cfg.replica_of(me) : -1;
    idx = q >= 0 ? cfg.tp_index_of(me) : -1;
    tp = world.split(q, idx);
    slot = world.split(q >= 0 && idx < cfg.n2 ? idx : -1, q);
    if (q < 0) return;
    be = make_cpu_backend();
    layout = std::make_unique<ParamLayout>(m, cfg.replicas[q].layout, idx);
    sync = std::make_unique<GradSync>(cfg, q, idx, *tp, slot.get(), *layout, *be, clock, pacer);
    set_pacing(pacing);  // paced sleeps keep the exchanges moving
    grads.assign(layout->total(), 0.0f);  // zeros: repeated in-place sums stay zero
  }
  bool in() const { return q >= 0; }
  void set_pacing(const PacingConfig& c) {
    pacer = Pacer(c);
    pacer.set_background([this] { if (sync) sync->progress(); });
  }
  double reshard_s = 0, allreduce_s = 0;  // this rank's phases in the last run()
  void run() {
    if (!in()) return;
    clock.take();
    sync->sync(grads.data());
    const auto ph = clock.take();
    reshard_s = ph[int(Phase::Reshard)], allreduce_s = ph[int(Phase::DpComm)];
  }
  // One sync overlapped as in training, after an emulated backward: the device computes each
  // layer for layer_s while the host sleeps and keeps the exchanges moving (as paced timing
  // does), and each layer's regroup is posted as its gradients are final. Returns the seconds the
  // sync adds after the backward ends, on this rank.
  double run_overlapped(int layers, double layer_s) {
    if (!in()) return 0;
    sync->begin(grads.data());
    for (int l = layers - 1; l >= 0; --l) {
      emulate_compute(layer_s);
      sync->layer_gradients_ready(l);
    }
    // Nothing emulated after layer 0: the embedding backward is tiny, so the embedding bucket's
    // regroup has no compute left to hide under.
    const auto t0 = std::chrono::steady_clock::now();
    sync->finish();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void emulate_compute(double s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(s);
    while (std::chrono::steady_clock::now() < end) {
      sync->progress();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  // Paced (the pacer enabled): one training backward of the emulated device, layer by layer as a
  // TP rank runs it: the layer's compute (layer_flops on this rank), its two TP all-reduces of the
  // activations' gradients (tp_bytes each, on the scale-up link, queued behind any regroup
  // exchange on it), then the layer's regroup posted; then the sync. Seconds from the backward's
  // start to its end, to the reshard's end (the last regroup's emulated end, or the backward's
  // end if later or if there was none), and to the sync's end.
  struct PacedTimes {
    double backward = 0, reshard_end = 0, sync_end = 0;
  };
  PacedTimes run_paced(int layers, double layer_flops, double tp_bytes) {
    if (!in()) return {};
    const int n = tp->size();
    const auto t0 = pacer.now();
    auto since = [&](PaceClock::time_point t) { return std::chrono::duration<double>(t - t0).count(); };
    sync->begin(grads.data());
    for (int l = layers - 1; l >= 0; --l) {
      pacer.pace_compute(0, layer_flops);
      for (int k = 0; k < 2 && n > 1; ++k) pacer.pace_transfer(0, 2.0 * (n - 1) / n * tp_bytes, 2 * (n - 1), Link::Tp, Traffic::Activations);
      sync->layer_gradients_ready(l);
    }
    PacedTimes t;
    t.backward = since(pacer.now());
    clock.take();
    sync->finish();
    const auto ph = clock.take();
    reshard_s = ph[int(Phase::Reshard)], allreduce_s = ph[int(Phase::DpComm)];
    t.sync_end = since(pacer.now());
    t.reshard_end = std::max(t.backward, since(sync->regroup_end()));
    return t;
  }
  double bytes() const { return in() ? sync->bytes_sent() : 0.0; }
  double arena_bytes() const { return in() ? double(layout->total()) * sizeof(float) : 0.0; }

  // Small integers, exact in float under any summation order: replica q contributes (q + 1) * pat.
  static float pat(int t, long e) { return float((long(t) * 7 + e) % 13 + 1); }
  void fill_pattern() {
    for (int t = 0; t < layout->tensor_count(); ++t) {
      const auto& s = layout->specs()[t];
      const auto& sl = layout->slot(t);
      long k = 0;
      for (int u : sl.units)
        for (long e = 0; e < s.unit_elems; ++e, ++k) grads[sl.offset + k] = float(q + 1) * pat(t, long(u) * s.unit_elems + e);
    }
  }
  long long count_wrong() const {
    const int R = int(cfg.replicas.size());
    const float f = float(R) * (R + 1) / 2;
    long long wrong = 0;
    for (int t = 0; t < layout->tensor_count(); ++t) {
      const auto& s = layout->specs()[t];
      const auto& sl = layout->slot(t);
      long k = 0;
      for (int u : sl.units)
        for (long e = 0; e < s.unit_elems; ++e, ++k) wrong += grads[sl.offset + k] != f * pat(t, long(u) * s.unit_elems + e);
    }
    return wrong;
  }
};

}  // namespace ntp::bench
