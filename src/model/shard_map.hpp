#pragma once
// Which rank of a group owns each unit of a sharded dimension (attention heads, MLP columns,
// vocabulary rows). Ownership need not be contiguous or even. A rank stores its units in
// ascending unit order; local_index() gives a unit's position in that order.
#include <vector>

namespace ntp {

class ShardMap {
 public:
  ShardMap() = default;
  // owner[u] in [0, ranks) for every unit u.
  ShardMap(std::vector<int> owner, int ranks);

  // Contiguous split as even as possible: 8 units over 3 ranks is 3+3+2, 4 over 3 is 2+1+1.
  static ShardMap even(int units, int ranks);
  // Every unit on one rank.
  static ShardMap single(int units, int owner_rank, int ranks);

  int units() const { return static_cast<int>(owner_.size()); }
  int ranks() const { return ranks_; }
  int owner(int unit) const { return owner_[unit]; }
  const std::vector<int>& owners() const { return owner_; }
  // Units owned by `rank`, ascending.
  const std::vector<int>& units_of(int rank) const { return units_of_[rank]; }
  int count(int rank) const { return static_cast<int>(units_of_[rank].size()); }
  // Position of `unit` among its owner's units.
  int local_index(int unit) const { return local_index_[unit]; }
  // For `rank`: a table over all units giving the local index, or -1 where another rank owns it.
  std::vector<int> local_rows(int rank) const;

  bool operator==(const ShardMap& o) const { return owner_ == o.owner_ && ranks_ == o.ranks_; }

 private:
  std::vector<int> owner_;
  int ranks_ = 0;
  std::vector<std::vector<int>> units_of_;
  std::vector<int> local_index_;
};

}  // namespace ntp
