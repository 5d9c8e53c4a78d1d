#pragma once
// Paced timing (--timing paced) for machines with fewer cores than ranks. Each rank emulates a
// device of --device-gflops and links of --tp-gbps / --dp-gbps (GB/s) with --link-latency-us:
// after a compute phase the rank sleeps until max(real time, FLOPs / rate) has passed, after a
// transfer until max(real time, latency + bytes / bandwidth). The arithmetic stays real; the wall
// clock becomes the emulated device's. Sleeping frees the core for the other ranks, and ranks
// waiting in a collective for a slower (paced) peer wait as they would on real hardware, so the
// critical path of a step is the emulated one. A compute phase whose real time exceeded its
// emulated time is an overrun: the emulation was not honest for that step, and it is recorded.
#include <chrono>
#include <functional>

namespace ntp {

struct PacingConfig {
  bool enabled = false;
  double device_gflops = 10.0;  // per rank
  double tp_gbps = 20.0;        // GB/s, inside a replica (scale-up link)
  double dp_gbps = 5.0;         // GB/s, between replicas (scale-out link)
  double latency_us = 5.0;      // per message
  double boost = 1.3;           // ntp-pw: a damaged replica's ranks run this much faster
  bool operator==(const PacingConfig&) const = default;
};

// The group a transfer runs in: Tp, a replica's TP group (and its reshards); Dp, a sync slot across
// replicas. Each group's transfers take one physical link (set_route): the scale-up link inside a
// node (--tp-gbps) or the scale-out link between nodes (--dp-gbps). By default a TP group is one
// node (Tp -> scale-up, Dp -> scale-out), as when one machine emulates a cluster; on a job spread
// over several real hosts the trainer routes each group by where its members really run.
enum class Link { Tp, Dp };

class Pacer {
 public:
  explicit Pacer(const PacingConfig& c) : c_(c) {}
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
  double compute_seconds(double flops) const;
  double transfer_seconds(double bytes, int messages, Link group) const;

  // Sleeps until `target` seconds have passed since the phase took `real` seconds.
  void pace_compute(double real, double flops);
  void pace_transfer(double real, double bytes, int messages, Link link);
  // Sleeps until `t` (an emulated transfer that overlapped other work ends then).
  void wait_until(std::chrono::steady_clock::time_point t);
  // Called every few hundred microseconds while the pacer sleeps: the emulated device computes,
  // and the host keeps the exchanges in flight moving (MPI progresses only inside MPI calls).
  void set_background(std::function<void()> f) { background_ = std::move(f); }

  // Compute overruns since the last call.
  int take_overruns() {
    const int n = overruns_;
    overruns_ = 0;
    return n;
  }
  // The worst ratio of real to emulated time of a compute phase since the last call (a device rate
  // divided by it would have kept up).
  double take_worst_ratio() {
    const double r = worst_ratio_;
    worst_ratio_ = 0;
    return r;
  }
  // Both counters, to put back after a compute phase that is no step's (Trainer::probe_seconds).
  struct Counters {
    int overruns;
    double worst_ratio;
  };
  Counters counters() const { return {overruns_, worst_ratio_}; }
  void set_counters(Counters c) { overruns_ = c.overruns, worst_ratio_ = c.worst_ratio; }
  const PacingConfig& config() const { return c_; }

 private:
  void sleep_rest(double real, double target);
  void sleep_for(double seconds);
  PacingConfig c_;
  std::function<void()> background_;
  double speed_ = 1.0;
  double slow_compute_ = 1.0, slow_link_ = 1.0;
  int overruns_ = 0;
  double worst_ratio_ = 0;
  Link route_[2] = {Link::Tp, Link::Dp};
};

}  // namespace ntp
