// Paced timing's emulated machine: profile arithmetic (one time scale for every rate, the shape's
// charge) and --time-scale auto's choice of factor (paced_machine.hpp), without MPI.
#include <gtest/gtest.h>

#include "machine_profile.hpp"
#include "model_config.hpp"
#include "options.hpp"
#include "paced_machine.hpp"

namespace ntp {
namespace {

// scale: the time scale; 0 for auto (not yet calibrated).
Options paced_on(const std::string& machine, double scale) {
  Options o;
  o.timing = Timing::Paced, o.pacing.enabled = true, o.machine = machine, o.time_scale = scale;
  o.model = preset("small"), o.preset = "small", o.seq = 64;
  return o;
}

TEST(PacedMachine, OneScaleSlowsEveryRateAlike) {
  const PacingConfig at1 = paced_rates(paced_on("dgx-a100", 1));
  EXPECT_DOUBLE_EQ(at1.device_gflops, 312e3);  // bf16 dense
  EXPECT_DOUBLE_EQ(at1.tp_gbps, 300);
  EXPECT_DOUBLE_EQ(at1.dp_gbps, 25);
  EXPECT_DOUBLE_EQ(at1.latency_us, 5);
  EXPECT_DOUBLE_EQ(at1.memory_gbps, 2039);  // HBM2e
  const PacingConfig at64 = paced_rates(paced_on("dgx-a100", 64));
  EXPECT_DOUBLE_EQ(at64.time_scale, 64);
  EXPECT_DOUBLE_EQ(at64.device_gflops * 64, at1.device_gflops);
  EXPECT_DOUBLE_EQ(at64.tp_gbps * 64, at1.tp_gbps);
  EXPECT_DOUBLE_EQ(at64.dp_gbps * 64, at1.dp_gbps);
  EXPECT_DOUBLE_EQ(at64.latency_us, at1.latency_us * 64);
  EXPECT_DOUBLE_EQ(at64.memory_gbps * 64, at1.memory_gbps);
  // Every ratio is the machine's: compute time over link time does not move with the scale.
  Pacer p1(at1), p64(at64);
  EXPECT_NEAR(p64.compute_seconds(1e12) / p64.transfer_seconds(1e9, 6, Link::Tp, Traffic::Activations),
              p1.compute_seconds(1e12) / p1.transfer_seconds(1e9, 6, Link::Tp, Traffic::Activations), 1e-12);
}

TEST(PacedMachine, ProfilesAndPrecisions) {
  Options o = paced_on("dgx-h100", 1);
  EXPECT_DOUBLE_EQ(paced_rates(o).device_gflops, 989e3);
  o.emulated_precision = EmulatedPrecision::Tf32;
  EXPECT_DOUBLE_EQ(paced_rates(o).device_gflops, 494.5e3);
  EXPECT_DOUBLE_EQ(paced_rates(o).shape.element_bytes, 1.0);  // 4-byte elements, as here
  o.emulated_precision = EmulatedPrecision::Bf16;
  EXPECT_DOUBLE_EQ(paced_rates(o).shape.element_bytes, 0.5);
  EXPECT_EQ(machine_profile("gb200-nvl72").gpus_per_domain, 72);
  EXPECT_THROW(machine_profile("dgx-z"), std::invalid_argument);
  for (const auto& m : machine_profiles()) EXPECT_FALSE(m.source.empty()) << m.name;
}

TEST(PacedMachine, GivenRecoveryFiguresReplaceTheProfilesWithTheirSource) {
  const RecoveryCosts& profile = recovery_costs("dgx-h100");
  RecoveryOverrides given;
  given.replace = 60;
  given.checkpoint_gbps = 0.5;
  const RecoveryCosts c = recovery_costs("dgx-h100", given);
  EXPECT_EQ(c.replace.value, 60);
  EXPECT_EQ(c.replace.source, "given: --replace-s");
  EXPECT_EQ(c.checkpoint_gbps.value, 0.5);
  EXPECT_EQ(c.checkpoint_gbps.source, "given: --checkpoint-gbps");
  EXPECT_EQ(c.detect.value, profile.detect.value);  // not given: the profile's, with its source
  EXPECT_EQ(c.detect.source, profile.detect.source);
  EXPECT_NE(profile.replace.value, 60);
  // Every part is read from each profile, reinit (recorded, not charged) included.
  for (const auto& m : machine_profiles())
    for (const RecoveryPart& part : recovery_parts()) EXPECT_FALSE((m.recovery.*part.cost).source.empty()) << part.name;
}

TEST(PacedMachine, CustomRatesAreTheFlagsOverTheScale) {
  Options o = paced_on("custom", 2);
  o.pacing.device_gflops = 8, o.pacing.tp_gbps = 4, o.pacing.dp_gbps = 1, o.pacing.latency_us = 3;
  const PacingConfig r = paced_rates(o);
  EXPECT_DOUBLE_EQ(r.device_gflops, 4);
  EXPECT_DOUBLE_EQ(r.tp_gbps, 2);
  EXPECT_DOUBLE_EQ(r.dp_gbps, 0.5);
  EXPECT_DOUBLE_EQ(r.latency_us, 6);
  EXPECT_DOUBLE_EQ(r.shape.element_bytes, 1.0);
  EXPECT_DOUBLE_EQ(r.memory_gbps, 0);  // no memory rate: the optimizer is charged by its FLOPs
  o.pacing.memory_gbps = 6;
  EXPECT_DOUBLE_EQ(paced_rates(o).memory_gbps, 3);
  EXPECT_DOUBLE_EQ(paced_rates(paced_on("custom", 0)).time_scale, 1.0);  // not yet calibrated
}

TEST(PacedMachine, AnEmulatedShapeChargesTheTargetsCosts) {
  Options o = paced_on("dgx-a100", 1);
  o.emulate_shape = "gpt2-xl";
  const ModelConfig t = preset("gpt2-xl");
  const ShapeCharge k = paced_rates(o).shape;
  EXPECT_DOUBLE_EQ(k.flops, training_flops(t, 1, 64) / training_flops(o.model, 1, 64));
  EXPECT_DOUBLE_EQ(k.activation_bytes, 1600.0 / 256);
  EXPECT_DOUBLE_EQ(k.activation_calls, 48.0 / 4);
  EXPECT_DOUBLE_EQ(k.parameter_bytes, double(parameter_count(t)) / double(parameter_count(o.model)));
  EXPECT_GT(k.flops, 100);
}

TEST(TimeScale, PowersOfTwo) {
  EXPECT_EQ(power_of_2_at_least(0.3), 1);
  EXPECT_EQ(power_of_2_at_least(1), 1);
  EXPECT_EQ(power_of_2_at_least(1.01), 2);
  EXPECT_EQ(power_of_2_at_least(1000), 1024);
}

TEST(TimeScale, UpByWhatTheWorstPhaseLacked) {
  // At 32 the worst phase took 1.3x its emulated time: with headroom 2 it needs 2.6x more: 4x, 128.
  const ScaleStep s = next_time_scale({{32, 1.3}}, 2);
  EXPECT_EQ(s.scale, 128);
  EXPECT_FALSE(s.settled);
}

TEST(TimeScale, DownByHalvesWhileTheRatioLeavesRoom) {
  // At 128 the worst phase took 0.2: half would take about 0.4, still within 1/2: try 64.
  EXPECT_EQ(next_time_scale({{128, 0.2}}, 2).scale, 64);
  EXPECT_FALSE(next_time_scale({{128, 0.2}}, 2).settled);
  // At 64 it took 0.3: half would take 0.6, past 1/2: 64 is the answer.
  const ScaleStep s = next_time_scale({{128, 0.2}, {64, 0.3}}, 2);
  EXPECT_EQ(s.scale, 64);
  EXPECT_TRUE(s.settled);
}

TEST(TimeScale, DownInOneStepAfterANoisyTrialAskedTooMuch) {
  // 2048 (asked for by a trial a descheduled rank spoiled) took 0.01: 64 would take 0.32, within 1/2.
  EXPECT_EQ(next_time_scale({{2048, 0.01}}, 2).scale, 64);
  // ... but not below a factor that failed: 32 took 1.2, so 64 is the floor.
  EXPECT_EQ(next_time_scale({{32, 1.2}, {2048, 0.001}}, 2).scale, 64);
  EXPECT_FALSE(next_time_scale({{32, 1.2}, {2048, 0.001}}, 2).settled);
}

TEST(TimeScale, NeverBackToAHalfThatFailed) {
  // 256 fit with room, but 128 was tried before and failed: 256 stands.
  const ScaleStep s = next_time_scale({{64, 1.2}, {256, 0.1}, {128, 0.6}, {256, 0.12}}, 2);
  EXPECT_EQ(s.scale, 256);
  EXPECT_TRUE(s.settled);
  // A failure just above a factor that fit returns to it without trying again.
  const ScaleStep back = next_time_scale({{128, 0.2}, {64, 0.7}}, 2);
  EXPECT_EQ(back.scale, 128);
  EXPECT_TRUE(back.settled);
}

TEST(TimeScale, HeadroomOneAcceptsAnyFit) {
  EXPECT_TRUE(next_time_scale({{16, 0.9}}, 1).settled);
  EXPECT_FALSE(next_time_scale({{16, 0.9}}, 2).settled);
}

}  // namespace
}  // namespace ntp
