#pragma once
// --time-scale auto: the one factor by which paced timing slows the emulated machine, chosen at
// start-up so that this machine's real work fits inside emulated time with --headroom to spare.
// Dry steps (forward, backward and gradient sync, no update, no sample consumed) on every rank at
// once: first at the machine's own rates without sleeping, which times compute (real over
// emulated seconds of each phase); then paced at the factor that suggests, which times the
// transfers too (their real time is honest only once the ranks run in step, as they will). The
// worst phase of the worst rank decides, the better of two dry steps at each factor; the factor is
// a power of 2.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "options.hpp"

namespace ntp {

class Comm;
class Trainer;

// The smallest power of 2 that is at least x (1 for x <= 1).
double power_of_2_at_least(double x);

// One paced trial: at `scale`, the worst phase took `ratio` of its emulated time. Its parts, worst
// over ranks: compute phases, transfers, and the host's own time outside paced phases over what
// the verdict allows of a step (ratio is the largest; they say what set the factor).
struct ScaleTrial {
  double scale = 0, ratio = 0;
  double compute = 0, links = 0, host = 0;
};

// After `trials` (the newest last) at `headroom`: the next factor to try, or the answer (settled:
// a factor tried at which every phase fit with headroom, whose half failed or would fail by its
// ratio). Up by the power of 2 the worst phase lacked; down by the power of 2 the ratio leaves
// room for, not to or below a factor that failed.
struct ScaleStep {
  double scale = 0;
  bool settled = false;
};
ScaleStep next_time_scale(const std::vector<ScaleTrial>& trials, double headroom);

struct Calibration {
  double scale = 1;
  double compute_ratio = 0;  // the unpaced dry step: worst real / emulated compute at the machine's rates
  std::vector<ScaleTrial> trials;
  bool fits = false;  // the chosen factor was tried and fit
};

// Collective over the trainer's group. Leaves the trainer's pacer at the chosen factor.
Calibration calibrate_time_scale(const Options& o, Trainer& trainer, Comm& group);

// The emulated machine in a line for the banner, and in full for the results file (root
// attribute `paced_machine`): the profile, the factor and how it was chosen, the rates run, and
// --emulate-shape's charge. `calibration`: null when the factor was given.
std::string describe_paced_machine(const Options& o, const Calibration* calibration);
nlohmann::json paced_machine_record(const Options& o, const Calibration* calibration);
// What a recovery's parts cost on the machine (jobs/machines/*.yaml, or the run's own figure in
// place of one), each with its source.
nlohmann::json recovery_costs_record(const Options& o);

}  // namespace ntp
