#pragma once
// The emulated machine's clock under paced timing. This host runs the emulated machine slowed by
// the time scale, so a span of its run clock is that span over the factor on the machine: a step,
// and a wait for peers (a wait stays a wait). A recovery's parts are not the machine's work run
// slowly but this host's own (an MPI shrink, a process spawned here): each is charged the seconds
// the machine's profile gives it instead, at once, and no rank sleeps them. The clock maps a
// moment of the run clock to the emulated one: t / factor, plus, for every charged span that ended
// by then, its charge minus its own span over the factor. Under wall timing it is the run clock.
//
// Charges may be told in any order: a moment's emulated time counts the spans that ended by it, so
// an event recorded after a later charge (a kill noticed before the repair it caused) keeps its place.
#include <algorithm>
#include <vector>

namespace ntp {

class EmulatedClock {
 public:
  explicit EmulatedClock(double factor = 1.0) : factor_(factor > 0 ? factor : 1.0) {}
  double factor() const { return factor_; }

  // The emulated time of run-clock moment t.
  double at(double t) const {
    double e = t / factor_;
    for (const Span& s : spans_)
      if (s.end <= t) e += s.charged - (s.end - s.start) / factor_;
    return e;
  }
  // The emulated length of [t, t + seconds] (a wait, or work run slowed: charges in it count).
  double span(double t, double seconds) const { return at(t + seconds) - at(t); }
  // The run-clock span [t, t + seconds] was this host's own work; the machine pays `charged`
  // seconds for it. Returns the charge.
  double charge(double t, double seconds, double charged) {
    spans_.push_back({t, t + seconds, charged});
    return charged;
  }
  // Every charge told so far came before run-clock moment t (a step starts after the recovery
  // that preceded it): spans the ranks' reduced times stretched past t end there.
  void settle(double t) {
    for (Span& s : spans_)
      if (s.end > t) s.start = std::min(s.start, t), s.end = t;
  }
  // A recorder that takes over a file: its last emulated moment `emulated` was run-clock `t`; the
  // charges before it are one.
  void resume(double t, double emulated) {
    spans_.clear();
    spans_.push_back({t, t, emulated - t / factor_});
  }

 private:
  struct Span {
    double start = 0, end = 0, charged = 0;
  };
  double factor_;
  std::vector<Span> spans_;
};

}  // namespace ntp
