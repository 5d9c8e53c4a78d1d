#pragma once
// Model dimensions of both families (GPT-2 and Llama), the named presets, and the analytic FLOP
// count used for MFU and pacing.
#include <string>
#include <vector>

namespace ntp {

// gpt2: LayerNorm, GELU MLP (4d), learned positions, biases, LM head tied to the embedding.
// llama: RMSNorm, SwiGLU MLP (ffn), rotary positions, grouped-query attention, no biases, untied
// embedding and LM head.
enum class Family { Gpt2, Llama };
const char* family_name(Family f);
// "gpt2" or "llama"; throws std::invalid_argument otherwise.
Family parse_family(const std::string& name);

struct ModelConfig {
  int vocab = 256;    // V
  int context = 32;   // longest sequence (GPT-2: rows of the position table)
  int layers = 2;     // L
  int heads = 4;      // H (query heads)
  int hidden = 64;    // d
  Family family = Family::Gpt2;
  int kv_heads = 0;            // llama: key/value heads (a divisor of heads); 0 = heads
  int ffn = 0;                 // llama: SwiGLU width; 0 = 4d
  float rope_theta = 10000.0f; // llama: RoPE base
  // llama: a mixture of experts in place of each layer's MLP (Mixtral's block) when experts > 0:
  // a router picks each token's top_k of `experts` SwiGLU MLPs of width ffn. capacity_factor > 0
  // caps each expert at ceil(factor x tokens x top_k / experts) assignments per forward (the rest
  // are dropped); router_aux_coef weighs the load-balancing loss in the gradient.
  int experts = 0;
  int top_k = 2;
  float capacity_factor = 0.0f;
  float router_aux_coef = 0.01f;
  bool operator==(const ModelConfig&) const = default;
  int head_size() const { return hidden / heads; }
  int mlp() const { return family == Family::Llama && ffn > 0 ? ffn : 4 * hidden; }
  int kv() const { return family == Family::Llama && kv_heads > 0 ? kv_heads : heads; }
  int q_per_kv() const { return heads / kv(); }
  // Units of the attention shard dimension: heads (GPT-2) or KV groups, one KV head with its
  // query heads (Llama). TP degrees above this are refused.
  int head_units() const { return family == Family::Llama ? kv() : heads; }
  bool moe() const { return experts > 0; }
};

// Returns the preset's dimensions, or throws std::invalid_argument naming the known presets.
ModelConfig preset(const std::string& name);
const std::vector<std::string>& preset_names();
// The family a preset belongs to (its ModelConfig::family).
Family preset_family(const std::string& name);

// Throws std::invalid_argument naming the first inconsistent dimension (heads not dividing d, KV
// heads not dividing heads, an odd Llama head size, ...).
void validate_model(const ModelConfig& m);

// Parameter count of the full (unsharded) model (GPT-2: LM head tied to the token embedding).
long long parameter_count(const ModelConfig& m);

// FLOPs of one training step (forward + backward = 3x forward) over `sequences` sequences of
// length T: every matmul (including the LM head) at 2 FLOPs per multiply-add, and attention's
// two T x T products per head counted in full, as in the PaLM/Megatron MFU convention.
double training_flops(const ModelConfig& m, long long sequences, int T);
// The same per token of one forward pass, matmuls only (no attention), for one layer and the head.
double matmul_flops_per_token(const ModelConfig& m);

}  // namespace ntp
