// Collectives over a size sweep, nccl-tests style: time, algbw = bytes / time and busbw = algbw x
// the collective's factor (all-reduce 2(n-1)/n; all-gather, reduce-scatter and all-to-all (n-1)/n
// with bytes = the full array; send/recv 1), each through the communication seam (ntp::Comm) and
// through the raw MPI call beside it, so any overhead the seam adds shows up as a difference.
// Every size is checked after timing; the count of wrong elements is the `wrong` counter and a
// non-zero total fails the run.
//
// Run under mpirun (2..8 ranks). Per-iteration time is the max over ranks (UseManualTime).
//
// The seam today offers float all-reduce and all-to-all(v) only: all-gather of floats,
// reduce-scatter and point-to-point are not part of ntp::Comm (the engine does not use them), so
// those rows are raw MPI only and say so in their label.
#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "comm.hpp"

namespace ntp::bench {
namespace {

std::unique_ptr<Comm> g_world;

std::vector<std::size_t> sizes() {
  std::vector<std::size_t> s;
  for (std::size_t b = 8; b <= (std::size_t(32) << 20); b *= 4) s.push_back(b);  // 8 B .. 32 MiB, x4
  s.push_back(std::size_t(64) << 20);                                             // and 64 MiB
  return s;
}

// Fixed (rank-independent) iteration counts keep every rank in lock-step.
int iterations_for(std::size_t bytes) {
  if (bytes <= (std::size_t(128) << 10)) return 40;
  if (bytes <= (std::size_t(2) << 20)) return 10;
  return 3;
}

std::string human(std::size_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + "MiB";
  if (b >= (1u << 10)) return std::to_string(b >> 10) + "KiB";
  return std::to_string(b) + "B";
}

enum class Path { Seam, Raw };

struct Collective {
  const char* name;
  double factor(int n) const {
    if (kind == Kind::AllReduce) return 2.0 * (n - 1) / n;
    if (kind == Kind::SendRecv) return 1.0;
    return double(n - 1) / n;
  }
  enum class Kind { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv } kind;
  bool has_seam;
  const char* raw_only_reason;
};

// Float counts: `total` is the full array in elements (the nccl-tests "size"), rounded down to a
// multiple of the rank count where the collective splits it.
struct Counts {
  long total, per_rank;
};
Counts counts_for(const Collective& c, std::size_t bytes, int n) {
  long total = std::max<long>(1, long(bytes / sizeof(float)));
  if (c.kind == Collective::Kind::AllGather || c.kind == Collective::Kind::ReduceScatter ||
      c.kind == Collective::Kind::AllToAll)
    total = std::max<long>(n, total / n * n);
  return {total, c.kind == Collective::Kind::AllReduce || c.kind == Collective::Kind::SendRecv ? total : total / n};
}

struct Buffers {
  std::vector<float> send, recv;
  std::vector<int> counts, displs;
};

void run_once(const Collective& c, Path path, Buffers& b, const Counts& k) {
  const int n = g_world->size(), r = g_world->rank();
  const int pr = static_cast<int>(k.per_rank);
  switch (c.kind) {
    case Collective::Kind::AllReduce:
      if (path == Path::Seam)
        g_world->allreduce_sum(b.send.data(), std::size_t(k.total));
      else
        MPI_Allreduce(MPI_IN_PLACE, b.send.data(), int(k.total), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Collective::Kind::AllGather:
      MPI_Allgather(b.send.data(), pr, MPI_FLOAT, b.recv.data(), pr, MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Collective::Kind::ReduceScatter:
      MPI_Reduce_scatter_block(b.send.data(), b.recv.data(), pr, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case Collective::Kind::AllToAll:
      if (path == Path::Seam)
        g_world->alltoallv(b.send.data(), b.counts, b.displs, b.recv.data(), b.counts, b.displs);
      else
        MPI_Alltoallv(b.send.data(), b.counts.data(), b.displs.data(), MPI_FLOAT, b.recv.data(), b.counts.data(),
                      b.displs.data(), MPI_FLOAT, MPI_COMM_WORLD);
      break;
    case Collective::Kind::SendRecv:
      MPI_Sendrecv(b.send.data(), int(k.total), MPI_FLOAT, (r + 1) % n, 0, b.recv.data(), int(k.total), MPI_FLOAT,
                   (r + n - 1) % n, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      break;
  }
}

// Fills the send buffer with a rank- and index-dependent pattern of small integers (exact in
// float under any summation order), runs the collective once, and counts wrong elements here.
long long check(const Collective& c, Path path, Buffers& b, const Counts& k) {
  const int n = g_world->size(), r = g_world->rank();
  const long pr = k.per_rank, T = k.total;
  const float tri = float(n) * (n + 1) / 2;
  auto pat = [](long i) { return float(i % 13 + 1); };
  long long wrong = 0;
  switch (c.kind) {
    case Collective::Kind::AllReduce:
      for (long i = 0; i < T; i++) b.send[i] = float(r + 1) * pat(i);
      run_once(c, path, b, k);
      for (long i = 0; i < T; i++) wrong += b.send[i] != tri * pat(i);
      break;
    case Collective::Kind::AllGather:
      for (long i = 0; i < pr; i++) b.send[i] = float(r * 1000) + pat(i);
      std::fill(b.recv.begin(), b.recv.begin() + T, -1.0f);
      run_once(c, path, b, k);
      for (long p = 0; p < n; p++)
        for (long i = 0; i < pr; i++) wrong += b.recv[p * pr + i] != float(p * 1000) + pat(i);
      break;
    case Collective::Kind::ReduceScatter:
      for (long i = 0; i < T; i++) b.send[i] = float(r + 1) * pat(i);
      std::fill(b.recv.begin(), b.recv.begin() + pr, -1.0f);
      run_once(c, path, b, k);
      for (long i = 0; i < pr; i++) wrong += b.recv[i] != tri * pat(r * pr + i);
      break;
    case Collective::Kind::AllToAll:
      for (long p = 0; p < n; p++)
        for (long i = 0; i < pr; i++) b.send[p * pr + i] = float(r * 64 + p) + 4096.0f * pat(i);
      std::fill(b.recv.begin(), b.recv.begin() + T, -1.0f);
      run_once(c, path, b, k);
      for (long p = 0; p < n; p++)
        for (long i = 0; i < pr; i++) wrong += b.recv[p * pr + i] != float(p * 64 + r) + 4096.0f * pat(i);
      break;
    case Collective::Kind::SendRecv: {
      const int prev = (r + n - 1) % n;
      for (long i = 0; i < T; i++) b.send[i] = float(r * 100) + pat(i);
      std::fill(b.recv.begin(), b.recv.begin() + T, -1.0f);
      run_once(c, path, b, k);
      for (long i = 0; i < T; i++) wrong += b.recv[i] != float(prev * 100) + pat(i);
      break;
    }
  }
  return wrong;
}

void register_all() {
  g_world = world_comm();
  const int n = g_world->size();
  const std::vector<Collective> collectives = {
      {"allreduce", Collective::Kind::AllReduce, true, nullptr},
      {"allgather", Collective::Kind::AllGather, false, "raw MPI_Allgather: ntp::Comm has no float all-gather"},
      {"reduce_scatter", Collective::Kind::ReduceScatter, false,
       "raw MPI_Reduce_scatter_block: ntp::Comm has no reduce-scatter"},
      {"alltoall", Collective::Kind::AllToAll, true, nullptr},
      {"sendrecv", Collective::Kind::SendRecv, false, "raw MPI_Sendrecv ring: ntp::Comm has no point-to-point"},
  };
  for (const Collective& c : collectives) {
    for (std::size_t bytes : sizes()) {
      for (Path path : {Path::Seam, Path::Raw}) {
        if (path == Path::Seam && !c.has_seam) continue;
        const std::string name =
            std::string(c.name) + "/" + (path == Path::Seam ? "seam" : "raw") + "/" + human(bytes);
        benchmark::RegisterBenchmark(name.c_str(), [c, path, bytes, n](benchmark::State& st) {
          const Counts k = counts_for(c, bytes, n);
          Buffers b;
          b.send.assign(std::size_t(k.total), 0.0f);  // zeros: repeated in-place sums stay finite
          b.recv.assign(std::size_t(k.total), 0.0f);
          b.counts.assign(n, int(k.per_rank));
          b.displs.resize(n);
          for (int p = 0; p < n; p++) b.displs[p] = int(p * k.per_rank);
          run_once(c, path, b, k);  // warm-up: page faults, connection set-up
          for (auto _ : st) mpi_timed(st, MPI_COMM_WORLD, [&] { run_once(c, path, b, k); });
          long long wrong = check(c, path, b, k);
          add_wrong(wrong);
          MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
          const double full = double(k.total) * sizeof(float);
          st.counters["bytes"] = full;
          st.counters["ranks"] = n;
          st.counters["algbw_GB/s"] = gbytes(full);
          st.counters["busbw_GB/s"] = gbytes(full * c.factor(n));
          st.counters["wrong"] = double(wrong);
          if (c.raw_only_reason) st.SetLabel(c.raw_only_reason);
        })
            ->UseManualTime()
            ->Iterations(iterations_for(bytes))
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
}

const Registrar registrar(register_all, [] { g_world.reset(); });

}  // namespace
}  // namespace ntp::bench
