#include "param_compare.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "param_layout.hpp"

namespace ntp {

ParamDiff compare_params(const ModelConfig& m, const std::vector<std::vector<float>>& a,
                         const std::vector<std::vector<float>>& b, double lr, int steps) {
  const auto specs = gpt2_tensors(m);
  if (a.size() != specs.size() || b.size() != specs.size())
    throw std::invalid_argument("compare_params: tensor count mismatch");
  ParamDiff d;
  d.key_bias_bound = 0.1 * lr * steps;
  const long hs = m.head_size();
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
    const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    if (rel > d.worst_rel_l2 || d.worst_tensor.empty()) d.worst_rel_l2 = rel, d.worst_tensor = specs[t].name;
  }
  return d;
}

std::string ParamDiff::describe(double rel_tol) const {
  return fmt::format(
      "largest relative parameter difference {:.3e} ({}; tolerance {:.1e}); attention key bias max |diff| {:.3e} "
      "(bound {:.1e}: its gradient is analytically zero, see param_compare.hpp)",
      worst_rel_l2, worst_tensor, rel_tol, key_bias_max_abs, key_bias_bound);
}

}  // namespace ntp
