#pragma once
// Where every parameter tensor of one rank lives in the flat parameter arena. The gradient arena
// and both AdamW moment arenas use the same layout, so the optimizer and the DP reduction work on
// flat buffers.
//
// A sharded tensor is stored as its owned units, ascending, each unit a contiguous block of
// unit_elems floats. "Canonical" order is that storage at TP 1 (all units). It differs from the
// Hugging Face GPT-2 layout only for c_attn (heads interleaved as [q|k|v] per head, so a head is
// one block) and mlp.c_fc.weight (stored [out, in]); to_hf/from_hf convert.
#include <cstddef>
#include <string>
#include <vector>

#include "model_config.hpp"
#include "tp_layout.hpp"

namespace ntp {

// Which end of the model a tensor that belongs to no layer sits at (pipeline stages hold the input
// end on the first stage, the output end on the last).
enum class Home { Layer, Input, Output, InputAndOutput };

struct TensorSpec {
  std::string name;            // Hugging Face name, e.g. "h.3.attn.c_attn.weight", "model.norm.weight"
  ShardDim dim;                // which shard map splits it
  long unit_elems;             // floats per unit (whole tensor when replicated)
  std::vector<long> hf_shape;  // shape as Hugging Face stores it
  bool decay;                  // AdamW weight decay applies (2-D tensors)
  float init_std;              // normal(0, init_std), or the constant init_value when 0
  float init_value;
  int layer = -1;              // transformer layer it belongs to, -1 for embeddings, heads, final norm
  Home home = Home::Layer;     // where a tensor with layer -1 lives (GPT-2's tied wte: both ends)
  long full_elems(const ModelConfig& m) const;
};

// The part of the model one pipeline stage holds: layers [first, end), the input embedding on the
// first stage, the final norm, the LM head and the loss on the last. Layers are split as evenly as
// possible, the earlier stages taking the smaller share.
struct StageRange {
  int first = 0, end = 0;
  bool first_stage = true, last_stage = true;
  static StageRange whole(const ModelConfig& m) { return {0, m.layers, true, true}; }
  // Stage `stage` of `stages` (1 <= stages <= m.layers).
  static StageRange of(const ModelConfig& m, int stage, int stages);
  bool holds(const TensorSpec& s) const;
  bool operator==(const StageRange&) const = default;
};

// The tensors of a GPT-2 model, in arena order: wte, wpe, 12 per layer, ln_f.weight, ln_f.bias.
std::vector<TensorSpec> gpt2_tensors(const ModelConfig& m);
// The tensors of a Llama model, in arena order: model.embed_tokens, 9 per layer (10 with experts),
// model.norm, lm_head. Attention tensors shard by KV group (ShardDim::Heads has m.head_units()
// units). A MoE layer's gate, up and down hold every expert's, one expert a unit
// (ShardDim::Experts; stored stacked, Mixtral's experts.{e}.w1 / w3 / w2 as one tensor each), and
// its router (block_sparse_moe.gate, [E, d]) comes last, replicated.
std::vector<TensorSpec> llama_tensors(const ModelConfig& m);
// The model's family's tensors.
std::vector<TensorSpec> model_tensors(const ModelConfig& m);
// The tensor that sits at both ends of the model (GPT-2's wte, tied to the LM head), or -1.
int tied_tensor(const ModelConfig& m);

// Index of a layer's tensors within gpt2_tensors(); kind is one of the LayerTensor values.
enum LayerTensor {
  kLn1W, kLn1B, kQkvW, kQkvB, kAttnProjW, kAttnProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB, kPerLayer
};
constexpr int kWte = 0, kWpe = 1;
inline int layer_tensor(int layer, LayerTensor t) { return 2 + layer * kPerLayer + t; }
inline int lnf_weight(const ModelConfig& m) { return 2 + m.layers * kPerLayer; }
inline int lnf_bias(const ModelConfig& m) { return 3 + m.layers * kPerLayer; }

// Index of a Llama layer's tensors within llama_tensors() (kRouter: MoE layers only).
enum LlamaTensor { kAttnNorm, kQ, kK, kV, kO, kMlpNorm, kGate, kUp, kDown, kRouter };
constexpr int kEmbedTokens = 0;
inline int llama_per_layer(const ModelConfig& m) { return m.moe() ? 10 : 9; }
inline int llama_tensor(const ModelConfig& m, int layer, LlamaTensor t) { return 1 + layer * llama_per_layer(m) + t; }
inline int llama_norm(const ModelConfig& m) { return 1 + m.layers * llama_per_layer(m); }
inline int llama_lm_head(const ModelConfig& m) { return 2 + m.layers * llama_per_layer(m); }

struct TensorSlot {
  std::size_t offset;      // in floats, within the arena
  long elems;              // local floats
  std::vector<int> units;  // global units held here, ascending (one unit for replicated tensors)
};

// Tensors a pipeline stage does not hold keep their index with no units and no elements, so tensor
// indices are global at every layout and per-tensor loops (init, optimizer, checkpoints) need no
// stage logic.
class ParamLayout {
 public:
  ParamLayout(const ModelConfig& m, const TpLayout& tp, int tp_rank);
  ParamLayout(const ModelConfig& m, const TpLayout& tp, int tp_rank, const StageRange& stage);

  const ModelConfig& model() const { return model_; }
  const TpLayout& tp() const { return tp_; }
  int tp_rank() const { return tp_rank_; }
  const StageRange& stage() const { return stage_; }
  bool holds(int tensor) const { return stage_.holds(specs_[tensor]); }
  const std::vector<TensorSpec>& specs() const { return specs_; }
  const TensorSlot& slot(int tensor) const { return slots_[tensor]; }
  std::size_t total() const { return total_; }
  int tensor_count() const { return static_cast<int>(specs_.size()); }
  // The arena space a tensor of `elems` floats takes: every tensor starts 64-byte aligned, for
  // vectorised kernels.
  static std::size_t padded(std::size_t elems) { return (elems + 15) / 16 * 16; }
  // Local unit count of a sharded dimension on this rank.
  int local(ShardDim d) const { return tp_.map(d).count(tp_rank_); }

 private:
  ModelConfig model_;
  TpLayout tp_;
  int tp_rank_;
  StageRange stage_;
  std::vector<TensorSpec> specs_;
  std::vector<TensorSlot> slots_;
  std::size_t total_ = 0;
};

// Canonical full tensor <-> Hugging Face order.
std::vector<float> to_hf(const ModelConfig& m, const TensorSpec& s, const std::vector<float>& canonical);
std::vector<float> from_hf(const ModelConfig& m, const TensorSpec& s, const std::vector<float>& hf);

// Deterministic initial value of canonical element `index` of tensor `tensor`: the same for every
// layout, so runs at any TP degree start from identical weights.
void init_tensor_units(float* out, const ModelConfig& m, const TensorSpec& s, int tensor,
                       const std::vector<int>& units, unsigned long long seed);

}  // namespace ntp
