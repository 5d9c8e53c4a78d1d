#include "watchdog.hpp"

#include <cstdio>
#include <cstdlib>

namespace ntp {

Watchdog::Watchdog() : thread_([this] { watch(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    quit_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void Watchdog::arm(double seconds, std::string message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = true;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
    message_ = std::move(message);
  }
  cv_.notify_one();
}

void Watchdog::disarm() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }
  cv_.notify_one();
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!quit_) {
    if (!armed_) {
      cv_.wait(lock);
    } else if (std::chrono::steady_clock::now() >= deadline_) {
      std::fprintf(stderr, "ntpbench: error: %s\n", message_.c_str());
      std::fflush(nullptr);
      std::_Exit(kHangExitCode);
    } else {
      cv_.wait_until(lock, deadline_);
    }
  }
}

}  // namespace ntp
