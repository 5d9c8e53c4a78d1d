#include "machine.hpp"

#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <cblas.h>
#include <fmt/format.h>

#include "comm.hpp"

namespace ntp {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Shape {
  int m, n, k;
};
// Square GEMMs and one shaped like a transformer layer's (tokens x 3d x d at d = 768): a thread
// count's best rate needs a GEMM big enough to keep every thread busy (1024^3 alone reads ~10%
// low at 2 threads here, and the steps' larger GEMMs then beat it).
constexpr Shape kShapes[] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {4096, 2304, 768}};

std::string shapes_text() {
  std::string s;
  for (const auto& sh : kShapes)
    s += (s.empty() ? "" : ", ") +
         (sh.m == sh.n && sh.n == sh.k ? fmt::format("{}^3", sh.m) : fmt::format("{}x{}x{}", sh.m, sh.n, sh.k));
  return s;
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
      for (const auto& [k, v] : entries) f << k << '\t' << fmt::format("{:.3f}", v) << '\n';
      if (!f) throw std::runtime_error("write");
    }
    std::filesystem::rename(tmp, path);
  } catch (const std::exception&) {
  }
}
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

double measure_sgemm_gflops(double seconds_per_shape) {
  double best = 0;
  for (const auto& s : kShapes) {
    std::vector<float> a(std::size_t(s.m) * s.k, 0.5f), b(std::size_t(s.k) * s.n, 0.25f), c(std::size_t(s.m) * s.n);
    auto call = [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, s.m, s.n, s.k, 1.0f, a.data(), s.k, b.data(), s.n,
                  0.0f, c.data(), s.n);
    };
    call();  // warm-up: threads started, pages touched
    const auto t_shape = Clock::now();
    for (int rep = 0; rep < 2 || since(t_shape) < seconds_per_shape; ++rep) {
      const auto t0 = Clock::now();
      call();
      best = std::max(best, 2.0 * s.m * s.n * s.k / since(t0) / 1e9);
    }
  }
  return best;
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
  auto node = node_comm();
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const bool oversubscribed = node->size() * threads > cores;
  double cached = 0;
  if (!p.cache_path.empty()) {
    const auto entries = read_cache(p.cache_path);
    if (auto it = entries.find(key); it != entries.end()) cached = it->second;
  }
  // Every rank of a node reads the same file, but agree on it anyway (a write may land between).
  node->allreduce_max(&cached, 1);
  // A first probe on this machine runs longer: later runs start from what it found.
  const double seconds = cached > 0 ? 0.1 : 0.5;
  double measured = 0;
  world.barrier();
  if (!oversubscribed) {
    measured = measure_sgemm_gflops(seconds);  // every rank at once, as in the steps
  } else {
    // More threads than cores: the rate a rank gets when its threads have cores, measured by the
    // node's first rank while the others wait (its rate alongside them is a share, not a peak).
    if (node->rank() == 0) measured = measure_sgemm_gflops(seconds);
  }
  node->allreduce_max(&measured, 1);
  if (node->rank() == 0 && !p.cache_path.empty() && measured > cached) raise_cache(p.cache_path, key, measured);
  double both[2] = {std::max(measured, cached), measured};
  world.allreduce_max(both, 2);
  world.allreduce_max(&cached, 1);
  p.gflops = both[0];
  p.measured = both[1];
  p.cached = cached;
  p.source = fmt::format(
      "cblas_sgemm, {} thread(s) per rank: the best call over {} ({}), max over the node's ranks and the best "
      "earlier probe on this machine ({}), fastest node; measured now {:.1f}, earlier best {:.1f} GFLOP/s",
      threads, shapes_text(), oversubscribed ? "its first rank alone, the node being oversubscribed" : "all ranks at once",
      p.cache_path.empty() ? "no cache" : p.cache_path, p.measured, p.cached);
  return p;
}

}  // namespace ntp
