#include "param_compare.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "param_layout.hpp"

namespace ntp {

ParamDiff compare_params(const ModelConfig& m, const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b, double bound) {
  const auto specs = model_tensors(m);
  if (a.size() != specs.size() || b.size() != specs.size())
    throw std::invalid_argument("compare_params: tensor count mismatch");
  ParamDiff d;
  d.key_bias_bound = bound;
  const long hs = m.head_size();
  double all_diff2 = 0, all_ref2 = 0;
  for (std::size_t t = 0; t < specs.size(); ++t) {
    if (a[t].size() != b[t].size()) throw std::invalid_argument("compare_params: size mismatch in " + specs[t].name);
    const bool qkv_bias = specs[t].name.ends_with("attn.c_attn.bias");
    double diff2 = 0, ref2 = 0;
    for (std::size_t k = 0; k < a[t].size(); ++k) {
      const double delta = double(a[t][k]) - b[t][k];
      // Canonical c_attn.bias is [q | k | v] per head: element k is a key when (k / hs) % 3 == 1.
      if (qkv_bias && (long(k) / hs) % 3 == 1) {
        d.key_bias_max_abs = std::max(d.key_bias_max_abs, std::fabs(delta));
        continue;
      }
      diff2 += delta * delta;
      ref2 += double(b[t][k]) * b[t][k];
    }
    all_diff2 += diff2;
    all_ref2 += ref2;
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (rel > d.worst_rel_l2 || d.worst_tensor.empty()) d.worst_rel_l2 = rel, d.worst_tensor = specs[t].name;
  }
  d.model_rel_l2 = all_ref2 > 0 ? std::sqrt(all_diff2 / all_ref2) : std::sqrt(all_diff2);
  return d;
}

std::string ParamDiff::describe() const {
  return fmt::format(
      "relative L2 difference {:.3e} over all parameters; worst tensor {:.3e} ({}); attention key bias max |diff| "
      "{:.3e} (bound {:.1e})",
      model_rel_l2, worst_rel_l2, worst_tensor, key_bias_max_abs, key_bias_bound);
}

}  // namespace ntp
