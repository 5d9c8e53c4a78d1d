#pragma once
// SplitMix64 (Steele, Lea and Flood, 2014): a 64-bit hash whose outputs on consecutive inputs are
// well mixed. The counter-based random numbers of the initial weights and the seeds of the
// synthetic data both come from it, so that a value depends on its key alone, not on a draw order.
#include <cstdint>

namespace ntp {

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace ntp
