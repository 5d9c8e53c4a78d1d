#pragma once
// Shard layouts for nonuniform TP (the paper's "core" and "extra" ranks).
//
// Let N2 be the smallest live TP degree among replicas. The degraded layout splits each sharded
// dimension into N2 contiguous chunks, chunk i on rank i. A replica with n > N2 ranks holds its
// shards so that rank i < N2 (a core rank) owns the first part of chunk i and the extra ranks
// n-N2.. own the chunks' tails, each rank holding an even share. Gradient sync then gathers each
// chunk on its core rank, all-reduces chunk i among the core ranks i of all replicas (one DP
// all-reduce per sync slot), and scatters the tails back. Example from the paper, 24 heads, TP 8
// with N2 = 6: core ranks hold {0,1,2}, {4,5,6}, ...; extra rank 6 holds {3,7,11}, rank 7 {15,19,23}.
// With n == N2 the layout is the contiguous even split: Megatron's layout at degree n.
#include "model_config.hpp"
#include "shard_map.hpp"
#include "tp_layout.hpp"

namespace ntp {

// Layout of `units` over n ranks for sync degree n2 (1 <= n2 <= n).
ShardMap core_extra_map(int units, int n, int n2);
// Every unit to the core rank of its chunk (ranks n2..n-1 own nothing): where gradients meet.
ShardMap chunk_map(int units, int n, int n2);

TpLayout core_extra_layout(const ModelConfig& m, int n, int n2);
TpLayout chunk_layout(const ModelConfig& m, int n, int n2);

}  // namespace ntp
