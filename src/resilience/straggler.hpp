#pragma once
// Stragglers: a rank whose compute stays slower than its peers'. Every step each live rank's
// compute time (forward + backward + optimizer, its waits in collectives left out) is known to all
// (TrainingRun shares it); every rank runs this detector on the same numbers, so all reach the same
// verdicts without another message.
//
// A rank's ratio is its compute time over the median of the other ranks of its group (its replica's
// TP group at its pipeline stage: they compute equal shares), or of every other live rank where it
// has no group peer. A rank whose ratio stays above `threshold` for `window` consecutive steps
// becomes a straggler; one whose ratio stays at or below it for `window` steps is one no longer.
#include <vector>

namespace ntp {

struct StragglerVerdict {
  int rank;
  bool starts;   // true: it became a straggler; false: its episode ended
  double ratio;  // the median of its ratios over the window
};

class StragglerDetector {
 public:
  StragglerDetector(double threshold, int window) : threshold_(threshold), window_(window) {}
  bool enabled() const { return threshold_ > 0 && window_ > 0; }

  // One step: compute[r] the seconds of logical rank r (<= 0 or NaN: not training this step, which
  // breaks no streak and counts for nothing), group[r] its group (ranks with equal ids are peers).
  std::vector<StragglerVerdict> observe(const std::vector<double>& compute, const std::vector<int>& group);
  bool straggler(int rank) const { return rank < int(state_.size()) && state_[rank].straggler; }

 private:
  struct RankState {
    bool straggler = false;
    std::vector<double> streak;  // the ratios of the current run of steps on one side of the threshold
  };
  double threshold_;
  int window_;
  std::vector<RankState> state_;
};

}  // namespace ntp
