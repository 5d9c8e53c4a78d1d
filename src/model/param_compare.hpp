#pragma once
// How two training runs' parameters are compared (replay, and the TP-vs-one-rank tests).
//
// Rounding differs between layouts (a TP all-reduce sums partial products in another order), so
// runs agree to float tolerance, not bitwise. AdamW then amplifies those differences unevenly:
// its update m/sqrt(v) has the same size whatever the gradient's magnitude, so an element whose
// gradient is tiny (near-dead GELU units, rarely seen tokens, zero-initialised biases after few
// steps) moves by ~lr on a gradient that is mostly rounding. Hence three measures:
//   model_rel_l2:   ||a - b|| / ||b|| over all parameters together, the headline agreement;
//   worst_rel_l2:   the same per tensor, the largest, which catches a wrong tensor or shard;
//   key bias:       the attention key bias has an analytically zero gradient (a shift shared by
//                   all keys leaves each softmax row unchanged), so every run's value for it is
//                   Adam-normalised rounding noise; it is held to an absolute bound.
#include <string>
#include <vector>

#include "model_config.hpp"

namespace ntp {

// The per-tensor ceiling: far below the O(1) error of a wrong shard, above Adam's amplification
// of rounding in tiny-gradient elements over tens of steps.
inline constexpr double kTensorTolerance = 1e-3;

struct ParamDiff {
  double model_rel_l2 = 0;
  double worst_rel_l2 = 0;
  std::string worst_tensor;
  double key_bias_max_abs = 0;
  double key_bias_bound = 0;
  bool within(double model_tol, double tensor_tol = kTensorTolerance) const {
    return model_rel_l2 <= model_tol && worst_rel_l2 <= tensor_tol && key_bias_max_abs <= key_bias_bound;
  }
  std::string describe() const;
};

// a, b: canonical full tensors in model_tensors() order.
ParamDiff compare_params(const ModelConfig& m, const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b, double key_bias_bound);

// The key-bias bound for runs of `steps` AdamW steps at `lr`: a tenth of the lr-per-step a real
// gradient would move it.
inline double key_bias_bound(double lr, int steps) { return 0.1 * lr * steps; }

}  // namespace ntp
