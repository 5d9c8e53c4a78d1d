#pragma once
// One rank's liveness: the watchdog that ends a rank stuck past its limit (--hang-timeout), and in
// signal mode its heartbeat and its watch over its host's other ranks (HangWatch), and the death
// or hang a schedule holds for it in the current step.
#include <memory>
#include <optional>
#include <string>

#include "hang_watch.hpp"
#include "step_point.hpp"
#include "watchdog.hpp"

namespace ntp {

class Liveness {
 public:
  // limit: the watchdog's seconds (0: off). key: the job's hang-watch key, empty outside signal
  // mode (no heartbeat, no watch).
  Liveness(double limit, const std::string& key, int me, double failure_timeout);

  // This rank is at `what` of step s: the heartbeat, and the watchdog's countdown starts again.
  // `records`: the message says the results file holds the steps before.
  void progress(int s, const char* what, bool records);
  // A step that took `seconds` raises the limit to 10x the longest so far (a large model, a slow
  // device).
  void saw_step(double seconds);
  void disarm() { watchdog_.disarm(); }
  HangWatch* hang_watch() const { return hang_watch_.get(); }

  // The schedule's end of this rank in the current step: a kill (or a hang) at `at`; with
  // `takes_host`, a kill_node of its host, which takes the host's spares too.
  void doom(StepPoint at, bool hangs, bool takes_host) { doom_ = at, hangs_ = hangs, takes_host_ = takes_host; }
  bool doomed_at(StepPoint p) const { return doom_ == p; }
  // The end due at `from` strikes at `to` instead (its point did not come in this step).
  void move_doom(StepPoint from, StepPoint to) {
    if (doom_ == from) doom_ = to;
  }
  bool doomed() const { return doom_.has_value(); }
  // The process ends here, as a crashed GPU's host process would. A scheduled hang stops it here
  // instead, every thread with it, until a survivor of its host ends it (hang_watch.hpp);
  // continued before that (kill -CONT), it is no longer the job's: it dies all the same.
  // `ranks`: the job's trainer count (its spares' keys follow).
  [[noreturn]] void die(int ranks);

 private:
  const int me_;
  double limit_;
  std::unique_ptr<HangWatch> hang_watch_;
  Watchdog watchdog_;
  std::optional<StepPoint> doom_;
  bool hangs_ = false, takes_host_ = false;
};

}  // namespace ntp
