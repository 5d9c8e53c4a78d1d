// What the MPI library itself keeps on a survivor for every process it replaces.
//
// ntpbench's repair under --kill-mode signal, with nothing of ntpbench in it: each cycle one rank
// (never rank 0) SIGKILLs itself, the survivors see the failure, revoke, shrink, spawn one new
// process, merge with it and split back into logical order; then every pair of ranks exchanges a
// message (so each survivor holds a connection to each peer, as a training step's all-to-alls and
// all-reduces leave it) and all-reduce 256 KiB. By default every communicator is freed as soon as
// it is replaced (--keep-handles keeps them, as ntpbench does: TrainingRun::adopt). Rank 0 samples
// its resident memory (VmRSS), the heap glibc has handed out (mallinfo2) and its open descriptors
// after every cycle.
//
// What is left growing is what the library holds per replaced process; `make soak` runs this
// beside the real-kill soak and `python -m analysis soak --library-cost` sets it against ntpbench's
// own growth. Not a Google Benchmark: the cycles kill processes and cannot be repeated as
// iterations. Needs ULFM (mpirun --with-ft ulfm).
#include <mpi.h>
#include <mpi-ext.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <malloc.h>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comm/leave_unfinalized.hpp"

namespace {

struct Sample {
  long long rss_bytes = 0, heap_bytes = 0;
  int open_fds = 0;
};

Sample sample() {
  Sample s;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) s.rss_bytes = std::atoll(line.c_str() + 6) * 1024;
  s.heap_bytes = static_cast<long long>(mallinfo2().uordblks);
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++s.open_fds;
  return s;
}

// Least-squares slope of y over x (bytes per cycle).
double slope(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) sx += x[i], sy += y[i], sxx += x[i] * x[i], sxy += x[i] * y[i];
  return (n * sxy - sx * sy) / (n * sxx - sx * sx);
}

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  std::fprintf(stderr, "ulfm_respawn_cost: %s failed (MPI error %d)\n", what, rc);
  std::fflush(nullptr);
  std::_Exit(3);
}

MPI_Comm returning(MPI_Comm c) {
  MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return c;
}

// The library is known to wait for ever in a repair now and then (recovery/recovery.cpp, comm_mpi.cpp):
// a process that is still here after the limit ends with a message rather than hang the job.
void arm_deadline(unsigned seconds) {
  std::signal(SIGALRM, [](int) {
    static const char msg[] =
        "ulfm_respawn_cost: error: still running at the time limit (--timeout); the MPI hung in a repair\n";
    [[maybe_unused]] auto w = write(2, msg, sizeof msg - 1);
    std::_Exit(5);
  });
  alarm(seconds);
}

// Blocks until the MPI reports a failed member of `comm`, or a peer that saw it first has revoked
// `comm` (as ntpbench's Comm::peer_failed asks), or 3 s have passed. The library does not always
// tell every survivor of a death, nor deliver the revoke to it (seen here in 1 run of 8), and such
// a survivor would wait here while the others wait for it in the shrink; since every survivor knows
// that the victim is dead, it then goes on to the repair, whose agreement brings it the news.
void wait_for_failure(MPI_Comm comm) {
  const double give_up = MPI_Wtime() + 3.0;
  while (MPI_Wtime() < give_up) {
    int revoked = 0;
    if (MPIX_Comm_is_revoked(comm, &revoked) != MPI_SUCCESS || revoked) return;
    int flag = 0;
    if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return;
    MPI_Group failed;
    MPIX_Comm_get_failed(comm, &failed);
    int n = 0;
    MPI_Group_size(failed, &n);
    MPI_Group_free(&failed);
    if (n > 0) return;
    usleep(1000);
  }
}

struct Run {
  int cycles = 40;
  bool keep_handles = false;
};

// This process's place in the job: its cycle, logical rank and communicator, and what it keeps.
struct State {
  Run run;
  int cycle = 0, logical = 0;
  MPI_Comm comm = MPI_COMM_NULL;
  std::vector<MPI_Comm> kept;  // --keep-handles

  void retire(MPI_Comm& c) {
    if (run.keep_handles)
      kept.push_back(c);
    else
      MPI_Comm_free(&c);
  }
};

// A process started by the launcher: the options, then the world. Returns the exit status when
// the process must end at once (bad options, too few ranks), else nothing.
std::optional<int> start_launched(int argc, char** argv, State& s, std::string& json_path, unsigned& timeout) {
  CLI::App app{"What the MPI library keeps on a survivor per replaced process: kill, shrink, spawn, merge, "
               "repeated; rank 0 samples its memory and descriptors (bench/README.md). Launch with "
               "mpirun --with-ft ulfm -np N (N >= 3)."};
  app.add_option("--cycles", s.run.cycles, "replacements: one rank killed and one process spawned per cycle")
      ->check(CLI::Range(4, 100000))->capture_default_str();
  app.add_flag("--keep-handles", s.run.keep_handles,
               "keep every replaced communicator instead of freeing it (what ntpbench does)");
  app.add_option("--json", json_path, "write the samples and the fitted costs here");
  app.add_option("--timeout", timeout, "seconds before a process gives up on a hung repair (exit 5)")
      ->check(CLI::PositiveNumber)->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    // Rank 0 alone reports a refusal: when every rank exits non-zero after MPI_Finalize, Open
    // MPI 5.0.11's launcher sometimes never returns (ntpbench's finish_mpi has the figures).
    const int rc = rank == 0 ? app.exit(e) : 0;
    MPI_Finalize();
    return rc;
  }
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  MPI_Comm_rank(MPI_COMM_WORLD, &s.logical);
  if (n < 3) {
    if (s.logical == 0) std::fprintf(stderr, "ulfm_respawn_cost: error: needs at least 3 ranks (got %d)\n", n);
    MPI_Finalize();
    return s.logical == 0 ? 2 : 0;  // rank 0 alone reports it, as above
  }
  check(MPI_Comm_dup(MPI_COMM_WORLD, &s.comm), "MPI_Comm_dup");
  return std::nullopt;
}

// A replacement: learns the cycle, the logical rank and the settings from the survivors.
void start_replacement(MPI_Comm parent, State& s) {
  MPI_Comm merged;
  check(MPI_Intercomm_merge(returning(parent), 1, &merged), "MPI_Intercomm_merge");
  int info[4] = {};
  check(MPI_Bcast(info, 4, MPI_INT, 0, returning(merged)), "MPI_Bcast");
  s.cycle = info[0], s.logical = info[1], s.run.cycles = info[2], s.run.keep_handles = info[3] != 0;
  check(MPI_Comm_split(merged, 0, s.logical, &s.comm), "MPI_Comm_split");
  s.retire(merged);
}

// Every pair connected, then a collective, as after a training step. The victim's last messages
// may still be in flight when it dies, so a survivor can see the failure here already: it then
// goes straight to the repair (its revoke frees any peer still waiting).
void exchange(const State& s, int n, std::vector<float>& payload) {
  std::vector<int> out(n, s.logical), in(n);
  bool ok = MPI_Alltoall(out.data(), 1, MPI_INT, in.data(), 1, MPI_INT, s.comm) == MPI_SUCCESS;
  for (int p = 0; ok && p < n; ++p)
    if (p != s.logical)
      ok = MPI_Sendrecv(&s.logical, 1, MPI_INT, p, 7, &in[p], 1, MPI_INT, p, 7, s.comm, MPI_STATUS_IGNORE) ==
           MPI_SUCCESS;
  if (ok) MPI_Allreduce(MPI_IN_PLACE, payload.data(), static_cast<int>(payload.size()), MPI_FLOAT, MPI_SUM, s.comm);
}

// This cycle's victim kills itself; the survivors revoke, shrink, spawn its replacement (`self`,
// this program), merge with it and split back into logical order.
void replace_victim(State& s, int n, char* self) {
  const int victim = 1 + s.cycle % (n - 1);
  if (s.logical == victim) std::raise(SIGKILL);
  wait_for_failure(s.comm);
  MPIX_Comm_revoke(s.comm);
  MPI_Comm live, inter, merged, next;
  check(MPIX_Comm_shrink(s.comm, &live), "MPIX_Comm_shrink");
  char* no_args[] = {nullptr};
  check(MPI_Comm_spawn(self, no_args, 1, MPI_INFO_NULL, 0, returning(live), &inter, MPI_ERRCODES_IGNORE),
        "MPI_Comm_spawn");
  check(MPI_Intercomm_merge(returning(inter), 0, &merged), "MPI_Intercomm_merge");
  int info[4] = {s.cycle + 1, victim, s.run.cycles, s.run.keep_handles ? 1 : 0};
  check(MPI_Bcast(info, 4, MPI_INT, 0, returning(merged)), "MPI_Bcast");
  check(MPI_Comm_split(merged, 0, s.logical, &next), "MPI_Comm_split");
  s.retire(s.comm), s.retire(live), s.retire(inter), s.retire(merged);
  s.comm = returning(next);
}

// Rank 0's samples reduced to costs per replacement.
struct Costs {
  bool fitted = false;
  double rss_per = 0, heap_per = 0;
  int fd_max = 0;
  std::string library;
};

Costs fit_costs(const std::vector<Sample>& samples, int n) {
  // The fit starts once every peer has been replaced once (cycle n - 1): before that each cycle
  // also opens the first connection to a new job, which the descriptor count shows separately.
  std::vector<double> x, rss, heap;
  for (std::size_t c = static_cast<std::size_t>(n - 1); c < samples.size(); ++c) {
    x.push_back(double(c));
    rss.push_back(double(samples[c].rss_bytes));
    heap.push_back(double(samples[c].heap_bytes));
  }
  Costs k;
  k.fitted = x.size() >= 3;
  if (k.fitted) k.rss_per = slope(x, rss), k.heap_per = slope(x, heap);
  for (const auto& s : samples) k.fd_max = std::max(k.fd_max, s.open_fds);
  char version[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(version, &len);
  k.library.assign(version, len);
  if (const auto cut = k.library.find_first_of("\n,"); cut != std::string::npos) k.library.erase(cut);
  return k;
}

void print_costs(const std::vector<Sample>& samples, const Costs& k, int n, const Run& run) {
  std::printf("ulfm_respawn_cost: %d ranks, %d replacements, %s handles (%s)\n", n, run.cycles,
              run.keep_handles ? "kept" : "freed", k.library.c_str());
  std::printf("  rank 0 resident memory %.1f -> %.1f MB; per replacement %.0f kB resident, %.0f kB heap in use\n",
              samples.front().rss_bytes / 1e6, samples.back().rss_bytes / 1e6, k.rss_per / 1e3, k.heap_per / 1e3);
  std::printf("  rank 0 open descriptors %d -> %d (max %d) for %d peers\n", samples.front().open_fds,
              samples.back().open_fds, k.fd_max, n - 1);
  if (!k.fitted)
    std::printf("  too few cycles after the first round of replacements to fit a cost (--cycles >= %d)\n", n + 2);
}

void write_json(const std::string& path, const std::vector<Sample>& samples, const Costs& k, int n, const Run& run) {
  nlohmann::json j = {{"ranks", n}, {"cycles", run.cycles}, {"keep_handles", run.keep_handles},
                      {"library", k.library}, {"rss_bytes_per_replacement", k.rss_per},
                      {"heap_bytes_per_replacement", k.heap_per}, {"fitted_from_cycle", n - 1},
                      {"open_fds_first", samples.front().open_fds}, {"open_fds_max", k.fd_max},
                      {"open_fds_last", samples.back().open_fds}};
  for (const auto& s : samples) {
    j["rss_bytes"].push_back(s.rss_bytes);
    j["heap_bytes"].push_back(s.heap_bytes);
    j["open_fds"].push_back(s.open_fds);
  }
  std::ofstream(path) << j.dump(1) << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm parent;
  MPI_Comm_get_parent(&parent);

  State s;
  std::string json_path;
  unsigned timeout = 600;
  if (parent != MPI_COMM_NULL)
    start_replacement(parent, s);
  else if (const auto rc = start_launched(argc, argv, s, json_path, timeout))
    return *rc;
  arm_deadline(timeout);
  returning(s.comm);
  int n = 0;
  MPI_Comm_size(s.comm, &n);

  std::vector<Sample> samples;
  std::vector<float> payload(1 << 16, 1.0f);
  for (; s.cycle < s.run.cycles; ++s.cycle) {
    exchange(s, n, payload);
    if (s.logical == 0) samples.push_back(sample());
    replace_victim(s, n, argv[0]);
  }

  if (s.logical == 0) {
    const Costs k = fit_costs(samples, n);
    print_costs(samples, k, n, s.run);
    if (!json_path.empty()) write_json(json_path, samples, k, n, s.run);
    std::fflush(nullptr);
  }
  // As ntpbench's finish_mpi: after a repair Open MPI 5.0.x can hang in MPI_Finalize, so every
  // process leaves after a last barrier without it (the launcher's prte_allowed_exit_without_sync),
  // but as a finalized client of the launcher, which otherwise may abort the job with exit 1.
  MPI_Barrier(s.comm);
  ntp::leave_launcher();
  std::_Exit(0);
}
