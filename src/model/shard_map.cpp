#include "shard_map.hpp"

#include <stdexcept>
#include <string>

namespace ntp {

ShardMap::ShardMap(std::vector<int> owner, int ranks) : owner_(std::move(owner)), ranks_(ranks) {
  if (ranks <= 0) throw std::invalid_argument("shard map needs at least one rank");
  units_of_.assign(ranks, {});
  local_index_.assign(owner_.size(), -1);
  for (int u = 0; u < units(); ++u) {
    const int r = owner_[u];
    if (r < 0 || r >= ranks)
      throw std::invalid_argument("shard map: unit " + std::to_string(u) + " has owner " + std::to_string(r) +
                                  " outside [0, " + std::to_string(ranks) + ")");
    local_index_[u] = static_cast<int>(units_of_[r].size());
    units_of_[r].push_back(u);
  }
}

ShardMap ShardMap::even(int units, int ranks) {
  if (ranks <= 0) throw std::invalid_argument("shard map needs at least one rank");
  std::vector<int> owner(units);
  const int base = units / ranks, extra = units % ranks;
  int u = 0;
  for (int r = 0; r < ranks; ++r)
    for (int k = 0; k < base + (r < extra ? 1 : 0); ++k) owner[u++] = r;
  return ShardMap(std::move(owner), ranks);
}

ShardMap ShardMap::single(int units, int owner_rank, int ranks) {
  return ShardMap(std::vector<int>(units, owner_rank), ranks);
}

std::vector<int> ShardMap::local_rows(int rank) const {
  std::vector<int> rows(owner_.size(), -1);
  for (int u : units_of_[rank]) rows[u] = local_index_[u];
  return rows;
}

}  // namespace ntp
