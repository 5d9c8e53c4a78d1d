#pragma once
// The way out of a hang that no error will ever end: an MPI call whose peer has stopped without
// dying, a spawned process that never joins. A thread waits beside the caller; if the countdown
// it was last armed with runs out, it prints the message it was given and ends the process with
// exit code 5 (the launcher then ends the job), instead of leaving the job to its wall-time limit.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "exit_codes.hpp"

namespace ntp {

inline constexpr int kHangExitCode = code(ExitCode::Hung);

class Watchdog {
 public:
  Watchdog();
  ~Watchdog();  // disarms; never fires after it
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Starts the countdown again: unless arm() or disarm() comes within `seconds`, the process
  // prints "ntpbench: error: <message>" on stderr and ends (kHangExitCode).
  void arm(double seconds, std::string message);
  void disarm();

 private:
  void watch();
  std::mutex mutex_;
  std::condition_variable cv_;
  bool armed_ = false, quit_ = false;
  std::chrono::steady_clock::time_point deadline_;
  std::string message_;
  std::thread thread_;  // last: it starts once the rest is ready
};

}  // namespace ntp
