#pragma once
// The straggler side of a run on one rank: every step's compute cost of every rank exchanged and
// judged (StragglerDetector, resilience/straggler.hpp), the verdicts kept for the next step's
// events (what they lead to is decide_straggler_actions, resilience/straggler_policy.hpp, applied
// by TrainingRun::act_on_stragglers), and --straggler-policy evict's probe: an evicted rank times
// a fixed piece of work each step against the job's median at its start.
#include <array>
#include <utility>
#include <vector>

#include "membership.hpp"
#include "options.hpp"
#include "phase_clock.hpp"
#include "straggler.hpp"
#include "trainer.hpp"

namespace ntp {

class RunRecord;

class StragglerWatch {
 public:
  explicit StragglerWatch(const Options& o)
      : policy_(o.straggler_policy), detector_(o.straggler_threshold, o.straggler_window) {}
  // A process joining the run takes the survivors' state (the join message).
  void restore(double probe_base, std::vector<StragglerDetector::RankState> state) {
    probe_base_ = probe_base;
    detector_.restore(std::move(state));
  }
  double probe_base() const { return probe_base_; }
  const std::vector<StragglerDetector::RankState>& state() const { return detector_.state(); }
  bool enabled() const { return detector_.enabled(); }

  // evict: every rank's probe (Trainer::probe_seconds) at the start; their median is the healthy
  // time an evicted rank's probe is held against (collective).
  void measure_probe_base(Trainer& trainer, const Membership& members);
  // An evicted rank, this step: its probe over the healthy one.
  void probe(Trainer& trainer) { probe_ratio_ = trainer.probe_seconds() / probe_base_; }
  double probe_ratio() const { return probe_ratio_; }
  // Step s: every rank's compute cost (seconds per FLOP, this rank's from `phases` and `r`) to
  // every rank, and the stragglers they show (collective); the recorder (`record` not null) writes
  // each verdict; under evict or rebalance they are kept for take_verdicts.
  void watch(int s, const std::array<double, kPhaseCount>& phases, const StepResult& r, const Trainer& trainer,
             const Membership& members, RunRecord* record, double now);
  // The last report's verdicts, to act on (every rank holds the same ones).
  std::vector<StragglerVerdict> take_verdicts() { return std::exchange(verdicts_, {}); }
  // Rank r died: no longer a straggler.
  void forget(int r) { detector_.forget(r); }
  // After a repair: every survivor's detector starts again from the same state (a failure inside
  // the step's exchange of compute times can leave some ranks a step ahead): ranks evicted or
  // slowed by a rebalance (`speed` below 1) are stragglers, with no streak; no verdict is pending.
  void resync(const std::vector<char>& evicted, const std::vector<double>& speed);

 private:
  const StragglerPolicy policy_;
  StragglerDetector detector_;
  std::vector<StragglerVerdict> verdicts_;
  double probe_base_ = 0;   // evict: the job's median probe seconds at its start
  double probe_ratio_ = 0;  // evicted: this step's probe over probe_base_
};

}  // namespace ntp
