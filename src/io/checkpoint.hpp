#pragma once
// Checkpoints in HDF5, in Hugging Face names and shapes, full (unsharded) tensors:
//   GPT-2: /wte, /wpe, /h.{i}.ln_1.weight, /h.{i}.attn.c_attn.weight [d, 3d], ..., /ln_f.bias
//   Llama: /model.embed_tokens.weight, /model.layers.{i}.self_attn.q_proj.weight [H hs, d], k_proj,
//          v_proj [kv hs, d], o_proj [d, H hs], mlp.gate_proj, up_proj [ffn, d], down_proj [d, ffn],
//          input_layernorm.weight, post_attention_layernorm.weight, /model.norm.weight, /lm_head.weight
//   /optimizer/m/<name>, /optimizer/v/<name>        AdamW moments (same shapes)
//   root attributes: model (gpt2 or llama), step, samples_consumed, vocab, context, layers, heads,
//   hidden, format; Llama adds kv_heads, ffn, rope_theta
// Written at any TP layout, loadable at any other (and by other tools).
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm.hpp"
#include "model.hpp"
#include "optimizer.hpp"

namespace ntp {

// A checkpoint this run cannot start from: model dimensions that differ from the run's, or a
// tensor holding NaN or Inf. Every rank reads the whole file and reaches the same verdict.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct CheckpointMeta {
  int step = 0;                      // optimizer steps taken
  long long samples_consumed = 0;    // the global data cursor
  bool has_optimizer = false;
};

// Where each unit of every tensor is read from (per tensor, per unit; a replicated tensor is one
// unit), as ranks of the communicator passed to save_checkpoint.
using SourceOwners = std::vector<std::vector<int>>;
// The owners in one replica: replica_ranks holds its stages' TP groups, stage-major, each with
// `layout`. A tensor held by two stages (GPT-2's tied wte) is read from the first.
SourceOwners owners_in_replica(const ModelConfig& m, const TpLayout& layout, const std::vector<int>& replica_ranks,
                               int stages = 1);

// Collective over `comm`: gathers every tensor to `writer` from its owners with the reshard
// primitive; the writer writes `path` atomically (temporary file, then rename). Ranks that own
// nothing send nothing; they may pass null model and optimizer.
void save_checkpoint(const std::string& path, Comm& comm, int writer, const SourceOwners& owners,
                     const ModelConfig& m, Model* model, AdamW* opt, const CheckpointMeta& meta);

// Every rank reads its own shards. Loads the AdamW moments and step too when `opt` is given and
// the file has them. Checks the model dimensions and every tensor's shape, and refuses a tensor
// holding NaN or Inf (the error names the file and the tensor).
CheckpointMeta load_checkpoint(const std::string& path, Model& model, AdamW* opt);

// The full canonical (TP 1 storage order) value of every parameter tensor, for comparisons;
// group "optimizer/m/" or "optimizer/v/" reads a moment instead.
std::vector<std::vector<float>> read_checkpoint_params(const std::string& path, const ModelConfig& m,
                                                       const std::string& group = "");

}  // namespace ntp
