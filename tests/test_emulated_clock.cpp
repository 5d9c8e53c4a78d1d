// The emulated clock (io/emulated_clock.hpp): spans of the run clock over the factor, charges in
// their place, in any order, and a recorder's resumption.
#include <gtest/gtest.h>

#include "emulated_clock.hpp"

namespace {

TEST(EmulatedClock, WallTimingIsTheRunClock) {
  const ntp::EmulatedClock c;
  EXPECT_DOUBLE_EQ(c.at(12.5), 12.5);
  EXPECT_DOUBLE_EQ(c.span(3, 2), 2);
}

TEST(EmulatedClock, AChargeReplacesTheHostsSpanWhateverTheFactor) {
  for (const double factor : {64.0, 256.0}) {
    ntp::EmulatedClock c(factor);
    // Steps of 1 emulated second, then this host's 3 s of repair charged 2 s, then a step.
    const double step = factor, t_repair = 2 * step, host_repair = 3;
    EXPECT_DOUBLE_EQ(c.charge(t_repair, host_repair, 2.0), 2.0);
    EXPECT_DOUBLE_EQ(c.at(step), 1.0);
    EXPECT_DOUBLE_EQ(c.at(t_repair), 2.0);
    EXPECT_DOUBLE_EQ(c.at(t_repair + host_repair), 4.0);
    EXPECT_DOUBLE_EQ(c.span(t_repair + host_repair, step), 1.0);
    EXPECT_DOUBLE_EQ(c.at(t_repair + host_repair + step), 5.0);
  }
}

TEST(EmulatedClock, AMomentBeforeALaterChargeKeepsItsPlace) {
  ntp::EmulatedClock c(100);
  c.charge(50, 10, 7);
  EXPECT_DOUBLE_EQ(c.at(40), 0.4);            // a kill noticed before the repair, recorded after it
  EXPECT_DOUBLE_EQ(c.span(40, 30), 0.2 + 7);  // a span across the repair: 20 s of it run slowly, then the charge
}

TEST(EmulatedClock, AStepStartsAfterTheChargesBeforeIt) {
  ntp::EmulatedClock c(10);
  c.charge(5, 2, 3);  // the ranks' slowest parts, summed, end at 7; the step began at 6
  c.charge(7, 0, 1);
  c.settle(6);
  EXPECT_DOUBLE_EQ(c.at(6), 0.6 + (3 - 0.1) + 1);  // the first span cut at 6: 1 s of it here
  EXPECT_DOUBLE_EQ(c.span(6, 10), 1.0);
}

TEST(EmulatedClock, ATakeOverResumesFromTheFilesLastMoment) {
  ntp::EmulatedClock c(10);
  c.resume(100, 42);
  EXPECT_DOUBLE_EQ(c.at(100), 42);
  EXPECT_DOUBLE_EQ(c.at(110), 43);
}

}  // namespace
