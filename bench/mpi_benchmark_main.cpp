// MPI-aware main for Google Benchmark (linked into every bench_* binary).
//
// Every rank runs every benchmark with the same iteration counts (communicating benchmarks set
// ->Iterations explicitly; see bench_util.hpp); per-iteration time is the maximum over ranks
// (mpi_timed, UseManualTime). Only world rank 0 reports: the other ranks run with a reporter
// that prints nothing and with --benchmark_out=/dev/null. The run records the BLAS and OpenMP
// setup (OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE change which sgemm kernel OpenBLAS picks) in the
// benchmark context, so every JSON file says what it measured. The exit code is non-zero when any
// correctness check (add_wrong) found a wrong element on any rank.
#include <cblas.h>
#include <mpi.h>
#include <omp.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "blas_core.hpp"
#include "comm.hpp"

namespace ntp::bench {

std::vector<std::function<void()>>& registrations() {
  static std::vector<std::function<void()>> r;
  return r;
}

std::vector<std::function<void()>>& cleanups() {
  static std::vector<std::function<void()>> c;
  return c;
}

namespace {
long long g_wrong = 0;

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

std::string env_or_unset(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string("(unset)");
}

void add_context() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0;
  MPI_Get_library_version(lib, &len);
  std::string mpi(lib, len);
  if (auto nl = mpi.find_first_of("\r\n"); nl != std::string::npos) mpi.resize(nl);
  benchmark::AddCustomContext("mpi_ranks", std::to_string(world_size()));
  benchmark::AddCustomContext("mpi_library", mpi);
  benchmark::AddCustomContext("host", host);
  // Left exactly as the environment has them; recorded so results say which sgemm kernel ran.
  benchmark::AddCustomContext("OPENBLAS_CORETYPE", env_or_unset("OPENBLAS_CORETYPE"));
  benchmark::AddCustomContext("OPENBLAS_L2_SIZE", env_or_unset("OPENBLAS_L2_SIZE"));
  benchmark::AddCustomContext("OMP_NUM_THREADS", env_or_unset("OMP_NUM_THREADS"));
  benchmark::AddCustomContext("openblas_config", openblas_get_config());
  benchmark::AddCustomContext("openblas_corename", openblas_get_corename());
  benchmark::AddCustomContext("blas_core_choice", ntp::blas_core_note());
  benchmark::AddCustomContext("openblas_threads", std::to_string(openblas_get_num_threads()));
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
}
}  // namespace

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

void add_wrong(long long n) { g_wrong += n; }

void sleepy_barrier(MPI_Comm comm) {
  MPI_Request req;
  MPI_Ibarrier(comm, &req);
  int done = 0;
  const timespec nap{0, 50'000};  // 50 us
  for (MPI_Test(&req, &done, MPI_STATUS_IGNORE); !done; MPI_Test(&req, &done, MPI_STATUS_IGNORE))
    nanosleep(&nap, nullptr);
}

}  // namespace ntp::bench

int main(int argc, char** argv) {
  // As ntpbench does: the BLAS kernels for this CPU, chosen before the library is used (blas_core.hpp).
  ntp::select_blas_kernels(argv);
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  const int rank = ntp::bench::world_rank();

  // Ranks other than 0 write their file output to /dev/null (they still need a file reporter
  // when --benchmark_out is given, and must not clobber rank 0's file).
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    if (rank != 0 && std::strncmp(argv[i], "--benchmark_out=", 16) == 0) continue;
    args.emplace_back(argv[i]);
  }
  if (rank != 0) args.emplace_back("--benchmark_out=/dev/null");
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  int cargc = static_cast<int>(cargv.size());
  cargv.push_back(nullptr);

  int rc = 0;
  try {
    benchmark::Initialize(&cargc, cargv.data());
    if (benchmark::ReportUnrecognizedArguments(cargc, cargv.data())) {
      return ntp::finish_mpi(2);
    }
    ntp::bench::add_context();
    for (auto& reg : ntp::bench::registrations()) reg();
    if (rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      ntp::bench::NullReporter quiet;
      benchmark::RunSpecifiedBenchmarks(&quiet);
    }
    benchmark::Shutdown();
    for (auto& c : ntp::bench::cleanups()) c();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  long long wrong = ntp::bench::g_wrong;
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (wrong != 0) {
    if (rank == 0) std::fprintf(stderr, "FAILED: %lld wrong elements in correctness checks\n", wrong);
    rc = 1;
  }
  return ntp::finish_mpi(rc);  // rank 0 reports the verdict (see there)
}
