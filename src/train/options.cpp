#include "options.hpp"

#include <filesystem>
#include <stdexcept>

#include "machine_profile.hpp"
#include "model_config.hpp"

namespace ntp {

double time_scale_value(const Options& o) { return o.time_scale; }

PacingConfig paced_rates(const Options& o, double scale) {
  PacingConfig c = o.pacing;
  if (!o.custom_machine()) {
    const MachineProfile& m = machine_profile(o.machine);
    c.device_gflops = m.tflops(o.emulated_precision) * 1e3;
    c.memory_gbps = m.memory_gbps;
    c.tp_gbps = m.scale_up_gbps;
    c.dp_gbps = m.scale_out_gbps;
    c.latency_us = m.latency_us;
  }
  c.device_gflops /= scale;
  c.memory_gbps /= scale;
  c.tp_gbps /= scale;
  c.dp_gbps /= scale;
  c.latency_us *= scale;
  c.time_scale = scale;
  // The emulated job's tensors travel as 2-byte elements under bf16 (Megatron's activations and
  // gradients); the model here sends 4-byte floats.
  if (!o.custom_machine() && o.emulated_precision == EmulatedPrecision::Bf16) c.shape.element_bytes = 0.5;
  if (o.emulates_shape()) {
    // The target at the same tokens and layout: per token and per rank, its costs over the model's.
    const ModelConfig t = preset(o.emulate_shape), &m = o.model;
    c.shape.flops = training_flops(t, 1, o.seq) / training_flops(m, 1, o.seq);
    c.shape.activation_bytes = double(t.hidden) / m.hidden;
    c.shape.activation_calls = double(t.layers) / m.layers;
    c.shape.parameter_bytes = double(parameter_count(t)) / double(parameter_count(m));
  }
  return c;
}

PacingConfig paced_rates(const Options& o) {
  const double s = time_scale_value(o);
  return paced_rates(o, s > 0 ? s : 1.0);
}

std::string checkpoint_dir_for(const Options& o) {
  if (!o.checkpoint_dir.empty()) return o.checkpoint_dir;
  std::filesystem::path p(o.out);
  return (p.parent_path() / (p.stem().string() + ".ckpt")).string();
}

}  // namespace ntp
