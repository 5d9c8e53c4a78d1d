#include "machine.hpp"

#include "phase_clock.hpp"

#include <dirent.h>
#include <malloc.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <cblas.h>
#include <hdf5.h>
#include <fmt/format.h>

#include "comm.hpp"

namespace ntp {

namespace {
using Clock = std::chrono::steady_clock;

struct Shape {
  int m, n, k;
};
// The per-core rate: a GEMM that fits in a core's caches, on one thread. A call takes ~3 ms, short
// enough that many of them run whole inside one time slice even when other processes share the
// cores, so the best call is the core's rate, not the share of it this moment left over.
constexpr Shape kCoreShape = {512, 512, 512};
// The rank's threads together: square GEMMs and one shaped like a transformer layer's (tokens x 3d
// x d at d = 768), big enough to keep every thread busy (1024^3 alone reads ~10% low at 2 threads
// here, and the steps' larger GEMMs then beat it).
constexpr Shape kThreadShapes[] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 2304, 768}};

std::string shape_text(const Shape& sh) {
  return sh.m == sh.n && sh.n == sh.k ? fmt::format("{}^3", sh.m) : fmt::format("{}x{}x{}", sh.m, sh.n, sh.k);
}

// The best single call of `s` (GFLOP/s): a warm-up call, then calls for at least `seconds` (and
// at least `min_calls`). A call slowed by another process only lowers its own sample.
double best_call_gflops(const Shape& s, double seconds, int min_calls) {
  std::vector<float> a(std::size_t(s.m) * s.k, 0.5f), b(std::size_t(s.k) * s.n, 0.25f), c(std::size_t(s.m) * s.n);
  auto call = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n, 0.0f,
                c.data(), s.n);
  };
  call();  // warm-up: threads started, pages touched
  double best = 0;
  const auto t_start = Clock::now();
  for (int n = 0; n < min_calls || seconds_since(t_start) < seconds; ++n) {
    const auto t0 = Clock::now();
    call();
    best = std::max(best, 2.0 * s.m * s.n * s.k / seconds_since(t0) / 1e9);
  }
  return best;
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        auto v = line.substr(colon + 1);
        v.erase(0, v.find_first_not_of(" \t"));
        return v;
      }
    }
  return "unknown cpu";
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// What the probe's result depends on; tabs and newlines would break the cache's lines.
std::string cache_key(int threads) {
  std::string k = fmt::format("cpu={}|logical_cpus={}|threads={}|blas_core={}|OPENBLAS_CORETYPE={}|OPENBLAS_L2_SIZE={}",
                              cpu_model(), std::thread::hardware_concurrency(), threads, openblas_get_corename(),
                              env("OPENBLAS_CORETYPE"), env("OPENBLAS_L2_SIZE"));
  std::replace_if(k.begin(), k.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  return k;
}

// The cache: one line per key, "key<TAB>GFLOP/s".
std::map<std::string, double> read_cache(const std::string& path) {
  std::map<std::string, double> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    const auto tab = line.rfind('\t');
    if (tab == std::string::npos) continue;
    char* end = nullptr;
    const double v = std::strtod(line.c_str() + tab + 1, &end);
    if (end != line.c_str() + tab + 1 && v > 0 && v < 1e9) out[line.substr(0, tab)] = v;
  }
  return out;
}

// Raises the key's entry to `gflops` (read, merge, write a temporary file, rename); a cache that
// cannot be written is skipped: the peak of this run stands without it.
void raise_cache(const std::string& path, const std::string& key, double gflops) {
  try {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    auto entries = read_cache(path);
    if (entries[key] >= gflops) return;
    entries[key] = gflops;
    const std::string tmp = fmt::format("{}.{}.tmp", path, getpid());
    {
      std::ofstream f(tmp);
      for (const auto& [k, v] : entries) f << k << '\t' << fmt::format("{}", v) << '\n';
      if (!f) throw std::runtime_error("write");
    }
    std::filesystem::rename(tmp, path);
  } catch (const std::exception&) {
  }
}
}  // namespace

int configure_threads(int requested, Comm& group) {
  int n = requested;
  if (n <= 0) {
    auto node = group.split_node();
    cpu_set_t set;
    const int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set)
                                                                      : int(std::thread::hardware_concurrency());
    const int cores = std::max(1u, std::thread::hardware_concurrency());
    n = std::max(1, std::min(allowed, cores / node->size()));
  }
  openblas_set_num_threads(n);
  omp_set_num_threads(n);
  // Both pools must be what was set: the OpenMP build of OpenBLAS runs its calls on OpenMP's
  // threads, and a BLAS built for fewer threads (MAX_THREADS) or a pthread build beside OpenMP
  // would silently compute with another count than the one recorded.
  const int blas = openblas_get_num_threads(), omp = omp_get_max_threads();
  if ((blas != n || omp != n) && group.rank() == 0)
    std::fprintf(stderr, "ntpbench: warning: %d thread(s) per rank were set, but OpenBLAS runs %d and OpenMP %d (%s)\n",
                 n, blas, omp, openblas_get_config());
  return n;
}

SgemmProbe probe_sgemm(int threads, double seconds) {
  SgemmProbe p;
  openblas_set_num_threads(1);
  p.per_core = best_call_gflops(kCoreShape, seconds, 20);
  openblas_set_num_threads(threads);
  if (threads > 1)
    for (const auto& s : kThreadShapes) p.threads_best = std::max(p.threads_best, best_call_gflops(s, seconds / 3, 2));
  else
    p.threads_best = p.per_core;
  p.gflops = std::max(threads * p.per_core, p.threads_best);
  return p;
}

double measure_memcpy_gbps() {
  constexpr std::size_t kBytes = std::size_t(64) << 20;
  std::vector<char> from(kBytes, 1), to(kBytes, 0);  // both touched: no first-touch page faults timed
  double best = 0;
  for (int k = 0; k < 5; ++k) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), kBytes);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s > 0) best = std::max(best, kBytes / s / 1e9);
    from[k] = to[kBytes - 1 - k];  // the copies are used: not optimised away
  }
  return best;
}

double measure_sgemm_gflops() {
  return probe_sgemm(std::max(1, openblas_get_num_threads()), 0.15).gflops;
}

std::string peak_cache_path() {
  const std::string xdg = env("XDG_CACHE_HOME"), home = env("HOME");
  if (!xdg.empty()) return xdg + "/ntpbench/sgemm-peak.tsv";
  if (!home.empty()) return home + "/.cache/ntpbench/sgemm-peak.tsv";
  return "";
}

MachinePeak machine_sgemm_peak(Comm& world, int threads) {
  MachinePeak p;
  p.cache_path = peak_cache_path();
  const std::string key = cache_key(threads);
  auto node = world.split_node();
  double cached = 0;
  if (!p.cache_path.empty()) {
    const auto entries = read_cache(p.cache_path);
    if (auto it = entries.find(key); it != entries.end()) cached = it->second;
  }
  // A first probe on this machine runs longer: later runs start from what it found.
  const double seconds = cached > 0 ? 0.15 : 0.6;
  world.barrier();  // every rank probes at once, as the steps run
  const SgemmProbe probe = probe_sgemm(threads, seconds);
  // Per node: the max over its ranks, the same value on each; the cache raised when it is beaten.
  double measured[3] = {probe.gflops, probe.per_core, probe.threads_best};
  node->allreduce_max(measured, 3);
  node->allreduce_max(&cached, 1);
  if (node->rank() == 0 && !p.cache_path.empty() && measured[0] > cached) raise_cache(p.cache_path, key, measured[0]);
  // One peak for the job: the fastest node's.
  double all[5] = {std::max(measured[0], cached), measured[0], measured[1], measured[2], cached};
  world.allreduce_max(all, 5);
  p.gflops = all[0];
  p.measured = all[1];
  p.cached = all[4];
  p.source = fmt::format(
      "cblas_sgemm at {} thread(s) per rank: max of {} x the per-core rate (best {} call on one thread: {:.1f}) and "
      "the best {}-thread call over {} ({:.1f}), max over ranks at once, and over the best earlier probe on this "
      "machine ({}: {:.1f}); measured now {:.1f} GFLOP/s",
      threads, threads, shape_text(kCoreShape), all[2], threads,
      shape_text(kThreadShapes[0]) + ", " + shape_text(kThreadShapes[1]) + ", " + shape_text(kThreadShapes[2]),
      all[3], p.cache_path.empty() ? "no cache" : p.cache_path, p.cached, p.measured);
  return p;
}

ProcessUsage process_usage() {
  ProcessUsage u;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) {
      u.rss_bytes = std::atoll(line.c_str() + 6) * 1024;  // "VmRSS:   123456 kB"
      break;
    }
  if (DIR* d = opendir("/proc/self/fd")) {
    long long n = 0;
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
    u.open_fds = n - 1;  // the listing's own descriptor is not the process's
  }
  return u;
}

void configure_heap() { mallopt(M_MMAP_THRESHOLD, 128 * 1024); }

void release_free_memory() {
  H5garbage_collect();  // HDF5's free lists keep what a checkpoint read or write allocated
  malloc_trim(0);
}

}  // namespace ntp
