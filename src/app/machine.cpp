#include "machine.hpp"

#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include <cblas.h>

#include "comm.hpp"

namespace ntp {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

int configure_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    auto node = node_comm();
    cpu_set_t set;
    const int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                      : int(std::thread::hardware_concurrency());
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    n = std::max(1, std::min(allowed, cores / node->size()));
  }
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
  return n;
}

double measure_sgemm_gflops() {
  // Large enough to reach the BLAS's steady rate (a small GEMM underestimates it, and MFU then
  // reads above 100%).
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(),
                n);
    best = std::max(best, 2.0 * n * n * n / since(t0) / 1e9);
  }
  return best;
}

}  // namespace ntp
