#include "straggler_policy.hpp"

#include <algorithm>

namespace ntp {

StragglerDecision decide_straggler_actions(const std::vector<StragglerVerdict>& verdicts, bool evict,
                                           const std::vector<char>& alive, std::vector<char> evicted,
                                           std::vector<double> speed,
                                           const std::function<std::string(const std::vector<char>&)>& refuse) {
  speed.resize(alive.size(), 1.0);
  std::vector<StragglerAction> actions;
  for (const StragglerVerdict& v : verdicts) {
    if (!alive[v.rank]) continue;  // it died since
    if (!evict) {
      if (!v.starts && speed[v.rank] == 1.0) continue;  // nothing to undo
      speed[v.rank] = v.starts ? std::min(1.0, 1.0 / v.ratio) : 1.0;
      actions.push_back({v.rank, v.starts ? StragglerActionKind::Rebalance : StragglerActionKind::RebalanceEnd, ""});
      continue;
    }
    if (!v.starts) {
      if (!evicted[v.rank]) continue;  // never evicted (refused): nothing to undo
      evicted[v.rank] = 0;
      actions.push_back({v.rank, StragglerActionKind::Rejoin, ""});
      continue;
    }
    std::vector<char> trial = evicted;
    trial[v.rank] = 1;
    if (std::string why = refuse(trial); !why.empty()) {
      actions.push_back({v.rank, StragglerActionKind::EvictRefused, std::move(why)});
      continue;
    }
    evicted = std::move(trial);
    actions.push_back({v.rank, StragglerActionKind::Evict, ""});
  }
  // Speeds all at 1 are no speeds (the even split: Trainer::set_rank_speeds' empty).
  if (std::all_of(speed.begin(), speed.end(), [](double x) { return x == 1.0; })) speed.clear();
  return {std::move(evicted), std::move(speed), std::move(actions)};
}

}  // namespace ntp
