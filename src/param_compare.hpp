#pragma once
// How two training runs' parameters are compared (replay, and the TP-vs-one-rank tests).
//
// Per tensor: relative L2 error ||a - b|| / ||b||. One slice is held to a different rule: the
// attention key bias. Its gradient is analytically zero (adding a constant to every key leaves
// each softmax row unchanged), so what a run computes for it is rounding noise, which Adam
// normalises into updates of size ~lr. Two correct runs therefore disagree there completely in
// relative terms while both stay tiny; the key bias is held to an absolute bound instead.
#include <string>
#include <vector>

#include "model_config.hpp"

namespace ntp {

struct ParamDiff {
  double worst_rel_l2 = 0;    // over every tensor (c_attn.bias: its query and value slices)
  std::string worst_tensor;
  double key_bias_max_abs = 0;  // largest |a - b| in any layer's key bias
  double key_bias_bound = 0;
  bool within(double rel_tol) const { return worst_rel_l2 <= rel_tol && key_bias_max_abs <= key_bias_bound; }
  std::string describe(double rel_tol) const;
};

// a, b: canonical full tensors in gpt2_tensors() order. lr, steps: the runs' learning rate and
// step count, which set the key-bias bound (0.1 * lr * steps: far below the lr-per-step a real
// gradient would move it).
ParamDiff compare_params(const ModelConfig& m, const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b, double lr, int steps);

}  // namespace ntp
