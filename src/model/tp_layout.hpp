#pragma once
// The tensor-parallel layout of one replica: who owns which heads, MLP columns, vocabulary rows
// and experts.
#include <array>
#include <string>

#include "model_config.hpp"
#include "shard_map.hpp"

namespace ntp {

enum class ShardDim { Heads, Mlp, Vocab, Experts, Replicated };
// The sharded dimensions, in index order (a reshard plan's segment k is dimension k).
inline constexpr std::array<ShardDim, 4> kShardDims = {ShardDim::Heads, ShardDim::Mlp, ShardDim::Vocab,
                                                       ShardDim::Experts};
inline constexpr int shard_index(ShardDim d) { return static_cast<int>(d); }
// Units of a sharded dimension: attention units (heads, or KV groups for Llama), MLP columns (none
// in a mixture of experts, whose MLPs are the experts), vocabulary rows, experts (none in a dense
// model).
int shard_units(const ModelConfig& m, ShardDim d);

struct TpLayout {
  std::array<ShardMap, 4> maps;  // by shard_index

  // Megatron's layout at degree `tp`: each dimension split contiguously and as evenly as possible.
  static TpLayout even(const ModelConfig& m, int tp);
  // Each dimension d split by split(shard_units(m, d)) -> ShardMap.
  template <class Split>
  static TpLayout each(const ModelConfig& m, Split&& split) {
    TpLayout l;
    for (ShardDim d : kShardDims) l.map(d) = split(shard_units(m, d));
    return l;
  }
  int degree() const { return maps[0].ranks(); }
  const ShardMap& map(ShardDim d) const;
  ShardMap& map(ShardDim d) { return const_cast<ShardMap&>(static_cast<const TpLayout&>(*this).map(d)); }
  bool operator==(const TpLayout& o) const { return maps == o.maps; }
};

// Why `tp` is no valid TP degree for the model ("" when it is): at most one attention unit (head,
// or KV group for Llama) per rank, and at least one expert per rank.
std::string tp_degree_problem(const ModelConfig& m, int tp);

}  // namespace ntp
