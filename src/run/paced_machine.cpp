#include "paced_machine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "comm.hpp"
#include "machine_profile.hpp"
#include "phase_clock.hpp"
#include "recorder.hpp"
#include "trainer.hpp"

namespace ntp {

double power_of_2_at_least(double x) { return x <= 1 ? 1.0 : std::exp2(std::ceil(std::log2(x))); }

ScaleStep next_time_scale(const std::vector<ScaleTrial>& trials, double headroom) {
  const ScaleTrial& last = trials.back();
  const auto fits = [&](const ScaleTrial& t) { return t.ratio * headroom <= 1; };
  const double need = last.ratio * headroom;
  if (need > 1) {
    // Too fast: up by what the worst phase lacked, or to a smaller factor that already fit.
    const double up = last.scale * power_of_2_at_least(need);
    double known = 0;
    for (const ScaleTrial& t : trials)
      if (t.scale > last.scale && t.scale <= up && fits(t) && (known == 0 || t.scale < known)) known = t.scale;
    return known > 0 ? ScaleStep{known, true} : ScaleStep{up, false};
  }
  // It fits. Down by the power of 2 this ratio leaves room for (a trial that asked for too much,
  // after a noisy one, comes back in one step), but never to a factor that failed or below one.
  double floor = 1;  // the smallest factor not known to fail below this one
  for (const ScaleTrial& t : trials)
    if (!fits(t) && t.scale < last.scale) floor = std::max(floor, t.scale * 2);
  const double room = need > 0 ? std::exp2(std::floor(std::log2(1 / need))) : last.scale;  // need x room <= 1
  const double down = std::max({floor, 1.0, last.scale / room});
  if (down < last.scale) return {down, false};
  return {last.scale, true};
}

namespace {
// The worst ratio over ranks of real to emulated time of compute since the counters were reset.
double worst_compute_ratio(Pacer& p, Comm& group) {
  double w = p.take_worst_ratio();
  group.allreduce_max(&w, 1);
  p.reset_counters();
  return w;
}

// One dry step at the pacer's rates: the worst ratio of real to emulated time of its compute and
// of its transfers, and of the host's own time outside them to what the verdict allows of a step
// (kPacedOverrunLimit): that time does not shrink with the factor, so the step must grow around it.
ScaleTrial dry_step_trial(Trainer& trainer, Comm& group, double scale) {
  Pacer& p = trainer.pacer();
  p.take_covered_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  trainer.dry_step();
  const double wall = seconds_since(t0);
  double parts[3] = {p.take_worst_ratio(), p.take_worst_link_ratio(),
                     wall > 0 ? std::max(0.0, wall - p.take_covered_seconds()) / wall / kPacedOverrunLimit : 0.0};
  group.allreduce_max(parts, 3);
  p.reset_counters();
  return {scale, std::max({parts[0], parts[1], parts[2]}), parts[0], parts[1], parts[2]};
}
}  // namespace

Calibration calibrate_time_scale(const Options& o, Trainer& trainer, Comm& group) {
  Pacer& p = trainer.pacer();
  Calibration c;
  p.set_config(paced_rates(o, 1.0));
  p.set_sleeping(false);
  trainer.dry_step();  // a warm-up: threads started, pages touched
  p.reset_counters();
  trainer.dry_step();
  c.compute_ratio = worst_compute_ratio(p, group);
  p.set_sleeping(true);
  double scale = power_of_2_at_least(c.compute_ratio * o.headroom);
  constexpr int kTrials = 6;
  for (int k = 0; k < kTrials && !c.fits; ++k) {
    p.set_config(paced_rates(o, scale));
    // Each trial is a whole emulated step at that scale: say so before it (a large one takes minutes).
    if (group.rank() == 0 && !o.quiet) {
      fmt::print("--time-scale auto: trying {:g} ({} of at most {})\n", scale, k + 1, kTrials);
      std::fflush(stdout);
    }
    // Two dry steps, the better one: a rank descheduled once by another process on this machine
    // would otherwise ask for a factor many times larger than its work needs (the verdict
    // tolerates such rare moments; an overrun that persists shows in both).
    const ScaleTrial first = dry_step_trial(trainer, group, scale), second = dry_step_trial(trainer, group, scale);
    c.trials.push_back(second.ratio < first.ratio ? second : first);
    const ScaleStep next = next_time_scale(c.trials, o.headroom);
    scale = next.scale;
    c.fits = next.settled;
  }
  c.scale = scale;
  if (!c.fits)  // out of trials: the smallest factor that fit, else the last one proposed (untried)
    for (const ScaleTrial& t : c.trials)
      if (t.ratio * o.headroom <= 1 && (!c.fits || t.scale < c.scale)) c.scale = t.scale, c.fits = true;
  p.set_config(paced_rates(o, c.scale));
  p.reset_counters();
  trainer.clock().take();
  return c;
}

std::string describe_paced_machine(const Options& o, const Calibration* calibration) {
  const PacingConfig r = paced_rates(o);
  std::string machine =
      o.custom_machine()
          ? "custom"
          : fmt::format("{} ({} {:.4g} TFLOP/s, memory {:.4g} GB/s, scale-up {:.4g} GB/s, scale-out {:.4g} GB/s, {:.3g} us)", o.machine,
                        choice_name(o.emulated_precision), machine_profile(o.machine).tflops(o.emulated_precision), machine_profile(o.machine).memory_gbps,
                        machine_profile(o.machine).scale_up_gbps, machine_profile(o.machine).scale_out_gbps,
                        machine_profile(o.machine).latency_us);
  // The worst ratio measured at the factor chosen (the last trial there).
  double at_chosen = 0;
  if (calibration)
    for (const ScaleTrial& t : calibration->trials)
      if (t.scale == calibration->scale) at_chosen = t.ratio;
  std::string how = calibration ? fmt::format("auto, headroom {:g}: real work at most {:.2g} of emulated time{}",
                                              o.headroom, at_chosen, calibration->fits ? "" : "; NOT FOUND to fit")
                                : std::string("given");
  std::string shape = !o.emulates_shape()
                          ? std::string()
                          : fmt::format(" | costs of {}: x{:.4g} FLOPs, activations x{:.4g} bytes x{:.4g} calls, "
                                        "parameters x{:.4g}",
                                        o.emulate_shape, r.shape.flops, r.shape.activation_bytes,
                                        r.shape.activation_calls, r.shape.parameter_bytes);
  const RecoveryCosts c = recovery_costs(o.machine, o.recovery_given);
  std::string charged;
  for (const RecoveryPart& part : recovery_parts())
    if (part.given != &RecoveryOverrides::reinit)  // recorded, never charged
      charged += fmt::format("{}{} {:g}{}{}", charged.empty() ? "" : ", ", part.name, (c.*part.cost).value,
                             part.unit == std::string("s") ? "" : std::string(" ") + part.unit,
                             (o.recovery_given.*part.given) ? " (given)" : "");
  const std::string costs = fmt::format(
      "\npaced: times are the emulated machine's (this host's run clock over {:g}); a recovery is charged "
      "jobs/machines/{}.yaml's seconds: {}; heals over the scale-out link",
      r.time_scale, o.custom_machine() ? kCustomRecoveryMachine : o.machine, charged);
  return fmt::format("paced: {} slowed {:g}x ({}): device {:.4g} GFLOP/s{}, links {:.4g} / {:.4g} GB/s, {:.4g} us{}{}",
                     machine, r.time_scale, how, r.device_gflops,
                     r.memory_gbps > 0 ? fmt::format(" and {:.4g} GB/s", r.memory_gbps) : std::string(), r.tp_gbps,
                     r.dp_gbps, r.latency_us, shape, costs);
}

nlohmann::json recovery_costs_record(const Options& o) {
  const RecoveryCosts c = recovery_costs(o.machine, o.recovery_given);
  nlohmann::json j = {{"machine", o.custom_machine() ? kCustomRecoveryMachine : o.machine}};
  for (const RecoveryPart& part : recovery_parts())
    j[part.name] = {{"value", (c.*part.cost).value}, {"source", (c.*part.cost).source}};
  return j;
}

nlohmann::json paced_machine_record(const Options& o, const Calibration* calibration) {
  const PacingConfig r = paced_rates(o);
  nlohmann::json j = {{"machine", o.machine},
                      {"precision", choice_name(o.emulated_precision)},
                      {"time_scale", r.time_scale},
                      {"time_scale_chosen", calibration ? "auto" : "given"},
                      {"headroom", o.headroom},
                      {"device_gflops", r.device_gflops},
                      {"memory_gbps", r.memory_gbps},
                      {"scale_up_gbps", r.tp_gbps},
                      {"scale_out_gbps", r.dp_gbps},
                      {"latency_us", r.latency_us},
                      {"emulate_shape", o.emulate_shape},
                      {"charge", {{"flops", r.shape.flops},
                                  {"activation_bytes", r.shape.activation_bytes},
                                  {"activation_calls", r.shape.activation_calls},
                                  {"parameter_bytes", r.shape.parameter_bytes},
                                  {"element_bytes", r.shape.element_bytes}}},
                      {"recovery", recovery_costs_record(o)}};
  if (!o.custom_machine()) {
    const MachineProfile& m = machine_profile(o.machine);
    j["profile"] = {{"bf16_tflops", m.bf16_tflops}, {"tf32_tflops", m.tf32_tflops}, {"fp32_tflops", m.fp32_tflops}, {"memory_gbps", m.memory_gbps},
                    {"scale_up_gbps", m.scale_up_gbps}, {"scale_out_gbps", m.scale_out_gbps},
                    {"latency_us", m.latency_us}, {"gpus_per_domain", m.gpus_per_domain}, {"source", m.source}};
  }
  if (calibration) {
    nlohmann::json trials = nlohmann::json::array();
    for (const ScaleTrial& t : calibration->trials)
      trials.push_back({{"time_scale", t.scale}, {"worst_ratio", t.ratio}, {"compute", t.compute}, {"links", t.links},
                        {"host", t.host}});
    j["calibration"] = {{"unpaced_compute_ratio", calibration->compute_ratio}, {"trials", trials},
                        {"fits", calibration->fits}};
  }
  return j;
}

}  // namespace ntp
