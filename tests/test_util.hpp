#pragma once
// Shared helpers for the engine tests: random data, error measures, shard maps, sub-groups.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <vector>

#include "comm.hpp"
#include "shard_map.hpp"

namespace ntp::test {

// A seed every rank agrees on, fresh each run (printed so a failure can be reproduced).
// NTPBENCH_TEST_SEED=N reruns a failure's seed.
inline std::uint64_t shared_seed() {
  const char* fixed = std::getenv("NTPBENCH_TEST_SEED");
  std::uint64_t s = fixed ? std::strtoull(fixed, nullptr, 10) : std::random_device{}();
  MPI_Bcast(&s, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  return s;
}

inline std::vector<float> random_vec(std::mt19937_64& rng, std::size_t n, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ||a - b|| / ||b|| (absolute when b is zero).
inline double rel_l2(const float* a, const float* b, std::size_t n) {
  double d2 = 0, r2 = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - b[i];
    d2 += d * d;
    r2 += double(b[i]) * b[i];
  }
  return r2 > 0 ? std::sqrt(d2 / r2) : std::sqrt(d2);
}
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  return rel_l2(a.data(), b.data(), std::min(a.size(), b.size()));
}

// A random map of `units` over `ranks` where every rank owns at least one unit, ownership
// scattered (non-contiguous) and uneven.
inline ShardMap random_map(std::mt19937_64& rng, int units, int ranks) {
  std::vector<int> owner(units);
  for (int u = 0; u < units; ++u) owner[u] = u < ranks ? u : static_cast<int>(rng() % ranks);
  std::shuffle(owner.begin(), owner.end(), rng);
  return ShardMap(owner, ranks);
}

// The first `size` ranks of the world as a group (nullptr on the others).
inline std::unique_ptr<Comm> first_ranks(int size) {
  auto world = world_comm();
  return world->split(world->rank() < size ? 0 : -1, world->rank());
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// Copies the units a rank owns (ascending) out of a full tensor of unit blocks.
inline std::vector<float> take_units(const std::vector<float>& full, const std::vector<int>& units, long unit_elems) {
  std::vector<float> out;
  for (int u : units) out.insert(out.end(), full.begin() + long(u) * unit_elems, full.begin() + long(u + 1) * unit_elems);
  return out;
}

}  // namespace ntp::test
