#include "ntp_layout.hpp"

#include <stdexcept>
#include <string>

namespace ntp {

namespace {
void check(int units, int n, int n2) {
  if (n2 < 1 || n2 > n) throw std::invalid_argument("NTP layout: sync degree must be in [1, n]");
  if (units > 0 && units < n)  // a dimension the model lacks (experts of a dense model) has no units
    throw std::invalid_argument("NTP layout: " + std::to_string(units) + " units cannot cover " + std::to_string(n) +
                                " ranks");
}
}  // namespace

ShardMap core_extra_map(int units, int n, int n2) {
  check(units, n, n2);
  const ShardMap chunks = ShardMap::even(units, n2);
  const ShardMap share = ShardMap::even(units, n);  // share.count(r): how many units rank r holds
  std::vector<int> owner(units, -1);
  std::vector<int> tails;
  for (int i = 0; i < n2; ++i) {
    const auto& c = chunks.units_of(i);
    const int keep = share.count(i);
    for (int k = 0; k < static_cast<int>(c.size()); ++k) {
      if (k < keep)
        owner[c[k]] = i;
      else
        tails.push_back(c[k]);
    }
  }
  std::size_t next = 0;
  for (int r = n2; r < n; ++r)
    for (int k = 0; k < share.count(r); ++k) owner[tails.at(next++)] = r;
  return ShardMap(std::move(owner), n);
}

ShardMap chunk_map(int units, int n, int n2) {
  check(units, n, n2);
  const ShardMap chunks = ShardMap::even(units, n2);
  return ShardMap(chunks.owners(), n);
}

TpLayout core_extra_layout(const ModelConfig& m, int n, int n2) {
  return TpLayout::each(m, [&](int units) { return core_extra_map(units, n, n2); });
}

TpLayout chunk_layout(const ModelConfig& m, int n, int n2) {
  return TpLayout::each(m, [&](int units) { return chunk_map(units, n, n2); });
}

}  // namespace ntp
