#include "rebalance.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace ntp {

namespace {

// Coarsest unit first: the order units are placed in.
constexpr ShardDim kCoarsestFirst[] = {ShardDim::Heads, ShardDim::Experts, ShardDim::Mlp, ShardDim::Vocab};

// Per rank, the forward FLOPs of one sequence under `layout`.
std::vector<double> rank_loads(const ModelConfig& m, int T, const TpLayout& layout) {
  const auto cost = unit_forward_flops(m, T);
  std::vector<double> load(layout.degree(), 0.0);
  for (ShardDim d : kShardDims)
    for (int j = 0; j < layout.degree(); ++j) load[j] += layout.map(d).count(j) * cost[shard_index(d)];
  return load;
}

ShardMap contiguous(const std::vector<int>& counts) {
  std::vector<int> owner;
  for (int j = 0; j < static_cast<int>(counts.size()); ++j) owner.insert(owner.end(), counts[j], j);
  return ShardMap(std::move(owner), static_cast<int>(counts.size()));
}

}  // namespace

std::array<double, 4> unit_forward_flops(const ModelConfig& m, int T) {
  const double t = T, d = m.hidden, hs = m.head_size(), L = m.layers;
  // Per layer: the projections of the unit's columns/rows (2 FLOPs per multiply-add) and, for
  // attention, its two T x T products per query head.
  double attention;
  double mlp;
  double expert = 0;
  if (m.family == Family::Llama) {
    const double q = m.q_per_kv();
    attention = 2 * t * (d * q * hs + 2 * d * hs + q * hs * d) + 4.0 * q * t * t * hs;
    mlp = 2 * t * 3 * d;  // gate, up and down
    if (m.experts > 0) expert = mlp * m.mlp() * m.top_k / m.experts;
  } else {
    attention = 2 * t * (d * 3 * hs + hs * d) + 4.0 * t * t * hs;
    mlp = 2 * t * 2 * d;  // fc and proj
  }
  std::array<double, 4> cost{};
  cost[shard_index(ShardDim::Heads)] = L * attention;
  cost[shard_index(ShardDim::Mlp)] = L * mlp;
  cost[shard_index(ShardDim::Vocab)] = 2 * t * d;
  cost[shard_index(ShardDim::Experts)] = L * expert;
  return cost;
}

std::vector<double> compute_shares(const ModelConfig& m, int T, const TpLayout& layout) {
  std::vector<double> load = rank_loads(m, T, layout);
  double total = 0;
  for (double x : load) total += x;
  for (double& x : load) x /= total;
  return load;
}

TpLayout speed_layout(const ModelConfig& m, int T, const std::vector<double>& speed) {
  const int n = static_cast<int>(speed.size());
  const auto cost = unit_forward_flops(m, T);
  for (double s : speed)
    if (!(s > 0) || !std::isfinite(s)) throw std::invalid_argument("speed_layout: every speed must be positive");
  for (ShardDim d : kShardDims)
    if (shard_units(m, d) > 0 && shard_units(m, d) < n)
      throw std::invalid_argument("speed_layout: " + std::to_string(shard_units(m, d)) + " units cannot cover " +
                                  std::to_string(n) + " ranks");
  // Every rank keeps a unit of every dimension the model has; the rest go coarsest first.
  std::array<std::vector<int>, 4> counts;
  std::vector<double> load(n, 0.0);
  for (ShardDim d : kShardDims) {
    const int k = shard_index(d);
    counts[k].assign(n, shard_units(m, d) > 0 ? 1 : 0);
    for (int j = 0; j < n; ++j) load[j] += counts[k][j] * cost[k];
  }
  for (ShardDim d : kCoarsestFirst) {
    const int k = shard_index(d);
    for (int u = n; u < shard_units(m, d); ++u) {
      int best = 0;
      for (int j = 1; j < n; ++j)
        if ((load[j] + cost[k]) / speed[j] < (load[best] + cost[k]) / speed[best]) best = j;
      ++counts[k][best];
      load[best] += cost[k];
    }
  }
  TpLayout l;
  for (ShardDim d : kShardDims) l.map(d) = contiguous(counts[shard_index(d)]);
  return l;
}

double relative_step_time(const ModelConfig& m, int T, const TpLayout& layout, const std::vector<double>& speed,
                          int tp) {
  const std::vector<double> load = rank_loads(m, T, layout);
  double slowest = 0;
  for (int j = 0; j < layout.degree(); ++j) slowest = std::max(slowest, load[j] / speed.at(j));
  const std::vector<double> healthy = rank_loads(m, T, TpLayout::even(m, tp));
  return slowest / *std::max_element(healthy.begin(), healthy.end());
}

void rebalance_by_speed(Configuration& c, const ModelConfig& m, int T, int tp, int B, int M,
                        const std::vector<double>& rank_speed) {
  if (rank_speed.empty()) return;
  for (auto& rp : c.replicas) {
    if (!rp.active()) continue;
    const int n = rp.degree();
    std::vector<double> speed(n, 1.0);
    for (int st = 0; st < rp.stages; ++st)
      for (int j = 0; j < n; ++j) speed[j] = std::min(speed[j], rank_speed.at(rp.ranks[std::size_t(st) * n + j]));
    if (std::all_of(speed.begin(), speed.end(), [](double s) { return s >= 1; })) continue;
    rp.layout = speed_layout(m, T, speed);
    // The batch this replica can take in a healthy replica's step time (with the slack), in whole
    // micro-batches; never more than the policy gave it.
    const double room = (1 + kRebalanceSlack) / relative_step_time(m, T, rp.layout, speed, tp);
    if (M == 1) {
      rp.batch = std::clamp(static_cast<int>(std::floor(B * room + 1e-9)), 1, rp.batch);
    } else {
      rp.micro_batches = std::clamp(static_cast<int>(std::floor(M * room + 1e-9)), 1, rp.micro_batches);
      rp.batch = B / M * rp.micro_batches;
    }
  }
}

}  // namespace ntp
