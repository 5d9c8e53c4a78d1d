// Paced timing's concurrent resources (pacer.hpp) on a virtual clock: the compute engine and the two
// links work at once, transfers on one link queue, and a wait ends at the emulated end of what it
// waits for. Every expectation is the model's arithmetic, to the nanosecond.
#include <gtest/gtest.h>

#include <chrono>

#include "pacer.hpp"

namespace {

using ntp::Link;
using ntp::Traffic;
using ntp::PaceClock;

// Sleeping advances it; a test advances it by hand for the real time a phase took.
class VirtualClock final : public PaceClock {
 public:
  time_point now() override { return t_; }
  void sleep_until(time_point t) override { t_ = std::max(t_, t); }
  void advance(double seconds) {
    t_ += std::chrono::duration_cast<time_point::duration>(std::chrono::duration<double>(seconds));
  }
  double since(time_point t0) const { return std::chrono::duration<double>(t_ - t0).count(); }

 private:
  time_point t_{std::chrono::seconds(1000)};
};

// 1 GFLOP/s, links of 1 GB/s (scale-up) and 0.5 GB/s (scale-out), no latency unless a test sets it:
// 1 MFLOP takes 1 ms, 1 MB 1 ms on the scale-up link and 2 ms on the scale-out link.
ntp::PacingConfig paced() {
  ntp::PacingConfig c;
  c.enabled = true, c.device_gflops = 1, c.tp_gbps = 1, c.dp_gbps = 0.5, c.latency_us = 0;
  return c;
}

constexpr double kMs = 1e-3, kNs = 1e-9;

struct PacerTest : ::testing::Test {
  VirtualClock clock;
  ntp::Pacer pacer{paced(), clock};
  PaceClock::time_point t0 = clock.now();
};

TEST_F(PacerTest, AFullyHiddenExchangeAddsNothing) {
  const auto t = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);  // 1 ms on the scale-up link ...
  pacer.pace_compute(0, 5e6);                    // ... under 5 ms of compute
  EXPECT_NEAR(clock.since(t0), 5 * kMs, kNs);
  pacer.wait(t, clock.now());  // the real exchange was done by now
  EXPECT_NEAR(clock.since(t0), 5 * kMs, kNs);
  EXPECT_EQ(pacer.take_link_overruns(), 0);
}

TEST_F(PacerTest, AFullyExposedExchangeAddsItsLinkTime) {
  const auto t = pacer.post(3e6, 1, Link::Tp, Traffic::Activations);
  pacer.wait(t, t.posted);
  EXPECT_NEAR(clock.since(t0), 3 * kMs, kNs);
}

TEST_F(PacerTest, APartlyHiddenExchangeAddsTheRest) {
  const auto t = pacer.post(3e6, 1, Link::Tp, Traffic::Activations);  // 3 ms, 1 ms of it under compute
  pacer.pace_compute(0, 1e6);
  pacer.wait(t, clock.now());
  EXPECT_NEAR(clock.since(t0), 3 * kMs, kNs);
}

TEST_F(PacerTest, TwoTransfersOnOneLinkAddUp) {
  const auto a = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  const auto b = pacer.post(2e6, 1, Link::Tp, Traffic::Activations);  // starts when a ends
  EXPECT_NEAR(std::chrono::duration<double>(b.end - a.end).count(), 2 * kMs, kNs);
  pacer.wait(b, clock.now());
  EXPECT_NEAR(clock.since(t0), 3 * kMs, kNs);
  pacer.wait(a, clock.now());  // long over
  EXPECT_NEAR(clock.since(t0), 3 * kMs, kNs);
}

TEST_F(PacerTest, TransfersOnDifferentLinksOverlap) {
  const auto a = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);  // 1 ms scale-up
  const auto b = pacer.post(1e6, 1, Link::Dp, Traffic::Activations);  // 2 ms scale-out, at the same time
  pacer.wait(a, clock.now());
  pacer.wait(b, clock.now());
  EXPECT_NEAR(clock.since(t0), 2 * kMs, kNs);
}

TEST_F(PacerTest, GroupsRoutedToOneLinkShareIt) {
  pacer.set_route(Link::Dp, Link::Tp);  // a sync slot inside one node: it takes the scale-up link too
  const auto a = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  const auto b = pacer.post(1e6, 1, Link::Dp, Traffic::Activations);
  pacer.wait(a, clock.now());
  pacer.wait(b, clock.now());
  EXPECT_NEAR(clock.since(t0), 2 * kMs, kNs);
}

TEST_F(PacerTest, ABlockingTransferQueuesBehindAPostedOne) {
  pacer.post(1e6, 1, Link::Tp, Traffic::Activations);           // a regroup exchange in flight ...
  pacer.pace_transfer(0, 1e6, 1, Link::Tp, Traffic::Activations);  // ... and a TP all-reduce of the backward behind it
  EXPECT_NEAR(clock.since(t0), 2 * kMs, kNs);
  pacer.pace_transfer(0, 1e6, 1, Link::Dp, Traffic::Activations);  // the scale-out link was free all along
  EXPECT_NEAR(clock.since(t0), 4 * kMs, kNs);
}

TEST_F(PacerTest, ABlockingTransferCountsFromWhenItBegan) {
  clock.advance(0.4 * kMs);                      // the real transfer took 0.4 ms ...
  pacer.pace_transfer(0.4 * kMs, 1e6, 1, Link::Tp, Traffic::Activations);  // ... of its emulated 1 ms
  EXPECT_NEAR(clock.since(t0), 1 * kMs, kNs);
}

TEST_F(PacerTest, ARealEndAfterTheEmulatedOneIsAnOverrun) {
  const auto t = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  clock.advance(3 * kMs);  // the real exchange took 3 ms, waited for from its post
  pacer.wait(t, t.posted);
  EXPECT_NEAR(clock.since(t0), 3 * kMs, kNs);  // no sleep: the real end is later
  EXPECT_EQ(pacer.take_link_overruns(), 1);
  EXPECT_EQ(pacer.take_link_overruns(), 0);
  clock.advance(2 * kMs);
  pacer.pace_transfer(2 * kMs, 1e6, 1, Link::Dp, Traffic::Activations);  // 2 ms real, 2 ms emulated: on time
  EXPECT_EQ(pacer.take_link_overruns(), 0);
}

TEST_F(PacerTest, LatencyCountsPerMessage) {
  ntp::PacingConfig c = paced();
  c.latency_us = 10;
  ntp::Pacer p(c, clock);
  const auto t = p.post(1e6, 7, Link::Tp, Traffic::Activations);
  p.wait(t, t.posted);
  EXPECT_NEAR(clock.since(t0), 1 * kMs + 70e-6, kNs);
}

TEST_F(PacerTest, TheHostKeepsExchangesMovingWhileItWaits) {
  int calls = 0;
  pacer.set_background([&] { ++calls; });
  const auto t = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  pacer.wait(t, t.posted);
  EXPECT_NEAR(clock.since(t0), 1 * kMs, kNs);
  EXPECT_EQ(calls, 5);  // every 200 microseconds of the 1 ms
}

TEST(Pacer, UnderWallTimingNothingWaits) {
  VirtualClock clock;
  ntp::PacingConfig wall = paced();
  wall.enabled = false;
  ntp::Pacer p(wall, clock);
  const auto t0 = clock.now();
  p.wait(p.post(1e9, 1, Link::Tp, Traffic::Activations), t0);
  p.pace_transfer(0, 1e9, 1, Link::Dp, Traffic::Activations);
  p.pace_compute(0, 1e9);
  EXPECT_EQ(clock.now(), t0);
}

}  // namespace

// What the verdict and the calibration read: overrun seconds, and the worst real / emulated ratio.
TEST_F(PacerTest, OverrunsAreMeasuredInSeconds) {
  pacer.pace_compute(3 * kMs, 1e6);  // 3 ms real for 1 ms emulated: 2 ms over
  EXPECT_NEAR(pacer.take_overrun_seconds(), 2 * kMs, kNs);
  EXPECT_NEAR(pacer.take_worst_ratio(), 3.0, 1e-9);
  pacer.pace_compute(0.5 * kMs, 1e6);  // fits: nothing over
  EXPECT_EQ(pacer.take_overrun_seconds(), 0);
  const auto t = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);  // 1 ms emulated
  clock.advance(4 * kMs);                                            // real: 4 ms from the post
  pacer.wait(t, t.posted);
  EXPECT_NEAR(pacer.take_link_overrun_seconds(), 3 * kMs, kNs);
  EXPECT_NEAR(pacer.take_worst_link_ratio(), 4.0, 1e-9);
}

TEST_F(PacerTest, ATransferFoundDoneAfterItsEmulatedEndSaysNothingOfItsRatio) {
  const auto t = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  clock.advance(6 * kMs);  // compute went on; the wait begins after the emulated end and finds it done
  pacer.wait(t, clock.now());
  EXPECT_EQ(pacer.take_link_overruns(), 0);
  EXPECT_EQ(pacer.take_worst_link_ratio(), 0);
}

TEST_F(PacerTest, WithoutSleepingPhasesAreMeasuredOnly) {
  pacer.set_sleeping(false);
  pacer.pace_compute(0.25 * kMs, 1e6);
  EXPECT_NEAR(clock.since(t0), 0, kNs);
  EXPECT_NEAR(pacer.take_worst_ratio(), 0.25, 1e-9);
}

// AdamW on a GPU is memory-bound: 28 bytes per parameter at the memory's rate, when that is longer
// than its FLOPs at the device's; under --emulate-shape, for the target's parameters.
TEST(Pacer, TheOptimizerIsChargedItsMemoryTraffic) {
  VirtualClock clock;
  ntp::PacingConfig c = paced();  // 1 GFLOP/s
  ntp::Pacer flops_only(c, clock);
  EXPECT_NEAR(flops_only.optimizer_seconds(1e6), 12 * kMs, kNs);  // no memory rate: 12 FLOPs each
  c.memory_gbps = 1;                                                // 28 MB at 1 GB/s: 28 ms
  ntp::Pacer memory_bound(c, clock);
  EXPECT_NEAR(memory_bound.optimizer_seconds(1e6), 28 * kMs, kNs);
  c.memory_gbps = 100;  // 0.28 ms of memory: the FLOPs are the longer
  EXPECT_NEAR(ntp::Pacer(c, clock).optimizer_seconds(1e6), 12 * kMs, kNs);
  c.memory_gbps = 1, c.shape.parameter_bytes = 10, c.shape.flops = 1000;  // the target's parameters, not its per-token FLOPs
  ntp::Pacer target(c, clock);
  EXPECT_NEAR(target.optimizer_seconds(1e6), 280 * kMs, kNs);
  const auto t0 = clock.now();
  target.pace_optimizer(30 * kMs, 1e6);  // real 30 ms: sleeps the rest of 280
  EXPECT_NEAR(clock.since(t0), 250 * kMs, kNs);
  EXPECT_EQ(target.take_overruns(), 0);
}

TEST(Pacer, AnEmulatedShapeChargesItsOwnCosts) {
  VirtualClock clock;
  ntp::PacingConfig c = paced();
  c.latency_us = 10;
  c.shape = {.flops = 100, .activation_bytes = 4, .activation_calls = 3, .parameter_bytes = 50, .element_bytes = 0.5};
  ntp::Pacer p(c, clock);
  EXPECT_NEAR(p.compute_seconds(1e6), 100 * kMs, kNs);                       // the target's FLOPs
  // Activations: 3 calls of the target's for this one, each of 4 x 0.5 the bytes, its latency each.
  EXPECT_NEAR(p.transfer_seconds(1e6, 2, Link::Tp, Traffic::Activations), 3 * (20e-6 + 2 * kMs), kNs);
  // Parameters: 50 x 0.5 the bytes, once.
  EXPECT_NEAR(p.transfer_seconds(1e6, 2, Link::Dp, Traffic::Parameters), 20e-6 + 25 * 2 * kMs, kNs);
}

// What the paced calls cover, so that the rest of a step's real time is the host's own work: a
// compute phase to the end of its sleep, a wait to the end of its sleep; bookkeeping between them
// is not covered.
TEST_F(PacerTest, TheCoveredSecondsLeaveTheHostsOwnTimeOut) {
  clock.advance(0.5 * kMs);                        // real compute, then its pacing to 2 ms
  pacer.pace_compute(0.5 * kMs, 2e6);
  clock.advance(0.3 * kMs);                        // the host's bookkeeping, unpaced
  const auto t = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  pacer.wait(t, clock.now());                      // 1 ms on the link
  EXPECT_NEAR(clock.since(t0), 3.3 * kMs, kNs);
  EXPECT_NEAR(pacer.take_covered_seconds(), 3.0 * kMs, kNs);  // 0.3 ms was the host's
  EXPECT_EQ(pacer.take_covered_seconds(), 0);

  // A phase that ran over covers its real time (the overrun is counted as such, not twice).
  clock.advance(4 * kMs);
  pacer.pace_compute(4 * kMs, 2e6);
  EXPECT_NEAR(pacer.take_covered_seconds(), 4 * kMs, kNs);
  EXPECT_NEAR(pacer.take_overrun_seconds(), 2 * kMs, kNs);

  // A wait that began after the transfer's end covers nothing of the lateness before it.
  const auto late = pacer.post(1e6, 1, Link::Tp, Traffic::Activations);
  clock.advance(5 * kMs);
  const auto began = clock.now();
  pacer.wait(late, began);
  EXPECT_NEAR(pacer.take_covered_seconds(), 0, kNs);
}
