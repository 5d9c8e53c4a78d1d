#pragma once
// Rebalancing a replica's tensor-parallel shares by speed (--straggler-policy rebalance): a rank
// that runs at speed s (1: healthy, 0.5: a straggler at half speed) gets a share of the heads,
// MLP columns and vocabulary rows such that every rank of the replica finishes its compute at about
// the same time. Shards need not be equal under nonuniform TP, so this is a layout like any other
// (TpLayout), reached with the one reshard primitive; whole heads (KV groups) stay whole.
//
// Units are assigned coarsest first (attention units, then MLP columns, then vocabulary rows), each
// to the rank whose compute time would grow least, every rank keeping at least one unit of each
// dimension; a rank then holds its units as one contiguous block (ranks in TP order). The fine MLP
// and vocabulary units even out what the coarse heads cannot.
#include <array>
#include <vector>

#include "configuration.hpp"
#include "model_config.hpp"
#include "tp_layout.hpp"

namespace ntp {

// Forward FLOPs of one sequence of length T through one unit of each sharded dimension over the
// whole model, by shard_index: an attention unit (a head, or a Llama KV group with its query
// heads), an MLP column, a vocabulary row, an expert (the tokens the router sends it on average,
// T k / E), counted as the models count their own (local_forward_flops).
std::array<double, 4> unit_forward_flops(const ModelConfig& m, int T);

// Each TP index's fraction of the replica's forward FLOPs per sequence under `layout` (0.25 each
// at the even split over 4; /ranks/compute_share).
std::vector<double> compute_shares(const ModelConfig& m, int T, const TpLayout& layout);

// The layout of a replica whose TP ranks run at `speed` (one per TP index, > 0).
TpLayout speed_layout(const ModelConfig& m, int T, const std::vector<double>& speed);

// Seconds-like cost of one sequence on the slowest rank of `layout` at `speed`, relative to a
// healthy replica of degree `tp` at the even split: 1 for a healthy replica, 8/7 ideally for one
// rank of four at half speed, more where the units cannot balance exactly.
double relative_step_time(const ModelConfig& m, int T, const TpLayout& layout, const std::vector<double>& speed,
                          int tp);

// How far a rebalanced replica may run behind a healthy one before its batch is cut by one more
// sequence (or micro-batch): shares of whole units rarely balance exactly.
inline constexpr double kRebalanceSlack = 0.02;

// Every active replica with a rank slower than 1 (rank_speed per world rank; empty: nothing to do)
// takes its speed layout, and the largest batch (in whole micro-batches) that keeps pace with a
// healthy replica of degree `tp` and batch B within kRebalanceSlack. A replica's TP index j runs at
// the lowest speed of its stages' ranks j.
void rebalance_by_speed(Configuration& c, const ModelConfig& m, int T, int tp, int B, int M,
                        const std::vector<double>& rank_speed);

}  // namespace ntp
