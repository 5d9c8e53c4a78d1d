#include "straggler_watch.hpp"

#include <algorithm>

#include "run_record.hpp"

namespace ntp {

void StragglerWatch::measure_probe_base(Trainer& trainer, const Membership& members) {
  double best = trainer.probe_seconds();  // the first also allocates: the best of three
  for (int i = 0; i < 2; ++i) best = std::min(best, trainer.probe_seconds());
  std::vector<double> all(members.size(), 0.0);
  all[members.me] = best;
  members.group().allreduce_sum(all.data(), all.size());
  std::vector<double> measured;
  for (double t : all)
    if (t > 0) measured.push_back(t);
  std::sort(measured.begin(), measured.end());
  probe_base_ = measured[measured.size() / 2];
}

void StragglerWatch::watch(int s, const std::array<double, kPhaseCount>& phases, const StepResult& r,
                           const Trainer& trainer, const Membership& members, RunRecord* record, double now) {
  // Seconds per FLOP, so that a rank given a smaller share (rebalance) still shows its speed; an
  // evicted rank's probe ratio beside it.
  const std::size_t n = members.size();
  std::vector<double> both(2 * n, 0.0);
  if (r.trained && r.compute_flops > 0)
    both[members.me] = (phases[int(Phase::Forward)] + phases[int(Phase::Backward)] + phases[int(Phase::Optimizer)]) /
                       r.compute_flops;
  if (members.evicted[members.me]) both[n + members.me] = probe_ratio_;
  members.group().allreduce_sum(both.data(), both.size());
  const std::vector<double> compute(both.begin(), both.begin() + std::ptrdiff_t(n));
  const std::vector<double> probe(both.begin() + std::ptrdiff_t(n), both.end());
  // Peers compute equal shares: the TP group of one replica at one pipeline stage.
  const Configuration& cfg = trainer.configuration();
  std::vector<int> group(n, -1);
  for (int k = 0; k < int(group.size()); ++k)
    if (const int q = cfg.replica_of(k); q >= 0) group[k] = q * cfg.replicas[q].stages + cfg.stage_of(k);
  for (const StragglerVerdict& v : detector_.observe(compute, group, probe)) {
    if (record) record->record_straggler(s, v, now);
    if (policy_ != StragglerPolicy::Tolerate) verdicts_.push_back(v);
  }
}

void StragglerWatch::resync(const std::vector<char>& evicted, const std::vector<double>& speed) {
  verdicts_.clear();
  if (!enabled()) return;
  std::vector<StragglerDetector::RankState> state(evicted.size());
  for (std::size_t r = 0; r < state.size(); ++r) state[r].straggler = evicted[r] || (r < speed.size() && speed[r] < 1.0);
  detector_.restore(std::move(state));
}

}  // namespace ntp
