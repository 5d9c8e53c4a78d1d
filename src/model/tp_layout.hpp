#pragma once
// The tensor-parallel layout of one replica: who owns which heads, MLP columns and vocabulary rows.
#include <string>

#include "model_config.hpp"
#include "shard_map.hpp"

namespace ntp {

enum class ShardDim { Replicated, Heads, Mlp, Vocab };

struct TpLayout {
  ShardMap heads, mlp, vocab;

  // Megatron's layout at degree `tp`: each dimension split contiguously and as evenly as possible.
  // The attention dimension's units are heads (GPT-2) or KV groups (Llama).
  static TpLayout even(const ModelConfig& m, int tp);
  int degree() const { return heads.ranks(); }
  const ShardMap& map(ShardDim d) const;
};

// Why `tp` is no valid TP degree for the model ("" when it is): at most one attention unit (head,
// or KV group for Llama) per rank.
std::string tp_degree_problem(const ModelConfig& m, int tp);

}  // namespace ntp
