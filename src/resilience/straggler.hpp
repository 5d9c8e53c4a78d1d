#pragma once
// Stragglers: a rank whose compute stays slower than its peers'. Every step each live rank's
// compute cost (TrainingRun: the seconds of its forward, backward and optimizer per FLOP of them,
// its waits in collectives left out, so that a rank given a smaller share is not taken for a fast
// one) is known to all; every rank runs this detector on the same numbers, so all reach the same
// verdicts without another message.
//
// A rank's ratio is its cost over the median of the other ranks of its group (its replica's TP
// group at its pipeline stage), or of every other live rank where it has no group peer. A rank
// that does not train (an evicted straggler) may be measured by a probe instead, whose ratio is
// given directly. A rank whose ratio stays above `threshold` for `window` consecutive steps becomes
// a straggler; one whose ratio stays at or below it for `window` steps is one no longer.
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

  // One step: compute[r] the cost of logical rank r (<= 0 or NaN: not training this step, which
  // breaks no streak and counts for nothing), group[r] its group (ranks with equal ids are peers);
  // probe[r] > 0, where given, is the ratio of a rank that does not train (its probe over a healthy
  // rank's).
  std::vector<StragglerVerdict> observe(const std::vector<double>& compute, const std::vector<int>& group,
                                        const std::vector<double>& probe = {});
  bool straggler(int rank) const { return rank < int(state_.size()) && state_[rank].straggler; }

  struct RankState {
    bool straggler = false;
    std::vector<double> streak;  // the ratios of the current run of steps on one side of the threshold
  };
  // Every rank's state: a process that joins the job takes the survivors' (the join message), so
  // that its verdicts stay the same as theirs.
  const std::vector<RankState>& state() const { return state_; }
  void restore(std::vector<RankState> s) { state_ = std::move(s); }
  // The rank's process died: whoever holds it next starts with a clean record.
  void forget(int rank) {
    if (rank < int(state_.size())) state_[rank] = {};
  }

 private:
  double threshold_;
  int window_;
  std::vector<RankState> state_;
};

}  // namespace ntp
