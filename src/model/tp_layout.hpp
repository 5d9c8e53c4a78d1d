#pragma once
// The tensor-parallel layout of one replica: who owns which heads, MLP columns and vocabulary rows.
#include "model_config.hpp"
#include "shard_map.hpp"

namespace ntp {

enum class ShardDim { Replicated, Heads, Mlp, Vocab };

struct TpLayout {
  ShardMap heads, mlp, vocab;

  // Megatron's layout at degree `tp`: each dimension split contiguously and as evenly as possible.
  static TpLayout even(const ModelConfig& m, int tp);
  int degree() const { return heads.ranks(); }
  const ShardMap& map(ShardDim d) const;
};

}  // namespace ntp
