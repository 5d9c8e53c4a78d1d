#include "straggler.hpp"

#include <algorithm>
#include <cmath>

namespace ntp {

namespace {
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
bool training(double t) { return std::isfinite(t) && t > 0; }

// The ratio of a training rank r: its cost over its peers' median (NaN: nobody to compare with).
double training_ratio(int r, const std::vector<double>& compute, const std::vector<int>& group) {
  std::vector<double> peers, others;
  for (int q = 0; q < static_cast<int>(compute.size()); ++q) {
    if (q == r || !training(compute[q])) continue;
    others.push_back(compute[q]);
    if (group[q] == group[r]) peers.push_back(compute[q]);
  }
  const std::vector<double>& base = peers.empty() ? others : peers;
  return base.empty() ? NAN : compute[r] / median(base);  // a rank alone has nobody to be slower than
}

}  // namespace

std::vector<StragglerVerdict> StragglerDetector::observe(const std::vector<double>& compute,
                                                         const std::vector<int>& group,
                                                         const std::vector<double>& probe) {
  std::vector<StragglerVerdict> out;
  if (!enabled()) return out;
  const int n = static_cast<int>(compute.size());
  state_.resize(n);
  for (int r = 0; r < n; ++r) {
    const bool probed = !training(compute[r]) && r < static_cast<int>(probe.size()) && training(probe[r]);
    if (!training(compute[r]) && !probed) continue;
    const double ratio = probed ? probe[r] : training_ratio(r, compute, group);
    if (std::isnan(ratio)) continue;
    RankState& st = state_[r];
    // A streak counts steps on the side that would change the rank's state.
    const bool toward_change = st.straggler ? ratio <= threshold_ : ratio > threshold_;
    if (!toward_change) {
      st.streak.clear();
      continue;
    }
    st.streak.push_back(ratio);
    if (static_cast<int>(st.streak.size()) < window_) continue;
    st.straggler = !st.straggler;
    out.push_back({r, st.straggler, median(st.streak)});
    st.streak.clear();
  }
  return out;
}

}  // namespace ntp
