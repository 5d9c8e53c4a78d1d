#pragma once
// Helpers shared by the kernel tests (CPU kernels against their references, CUDA kernels against
// the CPU kernels): fresh random inputs with a reported seed, and a scaled error measure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace ntp::test {

using Vec = std::vector<float>;

struct Rng {
  unsigned seed = std::random_device{}();
  std::mt19937 gen{seed};

  Vec vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    Vec v(n);
    for (float& x : v) x = d(gen);
    return v;
  }
  int uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(gen); }
};

// max |got - ref| / max(1, max |ref|)
inline double rel_err(const Vec& got, const Vec& ref) {
  double diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < ref.size(); i++) {
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return diff / scale;
}

}  // namespace ntp::test

// Declares `rng` and traces its seed, so any failure in the test reports how to reproduce it.
#define SEEDED_RNG(rng)  \
  ::ntp::test::Rng rng; \
  SCOPED_TRACE("seed=" + std::to_string(rng.seed))

#define EXPECT_CLOSE(got, ref, tol)                        \
  do {                                                     \
    ASSERT_EQ((got).size(), (ref).size());                 \
    EXPECT_LE(::ntp::test::rel_err(got, ref), tol) << #got; \
  } while (0)
