#include "pacer.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace ntp {

namespace {
class SteadyPaceClock final : public PaceClock {
 public:
  time_point now() override { return std::chrono::steady_clock::now(); }
  void sleep_until(time_point t) override { std::this_thread::sleep_until(t); }
};

PaceClock::time_point::duration to_duration(double seconds) {
  return std::chrono::duration_cast<PaceClock::time_point::duration>(std::chrono::duration<double>(seconds));
}
}  // namespace

PaceClock& PaceClock::steady() {
  static SteadyPaceClock c;
  return c;
}

double Pacer::compute_seconds(double flops) const {
  return flops * c_.shape.flops / (c_.device_gflops * 1e9 * speed_);
}

double Pacer::transfer_seconds(double bytes, int messages, Link group, Traffic traffic) const {
  const double gbps = route(group) == Link::Tp ? c_.tp_gbps : c_.dp_gbps;
  const ShapeCharge& k = c_.shape;
  // A transfer of activations stands for activation_calls of the target's, each activation_bytes
  // times as large; one of parameters or gradients for parameter_bytes times its bytes.
  const double calls = traffic == Traffic::Activations ? k.activation_calls : 1.0;
  const double scale = (traffic == Traffic::Activations ? k.activation_bytes : k.parameter_bytes) * k.element_bytes;
  return calls * (messages * c_.latency_us * 1e-6 + scale * bytes / (gbps * 1e9)) * slow_link_;
}

void Pacer::sleep_for(double seconds) {
  if (!sleeping_) return;
  const auto end = clock_->now() + to_duration(seconds);
  if (!background_) {
    clock_->sleep_until(end);
    return;
  }
  for (auto now = clock_->now(); now < end; now = clock_->now()) {
    background_();
    clock_->sleep_until(std::min(end, clock_->now() + std::chrono::microseconds(200)));
  }
}

void Pacer::sleep_rest(double real, double target) {
  if (target > real) sleep_for(target - real);
}

LinkTicket Pacer::post_at(PaceClock::time_point posted, double bytes, int messages, Link group, Traffic traffic) {
  if (!c_.enabled) return {};
  auto& free = link_free_[static_cast<int>(route(group))];
  const auto start = std::max(free, posted);  // behind the transfers already on this link
  free = start + to_duration(transfer_seconds(bytes, messages, group, traffic));
  return {posted, start, free};
}

void Pacer::wait(const LinkTicket& t, PaceClock::time_point began) {
  if (!c_.enabled) return;
  const auto now = clock_->now();
  const auto seconds = [](PaceClock::time_point::duration d) { return std::chrono::duration<double>(d).count(); };
  const double emulated = seconds(t.end - t.start);
  // Slack as for compute: 2% of the emulated time or 50 microseconds (a hidden exchange's wait
  // still unpacks what it received).
  const auto slack = to_duration(0.02 * seconds(t.end - t.posted) + 50e-6);
  const auto late_from = std::max(began, t.end);
  if (now > late_from + slack) {
    ++link_overruns_;
    link_overrun_seconds_ += seconds(now - late_from);
  }
  // The real end is known only as the wait's end: an upper bound, unknown when the wait began
  // after the emulated end and found the transfer done.
  if (emulated > 0 && (now <= t.end + slack || now > late_from + slack))
    worst_link_ratio_ = std::max(worst_link_ratio_, seconds(now - t.start) / emulated);
  if (now < t.end) sleep_for(seconds(t.end - now));
  covered_seconds_ += seconds(clock_->now() - began);
}

double Pacer::pass_seconds(double parameters, double flops_per_parameter, double bytes_per_parameter) const {
  const double charged = parameters * c_.shape.parameter_bytes;
  // Without a memory rate (a custom machine's default) a pass costs at least a FLOP a parameter.
  const double flops = std::max(flops_per_parameter, c_.memory_gbps > 0 ? 0.0 : 1.0) * charged /
                       (c_.device_gflops * 1e9 * speed_);
  const double memory = c_.memory_gbps > 0 ? bytes_per_parameter * charged / (c_.memory_gbps * 1e9) : 0;
  return std::max(flops, memory);
}

double Pacer::optimizer_seconds(double parameters) const {
  return pass_seconds(parameters, kAdamWFlopsPerParameter, kAdamWBytesPerParameter);
}

void Pacer::pace_pass(double real, double parameters, double flops_per_parameter, double bytes_per_parameter) {
  pace_target(real, pass_seconds(parameters, flops_per_parameter, bytes_per_parameter));
}

void Pacer::pace_compute(double real, double flops) { pace_target(real, compute_seconds(flops)); }

void Pacer::pace_optimizer(double real, double parameters) { pace_target(real, optimizer_seconds(parameters)); }

void Pacer::pace_target(double real, double emulated) {
  if (!c_.enabled) {
    if (slow_compute_ > 1) sleep_for(real * (slow_compute_ - 1));
    return;
  }
  const double target = emulated * slow_compute_;
  const auto began = clock_->now() - to_duration(real);
  // A little slack for timer granularity: 2% or 50 microseconds.
  if (real > target * 1.02 + 50e-6) ++overruns_, overrun_seconds_ += real - target;
  if (target > 0) worst_ratio_ = std::max(worst_ratio_, real / target);
  sleep_rest(real, target);
  covered_seconds_ += std::chrono::duration<double>(clock_->now() - began).count();
}

void Pacer::pace_transfer(double real, double bytes, int messages, Link group, Traffic traffic) {
  if (!c_.enabled) return;
  const auto began = clock_->now() - to_duration(real);
  wait(post_at(began, bytes, messages, group, traffic), began);
}

}  // namespace ntp
