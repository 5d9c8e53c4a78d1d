#pragma once
// AdamW over the flat parameter arena, global-norm gradient clipping and the learning-rate schedule.
#include "arena.hpp"
#include "backend.hpp"
#include "comm.hpp"
#include "param_layout.hpp"

namespace ntp {

struct OptimizerConfig {
  float lr = 3e-4f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip = 1.0f;        // global gradient-norm threshold; 0 disables clipping
  int warmup = 0;           // linear warmup steps
  bool cosine = false;      // cosine decay to min_lr_ratio * lr at total_steps (after warmup)
  float min_lr_ratio = 0.1f;
  int total_steps = 1;

  float lr_at(int step) const;  // step counts from 1
  bool operator==(const OptimizerConfig&) const = default;
};

class AdamW {
 public:
  AdamW(Backend& backend, const ParamLayout& layout, const OptimizerConfig& cfg);

  // sqrt of the sum of squared gradients of the whole model: sharded tensors summed over the TP
  // group, replicated tensors (identical on every TP rank) counted once.
  double grad_norm(const float* grads, Comm& tp) const;
  // One AdamW step at `lr` with gradients scaled by grad_scale. Advances the step count.
  void step(float* params, const float* grads, float grad_scale, float lr);

  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  int steps_taken() const { return t_; }
  void set_steps_taken(int t) { t_ = t; }
  const OptimizerConfig& config() const { return cfg_; }

 private:
  Backend& be_;
  const ParamLayout& layout_;
  OptimizerConfig cfg_;
  Arena m_, v_;
  int t_ = 0;
};

// The clip factor for a gradient norm (1 when no clipping is needed).
float clip_scale(double norm, float clip);

}  // namespace ntp
