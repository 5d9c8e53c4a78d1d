#include "param_layout.hpp"

#include "splitmix64.hpp"

#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace ntp {

long TensorSpec::full_elems(const ModelConfig& m) const {
  switch (dim) {
    case ShardDim::Replicated: return unit_elems;
    case ShardDim::Heads: return unit_elems * m.head_units();
    case ShardDim::Mlp: return unit_elems * m.mlp();
    case ShardDim::Vocab: return unit_elems * m.vocab;
    case ShardDim::Experts: return unit_elems * m.experts;
  }
  return 0;
}

std::vector<TensorSpec> gpt2_tensors(const ModelConfig& m) {
  const long d = m.hidden, hs = m.head_size(), f = m.mlp(), V = m.vocab, S = m.context;
  const float std_w = 0.02f;
  // GPT-2 scales the residual projections by 1/sqrt(2L).
  const float std_proj = 0.02f / std::sqrt(2.0f * m.layers);
  std::vector<TensorSpec> t;
  t.push_back({"wte", ShardDim::Vocab, d, {V, d}, true, std_w, 0});
  t.push_back({"wpe", ShardDim::Replicated, S * d, {S, d}, true, 0.01f, 0});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "h." + std::to_string(l) + ".";
    t.push_back({p + "ln_1.weight", ShardDim::Replicated, d, {d}, false, 0, 1});
    t.push_back({p + "ln_1.bias", ShardDim::Replicated, d, {d}, false, 0, 0});
    t.push_back({p + "attn.c_attn.weight", ShardDim::Heads, 3 * hs * d, {d, 3 * d}, true, std_w, 0});
    t.push_back({p + "attn.c_attn.bias", ShardDim::Heads, 3 * hs, {3 * d}, false, 0, 0});
    t.push_back({p + "attn.c_proj.weight", ShardDim::Heads, hs * d, {d, d}, true, std_proj, 0});
    t.push_back({p + "attn.c_proj.bias", ShardDim::Replicated, d, {d}, false, 0, 0});
    t.push_back({p + "ln_2.weight", ShardDim::Replicated, d, {d}, false, 0, 1});
    t.push_back({p + "ln_2.bias", ShardDim::Replicated, d, {d}, false, 0, 0});
    t.push_back({p + "mlp.c_fc.weight", ShardDim::Mlp, d, {d, f}, true, std_w, 0});
    t.push_back({p + "mlp.c_fc.bias", ShardDim::Mlp, 1, {f}, false, 0, 0});
    t.push_back({p + "mlp.c_proj.weight", ShardDim::Mlp, d, {f, d}, true, std_proj, 0});
    t.push_back({p + "mlp.c_proj.bias", ShardDim::Replicated, d, {d}, false, 0, 0});
  }
  t.push_back({"ln_f.weight", ShardDim::Replicated, d, {d}, false, 0, 1});
  t.push_back({"ln_f.bias", ShardDim::Replicated, d, {d}, false, 0, 0});
  for (std::size_t i = 2; i < t.size() - 2; ++i) t[i].layer = static_cast<int>((i - 2) / kPerLayer);
  t[kWte].home = Home::InputAndOutput;  // the LM head is tied to it
  t[kWpe].home = Home::Input;
  t[t.size() - 2].home = t[t.size() - 1].home = Home::Output;
  return t;
}

std::vector<TensorSpec> llama_tensors(const ModelConfig& m) {
  const long d = m.hidden, hs = m.head_size(), f = m.mlp(), V = m.vocab, H = m.heads, G = m.kv();
  const long qg = m.q_per_kv() * hs;  // query rows of one KV group
  const float std_w = 0.02f, std_proj = 0.02f / std::sqrt(2.0f * m.layers);
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", ShardDim::Vocab, d, {V, d}, true, std_w, 0});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::size_t first = t.size();
    t.push_back({p + "input_layernorm.weight", ShardDim::Replicated, d, {d}, false, 0, 1});
    t.push_back({p + "self_attn.q_proj.weight", ShardDim::Heads, qg * d, {H * hs, d}, true, std_w, 0});
    t.push_back({p + "self_attn.k_proj.weight", ShardDim::Heads, hs * d, {G * hs, d}, true, std_w, 0});
    t.push_back({p + "self_attn.v_proj.weight", ShardDim::Heads, hs * d, {G * hs, d}, true, std_w, 0});
    t.push_back({p + "self_attn.o_proj.weight", ShardDim::Heads, qg * d, {d, H * hs}, true, std_proj, 0});
    t.push_back({p + "post_attention_layernorm.weight", ShardDim::Replicated, d, {d}, false, 0, 1});
    if (m.moe()) {
      const long E = m.experts;
      const std::string moe = p + "block_sparse_moe.";
      t.push_back({moe + "experts.w1.weight", ShardDim::Experts, f * d, {E, f, d}, true, std_w, 0});
      t.push_back({moe + "experts.w3.weight", ShardDim::Experts, f * d, {E, f, d}, true, std_w, 0});
      t.push_back({moe + "experts.w2.weight", ShardDim::Experts, f * d, {E, d, f}, true, std_proj, 0});
      t.push_back({moe + "gate.weight", ShardDim::Replicated, E * d, {E, d}, true, std_w, 0});
    } else {
      t.push_back({p + "mlp.gate_proj.weight", ShardDim::Mlp, d, {f, d}, true, std_w, 0});
      t.push_back({p + "mlp.up_proj.weight", ShardDim::Mlp, d, {f, d}, true, std_w, 0});
      t.push_back({p + "mlp.down_proj.weight", ShardDim::Mlp, d, {d, f}, true, std_proj, 0});
    }
    for (std::size_t i = first; i < t.size(); ++i) t[i].layer = l;
  }
  t.push_back({"model.norm.weight", ShardDim::Replicated, d, {d}, false, 0, 1});
  t.push_back({"lm_head.weight", ShardDim::Vocab, d, {V, d}, true, std_w, 0});
  t[kEmbedTokens].home = Home::Input;
  t[t.size() - 2].home = t[t.size() - 1].home = Home::Output;
  return t;
}

std::vector<TensorSpec> model_tensors(const ModelConfig& m) {
  return m.family == Family::Llama ? llama_tensors(m) : gpt2_tensors(m);
}

StageRange StageRange::of(const ModelConfig& m, int stage, int stages) {
  if (stages < 1 || stages > m.layers || stage < 0 || stage >= stages)
    throw std::invalid_argument("pipeline stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                                " for a model of " + std::to_string(m.layers) + " layers");
  const auto bound = [&](int s) { return static_cast<int>(static_cast<long>(s) * m.layers / stages); };
  return {bound(stage), bound(stage + 1), stage == 0, stage == stages - 1};
}

bool StageRange::holds(const TensorSpec& s) const {
  switch (s.home) {
    case Home::Layer: return s.layer >= first && s.layer < end;
    case Home::Input: return first_stage;
    case Home::Output: return last_stage;
    case Home::InputAndOutput: return first_stage || last_stage;
  }
  return false;
}

int tied_tensor(const ModelConfig& m) { return m.family == Family::Gpt2 ? kWte : -1; }

ParamLayout::ParamLayout(const ModelConfig& m, const TpLayout& tp, int tp_rank)
    : ParamLayout(m, tp, tp_rank, StageRange::whole(m)) {}

ParamLayout::ParamLayout(const ModelConfig& m, const TpLayout& tp, int tp_rank, const StageRange& stage)
    : model_(m), tp_(tp), tp_rank_(tp_rank), stage_(stage), specs_(model_tensors(m)) {
  validate_model(m);
  if (tp.map(ShardDim::Heads).units() != m.head_units())
    throw std::invalid_argument("TP layout splits " + std::to_string(tp.map(ShardDim::Heads).units()) +
                                " attention units, the " +
                                family_name(m.family) + " model has " + std::to_string(m.head_units()));
  for (const auto& s : specs_) {
    TensorSlot slot;
    slot.offset = total_;
    if (!stage_.holds(s))
      slot.units = {};
    else if (s.dim == ShardDim::Replicated)
      slot.units = {0};
    else
      slot.units = tp_.map(s.dim).units_of(tp_rank);
    slot.elems = s.unit_elems * static_cast<long>(slot.units.size());
    total_ += padded(static_cast<std::size_t>(slot.elems));
    slots_.push_back(std::move(slot));
  }
}

namespace {
// Index maps between canonical and HF flat order for the two tensors that differ.
// c_attn: canonical ((h*3 + p)*hs + i) [*d + c]  <->  HF [c*3d +] p*d + h*hs + i.
template <typename F>
void for_each_pair(const ModelConfig& m, const TensorSpec& s, F f) {
  const long d = m.hidden, hs = m.head_size(), H = m.heads, fm = m.mlp();
  const bool qkv_w = s.name.ends_with("attn.c_attn.weight"), qkv_b = s.name.ends_with("attn.c_attn.bias");
  const bool fc_w = s.name.ends_with("mlp.c_fc.weight");
  // Llama's row-parallel weights: canonical [in, out], Hugging Face [out, in]; the experts' down
  // projections so, expert by expert.
  const bool row_w = s.name.ends_with("self_attn.o_proj.weight") || s.name.ends_with("mlp.down_proj.weight");
  const bool experts_down = s.name.ends_with("block_sparse_moe.experts.w2.weight");
  if (row_w || experts_down) {
    const long blocks = experts_down ? s.hf_shape[0] : 1;
    const long in = s.hf_shape.back(), out = s.hf_shape[s.hf_shape.size() - 2], size = in * out;
    for (long b = 0; b < blocks; ++b)
      for (long i = 0; i < in; ++i)
        for (long o = 0; o < out; ++o) f(b * size + i * out + o, b * size + o * in + i);
  } else if (qkv_w || qkv_b) {
    const long cols = qkv_w ? d : 1;
    for (long h = 0; h < H; ++h)
      for (long p = 0; p < 3; ++p)
        for (long i = 0; i < hs; ++i)
          for (long c = 0; c < cols; ++c) {
            const long canon = ((h * 3 + p) * hs + i) * cols + c;
            const long hf = qkv_w ? c * 3 * d + p * d + h * hs + i : p * d + h * hs + i;
            f(canon, hf);
          }
  } else if (fc_w) {
    for (long o = 0; o < fm; ++o)
      for (long c = 0; c < d; ++c) f(o * d + c, c * fm + o);
  } else {
    const long n = s.full_elems(m);
    for (long i = 0; i < n; ++i) f(i, i);
  }
}
}  // namespace

std::vector<float> to_hf(const ModelConfig& m, const TensorSpec& s, const std::vector<float>& canonical) {
  std::vector<float> hf(canonical.size());
  for_each_pair(m, s, [&](long c, long h) { hf[h] = canonical[c]; });
  return hf;
}

std::vector<float> from_hf(const ModelConfig& m, const TensorSpec& s, const std::vector<float>& hf) {
  std::vector<float> canonical(hf.size());
  for_each_pair(m, s, [&](long c, long h) { canonical[c] = hf[h]; });
  return canonical;
}

namespace {
// A standard normal from a counter: Box-Muller on two hashed uniforms.
float counter_normal(std::uint64_t key) {
  const std::uint64_t a = splitmix64(key), b = splitmix64(a ^ 0x5851f42d4c957f2dULL);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
}
}  // namespace

void init_tensor_units(float* out, const ModelConfig& /*m*/, const TensorSpec& s, int tensor,
                       const std::vector<int>& units, unsigned long long seed) {
  const std::uint64_t base = splitmix64(seed * 0x100000001b3ULL + static_cast<std::uint64_t>(tensor));
  long k = 0;
  for (int u : units) {
    const long first = static_cast<long>(u) * s.unit_elems;
    for (long e = 0; e < s.unit_elems; ++e, ++k)
      out[k] = s.init_std > 0 ? s.init_std * counter_normal(base ^ splitmix64(first + e)) : s.init_value;
  }
}

}  // namespace ntp
