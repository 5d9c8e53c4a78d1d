#include "model_config.hpp"

#include <stdexcept>

namespace ntp {

namespace {
struct Named {
  const char* name;
  ModelConfig cfg;
};
constexpr Family kLlama = Family::Llama;
// V, context, L, H, d (, family, KV heads, FFN, RoPE theta)
const Named kPresets[] = {
    {"tiny", {256, 32, 2, 4, 64}},
    {"small", {256, 128, 4, 8, 256}},
    {"gpt2", {50257, 1024, 12, 12, 768}},
    {"gpt2-medium", {50257, 1024, 24, 16, 1024}},
    {"gpt2-large", {50257, 1024, 36, 20, 1280}},
    {"gpt2-xl", {50257, 1024, 48, 25, 1600}},
    // Llama: tiny for tests (8 ranks on 2 cores; 8 query heads in 4 KV groups, so TP 1, 2, 3, 4),
    // small for runs on a workstation, 8b with the shapes of an 8B-class model (benchmarks and
    // simulation: 32 layers, d 4096, 32 heads in 8 KV groups, FFN 14336, vocabulary 128256).
    {"llama-tiny", {256, 32, 2, 8, 64, kLlama, 4, 176, 10000.0f}},
    {"llama-small", {256, 128, 4, 8, 256, kLlama, 4, 688, 10000.0f}},
    {"llama-8b", {128256, 8192, 32, 32, 4096, kLlama, 8, 14336, 500000.0f}},
    // Mixtures of experts (Llama blocks with Mixtral's sparse MLP): tiny for tests (8 experts of
    // width 64, top 2: TP 1 to 4 as llama-tiny); Mixtral 8x7B's shapes (8 experts of 14336, top 2);
    // a fine-grained shape with DeepSeekMoE 16B's routed experts (64 of width 1408, top 6; its 2
    // shared experts and first dense layer are not modelled).
    {"moe-tiny", {256, 32, 2, 8, 64, kLlama, 4, 64, 10000.0f, 8, 2}},
    {"mixtral-8x7b", {32000, 32768, 32, 32, 4096, kLlama, 8, 14336, 1000000.0f, 8, 2}},
    {"moe-fine-16b", {102400, 4096, 28, 16, 2048, kLlama, 16, 1408, 10000.0f, 64, 6}},
};
}  // namespace

const char* family_name(Family f) { return f == Family::Llama ? "llama" : "gpt2"; }

Family parse_family(const std::string& name) {
  if (name == "gpt2") return Family::Gpt2;
  if (name == "llama") return Family::Llama;
  throw std::invalid_argument("unknown model family '" + name + "' (known: gpt2, llama)");
}

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

Family preset_family(const std::string& name) { return preset(name).family; }

void validate_model(const ModelConfig& m) {
  auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
  if (m.hidden % m.heads != 0)
    fail("hidden size " + std::to_string(m.hidden) + " is not a multiple of the head count " +
         std::to_string(m.heads));
  if (m.experts < 0) fail("--experts must be 0 (a dense MLP) or more");
  if (m.moe() && m.family != Family::Llama)
    fail("--experts needs a llama-family model (a mixture of SwiGLU experts, as Mixtral): use --model llama or a "
         "llama preset");
  if (m.moe() && (m.top_k < 1 || m.top_k > m.experts))
    fail("--top-k " + std::to_string(m.top_k) + " must be between 1 and the expert count " + std::to_string(m.experts));
  if (m.moe() && (!(m.capacity_factor >= 0) || !(m.router_aux_coef >= 0)))
    fail("--capacity-factor and --router-aux-coef must be 0 or more");
  if (m.family != Family::Llama) return;
  if (m.kv() < 1 || m.heads % m.kv() != 0)
    fail("the head count " + std::to_string(m.heads) + " is not a multiple of the KV-head count " +
         std::to_string(m.kv()) + " (--kv-heads)");
  if (m.head_size() % 2 != 0)
    fail("rotary embeddings need an even head size; hidden " + std::to_string(m.hidden) + " / heads " +
         std::to_string(m.heads) + " = " + std::to_string(m.head_size()));
  if (!(m.rope_theta > 1.0f)) fail("--rope-theta must be greater than 1");
}

long long parameter_count(const ModelConfig& m) {
  const long long d = m.hidden, V = m.vocab, S = m.context, L = m.layers, f = m.mlp();
  if (m.family == Family::Llama) {
    const long long hs = m.head_size(), q = m.heads * hs, kv = m.kv() * hs;
    // A MoE layer: every expert's gate, up and down, and the router's [E, d].
    const long long mlp = m.moe() ? m.experts * 3 * d * f + m.experts * d : 3 * d * f;
    const long long per_layer = 2 * d + d * q + 2 * d * kv + q * d + mlp;
    return 2 * V * d + L * per_layer + d;
  }
  const long long per_layer = 2 * d            // ln_1
                              + 3 * d * d + 3 * d  // c_attn
                              + d * d + d          // attn.c_proj
                              + 2 * d              // ln_2
                              + 4 * d * d + 4 * d  // c_fc
                              + 4 * d * d + d;     // mlp.c_proj
  return V * d + S * d + L * per_layer + 2 * d;
}

double matmul_flops_per_token(const ModelConfig& m) {
  const double d = m.hidden, V = m.vocab, L = m.layers, f = m.mlp();
  if (m.family == Family::Llama) {
    const double q = double(m.heads) * m.head_size(), kv = double(m.kv()) * m.head_size();
    // A MoE layer: the router, and top_k experts per token (none dropped).
    const double mlp = m.moe() ? d * m.experts + m.top_k * 3 * d * f : 3 * d * f;
    return 2.0 * (L * (d * q + 2 * d * kv + q * d + mlp) + d * V);
  }
  return 2.0 * (L * (3 * d * d + d * d + 2 * d * f) + d * V);
}

double training_flops(const ModelConfig& m, long long sequences, int T) {
  const double d = m.hidden, L = m.layers, tokens = double(sequences) * T;
  const double attention_per_seq = 2.0 * 2.0 * L * double(T) * T * d;  // QK^T and att.V, all heads
  return 3.0 * (matmul_flops_per_token(m) * tokens + attention_per_seq * sequences);
}

}  // namespace ntp
