#include "pacer.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace ntp {

double Pacer::compute_seconds(double flops) const { return flops / (c_.device_gflops * 1e9 * speed_); }

double Pacer::transfer_seconds(double bytes, int messages, Link group) const {
  const double gbps = route(group) == Link::Tp ? c_.tp_gbps : c_.dp_gbps;
  return (messages * c_.latency_us * 1e-6 + bytes / (gbps * 1e9)) * slow_link_;
}

void Pacer::sleep_for(double seconds) {
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
  if (!background_) {
    std::this_thread::sleep_until(end);
    return;
  }
  for (auto now = clock::now(); now < end; now = clock::now()) {
    background_();
    std::this_thread::sleep_until(std::min(end, clock::now() + std::chrono::microseconds(200)));
  }
}

void Pacer::sleep_rest(double real, double target) {
  if (target > real) sleep_for(target - real);
}

void Pacer::wait_until(std::chrono::steady_clock::time_point t) {
  if (!c_.enabled) return;
  sleep_for(std::chrono::duration<double>(t - std::chrono::steady_clock::now()).count());
}

void Pacer::pace_compute(double real, double flops) {
  if (!c_.enabled) {
    if (slow_compute_ > 1) sleep_for(real * (slow_compute_ - 1));
    return;
  }
  const double target = compute_seconds(flops) * slow_compute_;
  // A little slack for timer granularity: 2% or 50 microseconds.
  if (real > target * 1.02 + 50e-6) ++overruns_;
  if (target > 0) worst_ratio_ = std::max(worst_ratio_, real / target);
  sleep_rest(real, target);
}

void Pacer::pace_transfer(double real, double bytes, int messages, Link link) {
  if (!c_.enabled) return;
  sleep_rest(real, transfer_seconds(bytes, messages, link));
}

}  // namespace ntp
