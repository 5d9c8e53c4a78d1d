#pragma once
// Exclusive per-phase wall time of one rank: at every moment exactly one phase is running, so the
// phase times of a step add up to the step's time. PhaseScope switches phase and switches back.
#include <array>
#include <chrono>
#include <string_view>

namespace ntp {

// Seconds of the steady clock since t0.
inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// PpComm: pipeline sends and receives between stages, including the wait for a neighbour (the
// pipeline bubble shows up there). Recovery: a repair and reconfiguration after a failure;
// Revival: bringing processes back (spawned, or spares handed their ranks) before their heal.
enum class Phase { Forward, Backward, TpComm, DpComm, PpComm, Reshard, Optimizer, Recovery, Revival, Idle, Other, Count };
constexpr int kPhaseCount = static_cast<int>(Phase::Count);
constexpr std::array<std::string_view, kPhaseCount> kPhaseNames = {
    "forward", "backward", "tp_comm", "dp_comm", "pp_comm", "reshard", "optimizer", "recovery", "revival", "idle", "other"};

class PhaseClock {
 public:
  using clock = std::chrono::steady_clock;
  PhaseClock() : since_(clock::now()) {}

  // Charges the time since the last switch to the running phase, then runs `p`. Returns the old phase.
  Phase enter(Phase p) {
    const auto now = clock::now();
    seconds_[static_cast<int>(current_)] += std::chrono::duration<double>(now - since_).count();
    since_ = now;
    const Phase old = current_;
    current_ = p;
    return old;
  }
  // Seconds accumulated in `p` so far, including the running stretch.
  double elapsed(Phase p) const {
    double s = seconds_[static_cast<int>(p)];
    if (p == current_) s += std::chrono::duration<double>(clock::now() - since_).count();
    return s;
  }
  Phase current() const { return current_; }
  // Returns the accumulated seconds per phase and starts a new accumulation.
  std::array<double, kPhaseCount> take() {
    enter(current_);
    auto out = seconds_;
    seconds_.fill(0.0);
    return out;
  }

 private:
  std::array<double, kPhaseCount> seconds_{};
  Phase current_ = Phase::Other;
  clock::time_point since_;
};

class PhaseScope {
 public:
  PhaseScope(PhaseClock& c, Phase p) : clock_(c), previous_(c.enter(p)) {}
  ~PhaseScope() { clock_.enter(previous_); }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  PhaseClock& clock_;
  Phase previous_;
};

}  // namespace ntp
