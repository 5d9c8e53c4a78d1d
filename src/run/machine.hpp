#pragma once
// The host this rank runs on: how many BLAS/OpenMP threads it gets, and the SGEMM rate used as
// the peak for MFU when none is given.
#include <string>

namespace ntp {

class Comm;

// Sets BLAS and OpenMP threads for this rank (0 = cores on the node / ranks of `group` on the node:
// collective over the group then; spares, which compute nothing, are not in it). Returns the count.
int configure_threads(int requested, Comm& group);

// One rank's SGEMM probe at `threads` threads (GFLOP/s). per_core: the best call of a
// cache-resident 512^3 GEMM on one thread (a call lasts ~3 ms, so many run whole inside one time
// slice even while other processes share the cores: the best is the core's rate, not what this
// moment left of it). threads_best: the best call at `threads` threads over 1024^3, 2048^3 and
// 4096 x 2304 x 768 (a transformer layer's shape). gflops = max(threads x per_core, threads_best):
// an achievable rate of the rank's cores, not a datasheet peak. `seconds` bounds each part.
struct SgemmProbe {
  double per_core = 0, threads_best = 0, gflops = 0;
};
SgemmProbe probe_sgemm(int threads, double seconds);
// probe_sgemm at the BLAS's current thread count: this rank alone, now.
double measure_sgemm_gflops();
// This process's memory-copy bandwidth now, GB/s (bytes copied per second; the best of a few
// memcpy calls of 64 MiB, beyond the caches): the physical limit of moving a shard on one host.
double measure_memcpy_gbps();

// The machine's SGEMM peak per rank, for MFU. Collective over `world` (all ranks at start-up).
// Every rank probes at once; each node takes the max over its ranks and over the best earlier
// probe of this machine from the cache (keyed by CPU model, logical CPUs, threads, OpenBLAS core,
// OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE), and raises the cache when it measured more. The peak is
// the max over nodes: the same on every rank.
struct MachinePeak {
  double gflops = 0;    // the peak: max(measured, cached) over nodes
  double measured = 0;  // this run's probe (max over ranks and nodes)
  double cached = 0;    // the best earlier probe from the cache (0: none)
  std::string cache_path;
  std::string source;  // for peak_gflops_source
};
MachinePeak machine_sgemm_peak(Comm& world, int threads);

// This process's resident memory (VmRSS of /proc/self/status, bytes) and open file descriptors
// (entries of /proc/self/fd): sampled after every step for the soak's flatness check. -1 where
// /proc cannot be read.
struct ProcessUsage {
  long long rss_bytes = -1;
  long long open_fds = -1;
};
ProcessUsage process_usage();

// glibc's heap for a long run: blocks of 128 KiB and more are mapped and unmapped on their own
// (glibc's default raises that threshold each time such a block is freed, after which a
// reconfiguration's buffers come from the heap and stay there after they are freed), so resident
// memory follows what the process holds. Once per process, before the first large allocation.
void configure_heap();
// Hands the heap's free pages (and HDF5's free lists) back to the system: after a
// reconfiguration, whose old layout's buffers were just freed, and after a checkpoint.
void release_free_memory();

// Where the probe cache lives: $XDG_CACHE_HOME/ntpbench/sgemm-peak.tsv, else
// ~/.cache/ntpbench/sgemm-peak.tsv; empty when neither is known.
std::string peak_cache_path();

}  // namespace ntp
