#pragma once
// Shared pieces of the ntpbench microbenchmarks (Google Benchmark under MPI).
//
// Rules every benchmark in bench/ follows so that MPI ranks stay in lock-step:
//   * a benchmark that communicates sets an explicit ->Iterations(n) (and, if it wants,
//     ->Repetitions(r)); never a time-based iteration count, which would differ across ranks and
//     deadlock the collectives;
//   * it times each iteration with mpi_timed() (UseManualTime): per-iteration time is the maximum
//     over the ranks of the communicator, as a step is as slow as its slowest rank;
//   * only world rank 0 reports (see mpi_benchmark_main.cpp).
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace ntp::bench {

// Registration hooks run after MPI_Init and before the benchmarks run, so a benchmark can be
// registered with knowledge of the rank count. Use a static Registrar in each bench file.
// `cleanup` runs after the benchmarks and before MPI_Finalize (free communicators there).
std::vector<std::function<void()>>& registrations();
std::vector<std::function<void()>>& cleanups();
struct Registrar {
  explicit Registrar(std::function<void()> f, std::function<void()> cleanup = {}) {
    registrations().push_back(std::move(f));
    if (cleanup) cleanups().push_back(std::move(cleanup));
  }
};

int world_rank();
int world_size();

// Adds a count of wrong elements found by a correctness check; a non-zero total (summed over
// every rank) makes the benchmark binary exit non-zero.
void add_wrong(long long n);

// MPI_Barrier, but waiting ranks sleep instead of spinning, so a rank with nothing to do leaves
// the (possibly oversubscribed) cores to the ranks that compute. Not for timed regions.
void sleepy_barrier(MPI_Comm comm);

// The median of v (the mean of the middle two for an even count; 0 when empty).
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double max_over(MPI_Comm comm, double x) {
  MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, comm);
  return x;
}

// Runs fn on every rank between synchronisations and returns the longest time any rank of comm
// took (so one iteration can time several interleaved things and report medians).
template <typename F>
double max_timed(MPI_Comm comm, F&& fn, bool sleepy = false) {
  if (sleepy)
    sleepy_barrier(comm);
  else
    MPI_Barrier(comm);
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (sleepy) sleepy_barrier(comm);  // ranks done early sleep rather than spin in the reduction
  return max_over(comm, s);
}

// Runs fn() once between a barrier and the clock, and sets the iteration time to the largest
// time any rank of comm took (UseManualTime). Returns that time in seconds. sleepy: the
// synchronisation around the timed region sleeps instead of spinning (for benchmarks where some
// ranks idle while others compute on oversubscribed cores).
template <typename F>
double mpi_timed(benchmark::State& state, MPI_Comm comm, F&& fn, bool sleepy = false) {
  const double s = max_timed(comm, fn, sleepy);
  state.SetIterationTime(s);
  return s;
}

// Counters in the units people compare: Google Benchmark divides by the measured time.
inline benchmark::Counter gflops(double flops_per_iter) {
  return benchmark::Counter(flops_per_iter / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}
inline benchmark::Counter gbytes(double bytes_per_iter) {
  return benchmark::Counter(bytes_per_iter / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace ntp::bench
