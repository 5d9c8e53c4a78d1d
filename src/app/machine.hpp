#pragma once
// The host this rank runs on: how many BLAS/OpenMP threads it gets, and the SGEMM rate used as
// the peak for MFU when none is given.
#include <string>

namespace ntp {

class Comm;

// Sets BLAS and OpenMP threads for this rank (0 = cores on the node / ranks on the node). Returns the count.
int configure_threads(int requested);

// This rank's SGEMM rate (GFLOP/s) at its current thread count: the best single call over the
// probe's shapes (square 1024 and 2048, and 4096 x 2304 x 768 as in a transformer layer), each
// timed for at least `seconds_per_shape` after a warm-up call. A slowed call (a core busy with
// something else) only lowers its own sample, so the best call is the achievable rate.
double measure_sgemm_gflops(double seconds_per_shape = 0.1);

// The machine's SGEMM peak per rank, for MFU. Collective over `world` (all ranks at start-up).
// Each node probes (every rank at once, or its first rank alone when the node's ranks x threads
// exceed its cores), takes the max over its ranks and over the best earlier probe of this machine
// from the cache (keyed by CPU model, logical CPUs, threads, OpenBLAS core and OPENBLAS_CORETYPE /
// OPENBLAS_L2_SIZE), and raises the cache when it measured more; the peak is the max over nodes.
struct MachinePeak {
  double gflops = 0;    // the peak: max(measured, cached) over nodes
  double measured = 0;  // this run's probe (max over ranks and nodes)
  double cached = 0;    // the best earlier probe from the cache (0: none)
  std::string cache_path;
  std::string source;  // for peak_gflops_source
};
MachinePeak machine_sgemm_peak(Comm& world, int threads);

// Where the probe cache lives: $XDG_CACHE_HOME/ntpbench/sgemm-peak.tsv, else
// ~/.cache/ntpbench/sgemm-peak.tsv; empty when neither is known.
std::string peak_cache_path();

}  // namespace ntp
