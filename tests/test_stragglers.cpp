// Stragglers without MPI: the detector's rule on made-up compute times (healthy noise never
// fires; a rank at 2x is named after exactly `window` steps and released after `window` steps at
// 1x; peers are its group, or everyone where it has none), the schedule's `slow` events, and the
// pacer's slowdown under wall timing (it really sleeps) and paced timing (its device runs slower).
#include <chrono>
#include <random>

#include <gtest/gtest.h>

#include "pacer.hpp"
#include "schedule.hpp"
#include "straggler.hpp"
#include "straggler_policy.hpp"

namespace {

TEST(Stragglers, HealthyNoiseNeverFires) {
  ntp::StragglerDetector d(1.2, 5);
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> noise(0.85, 1.15);  // +-15% per rank and step
  const std::vector<int> group = {0, 0, 0, 0, 1, 1, 1, 1};
  for (int step = 0; step < 2000; ++step) {
    std::vector<double> t(8);
    for (double& x : t) x = 0.1 * noise(rng);
    EXPECT_TRUE(d.observe(t, group).empty()) << "step " << step;
  }
}

TEST(Stragglers, ASlowRankIsNamedAfterTheWindowAndReleasedAfterIt) {
  const int window = 3;
  ntp::StragglerDetector d(1.2, window);
  const std::vector<int> group = {0, 0, 0, 0, 1, 1, 1, 1};
  auto step = [&](double rank2) {
    std::vector<double> t(8, 0.1);
    t[2] = 0.1 * rank2;
    return d.observe(t, group);
  };
  for (int s = 0; s < 4; ++s) EXPECT_TRUE(step(1.0).empty());
  EXPECT_TRUE(step(2.0).empty());
  EXPECT_TRUE(step(2.0).empty());
  const auto named = step(2.0);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].rank, 2);
  EXPECT_TRUE(named[0].starts);
  EXPECT_DOUBLE_EQ(named[0].ratio, 2.0);
  EXPECT_TRUE(d.straggler(2));
  EXPECT_TRUE(step(1.0).empty());
  EXPECT_TRUE(step(3.0).empty());  // a relapse starts the count again
  EXPECT_TRUE(step(1.0).empty());
  EXPECT_TRUE(step(1.0).empty());
  const auto released = step(1.0);
  ASSERT_EQ(released.size(), 1u);
  EXPECT_FALSE(released[0].starts);
  EXPECT_FALSE(d.straggler(2));
}

TEST(Stragglers, PeersAreTheGroupOrEveryoneAndIdleRanksDoNotCount) {
  ntp::StragglerDetector d(1.2, 1);
  // Rank 1 is alone in its group (TP 1): it is compared with every other training rank. Rank 3
  // does not train this step (0): it is neither judged nor a peer.
  const auto v = d.observe({0.1, 0.25, 0.1, 0.0, 0.1}, {0, 1, 0, 2, 0});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].rank, 1);
  EXPECT_DOUBLE_EQ(v[0].ratio, 2.5);
  // A group that computes more (a replica at reduced TP) is not slower than its own peers.
  ntp::StragglerDetector e(1.2, 1);
  EXPECT_TRUE(e.observe({0.1, 0.1, 0.1, 0.1, 0.133, 0.133, 0.133}, {0, 0, 0, 0, 1, 1, 1}).empty());
  ntp::StragglerDetector off(0, 5);
  EXPECT_TRUE(off.observe({0.1, 1.0}, {0, 0}).empty());
}

TEST(Stragglers, SlowEventsParseAndAreChecked) {
  const auto s = ntp::Schedule::parse(
      "events:\n  - {step: 5, slow: [3, 1], factor: 2.5, link_factor: 1.5}\n  - {step: 9, slow: [3], factor: 1}\n",
      "slow.yaml", 4, 10);
  ASSERT_EQ(s.at(5).slow.size(), 2u);
  EXPECT_EQ(s.at(5).slow[0], (ntp::Slowdown{1, 2.5, 1.5}));
  EXPECT_EQ(s.at(5).slow[1], (ntp::Slowdown{3, 2.5, 1.5}));
  EXPECT_EQ(s.at(9).slow[0], (ntp::Slowdown{3, 1, 1}));
  EXPECT_TRUE(s.at(5).kill.empty());
  for (const char* bad : {"events:\n  - {step: 5, slow: [3]}\n",                    // no factor
                          "events:\n  - {step: 5, slow: [3], factor: 0.5}\n",       // faster
                          "events:\n  - {step: 5, slow: [7], factor: 2}\n",         // no rank 7
                          "events:\n  - {step: 5, slow: [3], kill: [2], factor: 2}\n",
                          "events:\n  - {step: 5, kill: [3], factor: 2}\n",
                          "events:\n  - {step: 5, slow: [3, 3], factor: 2}\n"})
    EXPECT_THROW(ntp::Schedule::parse(bad, "bad.yaml", 4, 10), ntp::ScheduleError) << bad;
}

TEST(Stragglers, TheGeneratorDrawsSlowEpisodesWithoutMovingItsFailures) {
  const std::string base = "random: {mtbf_steps: 50, repair_steps: 5, seed: 3";
  const auto a = ntp::Schedule::parse(base + "}\n", "a.yaml", 8, 400);
  const auto b = ntp::Schedule::parse(base + ", slow_mtbf_steps: 40, slow_steps: 6, slow_factor: 3}\n", "b.yaml", 8, 400);
  int episodes = 0;
  std::vector<int> slowed_until(8, 0);
  for (const auto& [step, e] : b.events()) {
    EXPECT_EQ(e.kill, a.at(step).kill) << step;  // the same failures at the same steps
    EXPECT_EQ(e.revive, a.at(step).revive) << step;
    for (const auto& d : e.slow) {
      if (d.factor > 1) {
        EXPECT_EQ(d.factor, 3);
        EXPECT_GE(step, slowed_until[d.rank]) << "overlapping episodes of rank " << d.rank;
        slowed_until[d.rank] = step + 6;
        ++episodes;
      } else {
        EXPECT_EQ(step, slowed_until[d.rank]) << "an episode of rank " << d.rank << " did not last 6 steps";
      }
    }
  }
  EXPECT_GT(episodes, 8 * 400 / 46 / 2);  // about one per 46 steps per rank
  EXPECT_THROW(ntp::Schedule::parse(base + ", slow_steps: 6}\n", "c.yaml", 8, 400), ntp::ScheduleError);
  EXPECT_THROW(ntp::Schedule::parse(base + ", slow_mtbf_steps: 40, slow_steps: 6, slow_factor: 1}\n", "c.yaml", 8, 400),
               ntp::ScheduleError);
}

// A rank that does not train (evicted) is judged by its probe's ratio where one is given: its
// episode ends after `window` steps at or below the threshold.
TEST(Stragglers, AProbedRankIsJudgedByItsProbe) {
  ntp::StragglerDetector d(1.2, 2);
  const std::vector<int> group = {0, 0, 0, 0};
  for (int s = 0; s < 2; ++s) d.observe({0.1, 0.1, 0.1, 0.2}, group);
  ASSERT_TRUE(d.straggler(3));
  // Out of training: no compute; its probe says 2x, then 1x.
  EXPECT_TRUE(d.observe({0.1, 0.1, 0.1, 0}, group, {0, 0, 0, 2.0}).empty());
  EXPECT_TRUE(d.observe({0.1, 0.1, 0.1, 0}, group, {0, 0, 0, 1.0}).empty());
  EXPECT_TRUE(d.observe({0.1, 0.1, 0.1, 0}, group, {0, 0, 0, 0}).empty());  // no probe: no count
  const auto v = d.observe({0.1, 0.1, 0.1, 0}, group, {0, 0, 0, 1.05});
  ASSERT_EQ(v.size(), 1u);
  EXPECT_FALSE(v[0].starts);
  EXPECT_DOUBLE_EQ(v[0].ratio, 1.025);
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Stragglers, TheSlowedPacerTakesLonger) {
  ntp::PacingConfig wall;  // not enabled: wall timing
  ntp::Pacer w(wall);
  w.set_slowdown(3, 1);
  EXPECT_GE(seconds_of([&] { w.pace_compute(0.05, 1e9); }), 0.1);  // (3 - 1) x the real 50 ms
  ntp::PacingConfig paced;
  paced.enabled = true, paced.device_gflops = 10;
  ntp::Pacer p(paced);
  EXPECT_NEAR(p.transfer_seconds(1e9, 1, ntp::Link::Tp, ntp::Traffic::Activations), 1e9 / 20e9 + 5e-6, 1e-9);
  p.set_slowdown(2, 4);
  EXPECT_GE(seconds_of([&] { p.pace_compute(0, 1e9); }), 0.2);  // 1 GFLOP at 10 GFLOP/s, twice as long
  EXPECT_NEAR(p.transfer_seconds(1e9, 1, ntp::Link::Tp, ntp::Traffic::Activations), 4 * (1e9 / 20e9 + 5e-6), 1e-9);
}

}  // namespace

// --straggler-policy evict: verdicts to actions, with the eviction that would leave no replica
// refused, verdicts on dead ranks ignored, and an end without an eviction doing nothing.
TEST(StragglerPolicy, EvictDecisions) {
  const std::vector<char> alive = {1, 1, 1, 0};
  std::vector<std::vector<char>> asked;
  const auto refuse = [&](const std::vector<char>& evicted) -> std::string {
    asked.push_back(evicted);
    return evicted[2] ? "no replica could train without it" : "";
  };
  const auto d = ntp::decide_straggler_actions({{1, true, 2.0}, {2, true, 1.5}, {3, true, 3.0}, {0, false, 1.0}}, true,
                                               alive, {0, 0, 0, 0}, {}, refuse);
  EXPECT_EQ(d.evicted, (std::vector<char>{0, 1, 0, 0}));
  ASSERT_EQ(d.actions.size(), 2u);  // rank 3 died since; rank 0 was never evicted
  EXPECT_EQ(d.actions[0].kind, ntp::StragglerActionKind::Evict);
  EXPECT_EQ(d.actions[1].kind, ntp::StragglerActionKind::EvictRefused);
  EXPECT_EQ(d.actions[1].why, "no replica could train without it");
  // The refusal is asked with the evictions made so far: rank 2's trial holds rank 1's.
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1], (std::vector<char>{0, 1, 1, 0}));
  EXPECT_TRUE(d.speed.empty());
  const auto back = ntp::decide_straggler_actions({{1, false, 1.0}}, true, alive, d.evicted, {}, refuse);
  EXPECT_EQ(back.evicted, (std::vector<char>{0, 0, 0, 0}));
  ASSERT_EQ(back.actions.size(), 1u);
  EXPECT_EQ(back.actions[0].kind, ntp::StragglerActionKind::Rejoin);
}

// --straggler-policy rebalance: a straggler's speed is 1 / its ratio, never above 1; its end
// brings it back to 1, and speeds all at 1 are no speeds.
TEST(StragglerPolicy, RebalanceDecisions) {
  const std::vector<char> alive = {1, 1, 1};
  const auto never = [](const std::vector<char>&) { return std::string(); };
  const auto d = ntp::decide_straggler_actions({{1, true, 2.0}, {2, true, 0.8}}, false, alive, {0, 0, 0}, {}, never);
  EXPECT_EQ(d.speed, (std::vector<double>{1.0, 0.5, 1.0}));
  ASSERT_EQ(d.actions.size(), 2u);
  EXPECT_EQ(d.actions[0].kind, ntp::StragglerActionKind::Rebalance);
  EXPECT_EQ(d.evicted, (std::vector<char>{0, 0, 0}));
  const auto end = ntp::decide_straggler_actions({{1, false, 1.0}, {0, false, 1.0}}, false, alive, d.evicted, d.speed,
                                                 never);
  EXPECT_TRUE(end.speed.empty());
  ASSERT_EQ(end.actions.size(), 1u);  // rank 0 was at full speed: nothing to undo
  EXPECT_EQ(end.actions[0].kind, ntp::StragglerActionKind::RebalanceEnd);
}
