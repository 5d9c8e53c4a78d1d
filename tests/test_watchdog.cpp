// The hang watchdog (src/timing/watchdog.hpp): it ends the process with its message and exit code
// 5 when a countdown runs out, and never when it is re-armed, disarmed or destroyed in time. Each
// case runs in a child process (a death test), which must exit as stated.
#include <chrono>
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>

#include "watchdog.hpp"

namespace {

using namespace std::chrono_literals;

// The end of a death test's child: far past any countdown armed before it, then a clean exit.
[[noreturn]] void outwait(std::chrono::milliseconds wait = 10s) {
  std::this_thread::sleep_for(wait);
  std::exit(0);
}

TEST(WatchdogDeathTest, EndsTheProcessWithItsMessageWhenTheCountdownRunsOut) {
  EXPECT_EXIT(
      {
        ntp::Watchdog w;
        w.arm(0.2, "stuck in the test's wait");
        outwait();
      },
      testing::ExitedWithCode(ntp::kHangExitCode), "ntpbench: error: stuck in the test's wait");
}

TEST(WatchdogDeathTest, TheLastArmingsMessageIsTheOnePrinted) {
  EXPECT_EXIT(
      {
        ntp::Watchdog w;
        w.arm(5, "the first stage");
        w.arm(0.2, "the second stage");
        outwait();
      },
      testing::ExitedWithCode(ntp::kHangExitCode), "the second stage");
}

TEST(WatchdogDeathTest, ReArmedInTimeItNeverFires) {
  EXPECT_EXIT(
      {
        ntp::Watchdog w;
        for (int i = 0; i < 20; ++i) {  // 1 s in all, each countdown 0.3 s
          w.arm(0.3, "should not fire");
          std::this_thread::sleep_for(50ms);
        }
        w.disarm();
        outwait(500ms);
      },
      testing::ExitedWithCode(0), "");
}

TEST(WatchdogDeathTest, DisarmedOrDestroyedItNeverFires) {
  EXPECT_EXIT(
      {
        {
          ntp::Watchdog w;
          w.arm(0.2, "destroyed before its time");
        }
        ntp::Watchdog w;
        w.arm(0.2, "disarmed before its time");
        w.disarm();
        outwait(600ms);
      },
      testing::ExitedWithCode(0), "");
}

}  // namespace
