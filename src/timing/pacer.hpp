#pragma once
// Paced timing (--timing paced) for machines with fewer cores than ranks. Each rank emulates one
// GPU of a machine (--machine: its device, scale-up and scale-out links and latency), every rate
// slowed by one factor (--time-scale) so that this machine's real work fits inside emulated time.
// The arithmetic stays real; the wall clock becomes the emulated device's. Sleeping frees the core
// for the other ranks, and ranks waiting in a collective for a slower (paced) peer wait as they
// would on real hardware, so the critical path of a step is the emulated one.
//
// The emulated resources of one rank work at the same time, as a GPU's SMs, its NVLink and its NIC
// do:
// - the compute engine: a compute phase ends at max(real time, FLOPs / rate) after it began (the
//   rank's thread is the engine's queue: it computes one phase at a time);
// - the scale-up link and the scale-out link, each busy until a time. A transfer occupies its link
//   from when it is posted, or from when the transfers already on that link end (they queue), for
//   latency x messages + bytes / bandwidth. A nonblocking exchange posted during the backward so
//   occupies its link while compute goes on; waiting for it blocks until its emulated end (nothing,
//   if that has passed: the exchange was hidden), or until its real end if that is later. A
//   blocking transfer is one posted when it began and waited for at once.
// A phase whose real time exceeded its emulated time is an overrun: the emulation was not honest
// for that step. Compute and transfer overruns are counted and their seconds summed per step
// (real MPI copies on shared cores can outrun a fast emulated link, and the wait then ends late;
// so can a peer that is late to the exchange: where that is by design, between pipeline stages,
// the trainer meets the peer before the transfer, so only the copy is timed).
// Limits: the links are each rank's own. Ranks that share a real link (eight GPUs behind one NIC)
// do not contend for it, and a collective costs its own bytes over its link: a late peer shows up
// as real waiting inside the collective, not in the model.
#include <chrono>
#include <functional>
#include <utility>

namespace ntp {

// --emulate-shape: paced timing charges compute and communication as a larger target model would
// at the same layout and tokens, while the arithmetic stays the model's. Each factor is the
// target's over the model's; 1 everywhere when nothing is emulated.
struct ShapeCharge {
  double flops = 1;             // training FLOPs per token
  double activation_bytes = 1;  // bytes of one TP or pipeline transfer of activations (hidden size)
  double activation_calls = 1;  // TP transfers of activations per step (layers): each real one stands for this many
  double parameter_bytes = 1;   // gradient and parameter transfers (parameter count)
  double element_bytes = 1;     // the emulated job's bytes per element over the 4 of a float here
  bool operator==(const ShapeCharge&) const = default;
};

// The rates one rank emulates: a machine profile's (machine_profile.hpp) divided by time_scale,
// or --machine custom's flags as given.
struct PacingConfig {
  bool enabled = false;
  double device_gflops = 10.0;  // per rank
  double memory_gbps = 0;       // GB/s, the device's memory (0: the optimizer is charged by its FLOPs alone)
  double tp_gbps = 20.0;        // GB/s, inside a replica (scale-up link)
  double dp_gbps = 5.0;         // GB/s, between replicas (scale-out link)
  double latency_us = 5.0;      // per message
  double boost = 1.3;           // ntp-pw: a damaged replica's ranks run this much faster
  double time_scale = 1.0;      // the emulated machine runs this many times slower than the machine named
  ShapeCharge shape;
  bool operator==(const PacingConfig&) const = default;
};

// What a transfer carries, for --emulate-shape's charge: activations (scaled by the target's
// hidden size and layer count) or parameters and their gradients (by its parameter count).
// Every transfer of activations is charged as a layer's, including those that happen once per
// model (the embedding's and the loss's all-reduces, a pipeline send): an over-charge, kept because
// this machine runs a small all-reduce among oversubscribed ranks in milliseconds, and charging
// those the target's few microseconds would need a time scale 8x larger (docs/timing.md).
enum class Traffic { Activations, Parameters };
// AdamW per parameter: about a dozen FLOPs, and 28 bytes of memory traffic: the fp32 weight,
// gradient and two moments read, the weight and moments written (mixed-precision training keeps
// all four in fp32).
inline constexpr double kAdamWFlopsPerParameter = 12;
inline constexpr double kAdamWBytesPerParameter = 28;

// The group a transfer runs in: Tp, a replica's TP group (and its reshards); Dp, a sync slot across
// replicas. Each group's transfers take one physical link (set_route): the scale-up link inside a
// node (--tp-gbps) or the scale-out link between nodes (--dp-gbps). By default a TP group is one
// node (Tp -> scale-up, Dp -> scale-out), as when one machine emulates a cluster; on a job spread
// over several real hosts the trainer routes each group by where its members really run.
enum class Link { Tp, Dp };

// What the pacer reads the time from and sleeps on: the steady clock, or a test's virtual clock
// (sleeping advances it), which makes the model's arithmetic exact to test.
class PaceClock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  virtual ~PaceClock() = default;
  virtual time_point now() = 0;
  virtual void sleep_until(time_point t) = 0;
  static PaceClock& steady();
};

// A transfer on an emulated link: when it was posted, and its emulated end (start on its link plus
// its link time). Default: nothing posted (unpaced), nothing to wait for.
struct LinkTicket {
  PaceClock::time_point posted{}, start{}, end{};  // start: when it took its link
};

class Pacer {
 public:
  explicit Pacer(const PacingConfig& c, PaceClock& clock = PaceClock::steady()) : c_(c), clock_(&clock) {}
  bool enabled() const { return c_.enabled; }
  // Compute speed multiplier of this rank now (1, or the boost of an ntp-pw damaged replica).
  void set_speed(double s) { speed_ = s; }
  double speed() const { return speed_; }
  // A slowed rank (a schedule's `slow` event: a throttled GPU, a degraded link): its compute takes
  // `compute` times as long, its transfers `link` times (paced timing); under wall timing, where
  // the links are real, it sleeps (compute - 1) x each compute phase's real time after it.
  void set_slowdown(double compute, double link) { slow_compute_ = compute, slow_link_ = link; }
  double slowdown() const { return slow_compute_; }
  // Transfers of `group` go over the scale-up link (Link::Tp) or the scale-out link (Link::Dp).
  void set_route(Link group, Link physical) { route_[static_cast<int>(group)] = physical; }
  Link route(Link group) const { return route_[static_cast<int>(group)]; }

  // Seconds the emulated device needs for `flops`, and for a transfer of `bytes` in `messages`
  // within `group` (over the link it is routed to).
  // Under --emulate-shape, `flops` of the model stand for the target's (ShapeCharge::flops).
  double compute_seconds(double flops) const;
  double transfer_seconds(double bytes, int messages, Link group, Traffic traffic) const;

  // After a compute phase that took `real` seconds: sleeps until its emulated end.
  void pace_compute(double real, double flops);
  // After the optimizer's pass over `parameters` that took `real` seconds. AdamW is memory-bound on
  // a GPU: its emulated time is the longer of its FLOPs at the device's rate and its bytes at the
  // device's memory bandwidth (kAdamWFlopsPerParameter, kAdamWBytesPerParameter), both charged for
  // the target's parameters under --emulate-shape.
  void pace_optimizer(double real, double parameters);
  double optimizer_seconds(double parameters) const;
  // After any other pass over the parameters or their gradients (zeroing the gradients: 4 bytes
  // written each; their sum of squares for the global norm: 4 bytes read, 2 FLOPs), charged as the
  // optimizer is: the longer of its FLOPs and its bytes, for the target's parameters.
  void pace_pass(double real, double parameters, double flops_per_parameter, double bytes_per_parameter);
  double pass_seconds(double parameters, double flops_per_parameter, double bytes_per_parameter) const;
  // After a blocking transfer that took `real` seconds: the transfer occupied its link from when it
  // began (behind what was on the link already); sleeps until its emulated end.
  void pace_transfer(double real, double bytes, int messages, Link group, Traffic traffic);
  // A nonblocking transfer posted now (or at `posted`): it takes its link from then, or once the
  // link is free, and the ticket says when it ends.
  LinkTicket post(double bytes, int messages, Link group, Traffic traffic) {
    return post_at(now(), bytes, messages, group, traffic);
  }
  LinkTicket post_at(PaceClock::time_point posted, double bytes, int messages, Link group, Traffic traffic);
  // Called once the real transfer is done, having waited for it since `began` (the caller's
  // wait, e.g. MPI_Waitall, began then): sleeps until the emulated end. If the real wait went on
  // past the emulated end, the link was slower than emulated: an overrun.
  void wait(const LinkTicket& t, PaceClock::time_point began);
  PaceClock::time_point now() const { return clock_->now(); }
  // Called every few hundred microseconds while the pacer sleeps: the emulated device computes,
  // and the host keeps the exchanges in flight moving (MPI progresses only inside MPI calls).
  void set_background(std::function<void()> f) { background_ = std::move(f); }

  // Compute overruns since the last call.
  int take_overruns() { return std::exchange(overruns_, 0); }
  // The worst ratio of real to emulated time of a compute phase since the last call (a device rate
  // divided by it would have kept up).
  double take_worst_ratio() { return std::exchange(worst_ratio_, 0); }
  // Seconds by which compute phases ran over their emulated time, since the last call.
  double take_overrun_seconds() { return std::exchange(overrun_seconds_, 0); }
  // The compute counters, to put back after a compute phase that is no step's (Trainer::probe_seconds).
  struct Counters {
    int overruns;
    double worst_ratio, overrun_seconds;
  };
  Counters counters() const { return {overruns_, worst_ratio_, overrun_seconds_}; }
  void set_counters(Counters c) { overruns_ = c.overruns, worst_ratio_ = c.worst_ratio, overrun_seconds_ = c.overrun_seconds; }
  const PacingConfig& config() const { return c_; }
  // New rates (paced timing's calibration settles the time scale after the trainer exists).
  void set_config(const PacingConfig& c) { c_ = c; }
  // Transfers whose real end came after their emulated end, since the last call, and by how many
  // seconds in all.
  int take_link_overruns() { return std::exchange(link_overruns_, 0); }
  double take_link_overrun_seconds() { return std::exchange(link_overrun_seconds_, 0); }
  // The worst ratio of real to emulated time of a transfer since the last call (an upper bound:
  // a nonblocking exchange's real end is known only as its wait's end). With
  // take_worst_ratio, what paced timing's calibration reads.
  double take_worst_link_ratio() { return std::exchange(worst_link_ratio_, 0); }
  // Real seconds the paced calls covered since the last call: each compute phase from its real
  // start to the end of its sleep, each wait from its start to the end of its sleep. The rest of a
  // step's real time is the host's own work (bookkeeping, unpaced passes), which the emulated device
  // would not take. A sleep that wakes late on a crowded core is the machine's scheduling, not work
  // of the rank: it is covered (and any lateness it causes a peer shows as the peer's late transfer).
  double take_covered_seconds() { return std::exchange(covered_seconds_, 0); }
  // `real` seconds in an unpaced collective of a few scalars (the loss, the norm's partials, the
  // commit's vote): a wait for the slowest peer, whose lateness counts on that peer, so neither a
  // transfer to judge nor the host's own work. Counted as covered.
  void note_wait(double real) {
    if (c_.enabled) covered_seconds_ += real;
  }
  // Runs such a collective (or a meeting of pipeline stages) and notes its time as a wait.
  template <class Collective>
  void wait_for_peers(Collective&& collective) {
    const auto t0 = clock_->now();
    collective();
    note_wait(std::chrono::duration<double>(clock_->now() - t0).count());
  }
  // Every counter above back to zero.
  void reset_counters() {
    overruns_ = link_overruns_ = 0;
    worst_ratio_ = overrun_seconds_ = worst_link_ratio_ = link_overrun_seconds_ = covered_seconds_ = 0;
  }
  // Off: phases are measured but nobody sleeps (calibration at the machine's own rates, where
  // sleeping would take seconds per phase).
  void set_sleeping(bool on) { sleeping_ = on; }

 private:
  void pace_target(double real, double emulated);  // a compute phase's pacing, its emulated time known
  void sleep_rest(double real, double target);
  void sleep_for(double seconds);
  PacingConfig c_;
  PaceClock* clock_;
  std::function<void()> background_;
  double speed_ = 1.0;
  double slow_compute_ = 1.0, slow_link_ = 1.0;
  bool sleeping_ = true;
  int overruns_ = 0;
  double worst_ratio_ = 0, overrun_seconds_ = 0;
  int link_overruns_ = 0;
  double worst_link_ratio_ = 0, link_overrun_seconds_ = 0;
  double covered_seconds_ = 0;
  Link route_[2] = {Link::Tp, Link::Dp};
  PaceClock::time_point link_free_[2]{};  // per physical link: the end of the last transfer on it
};

}  // namespace ntp
