#include "model_config.hpp"

#include <stdexcept>

namespace ntp {

namespace {
struct Named {
  const char* name;
  ModelConfig cfg;
};
// V, context, L, H, d
const Named kPresets[] = {
    {"tiny", {256, 32, 2, 4, 64}},
    {"small", {256, 128, 4, 8, 256}},
    {"gpt2", {50257, 1024, 12, 12, 768}},
    {"gpt2-medium", {50257, 1024, 24, 16, 1024}},
    {"gpt2-large", {50257, 1024, 36, 20, 1280}},
    {"gpt2-xl", {50257, 1024, 48, 25, 1600}},
};
}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& p : kPresets) n.emplace_back(p.name);
    return n;
  }();
  return names;
}

ModelConfig preset(const std::string& name) {
  for (const auto& p : kPresets)
    if (name == p.name) return p.cfg;
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown preset '" + name + "' (known: " + known + ")");
}

long long parameter_count(const ModelConfig& m) {
  const long long d = m.hidden, V = m.vocab, S = m.context, L = m.layers;
  const long long per_layer = 2 * d            // ln_1
                              + 3 * d * d + 3 * d  // c_attn
                              + d * d + d          // attn.c_proj
                              + 2 * d              // ln_2
                              + 4 * d * d + 4 * d  // c_fc
                              + 4 * d * d + d;     // mlp.c_proj
  return V * d + S * d + L * per_layer + 2 * d;
}

double training_flops(const ModelConfig& m, long long sequences, int T) {
  const double d = m.hidden, V = m.vocab, L = m.layers, tokens = double(sequences) * T;
  const double matmul_per_token = 2.0 * (L * (3 * d * d + d * d + 8 * d * d) + d * V);
  const double attention_per_seq = 2.0 * 2.0 * L * double(T) * T * d;  // QK^T and att.V, all heads
  return 3.0 * (matmul_per_token * tokens + attention_per_seq * sequences);
}

}  // namespace ntp
