// ntpbench: see README.md and `ntpbench --help`.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>

#include "comm.hpp"
#ifdef NTPBENCH_HAVE_CUDA
#include "comm_nccl.hpp"
#endif
#include "checkpoint.hpp"
#include "blas_core.hpp"
#include "cli.hpp"
#include "exit_codes.hpp"
#include "fault.hpp"
#include "launcher.hpp"
#include "machine.hpp"
#include "recorder.hpp"
#include "run.hpp"

namespace {
// --backend cuda with a GPU per rank: the world (and every group split from it) is NCCL's for
// device buffers. Otherwise MPI; the trainer stages device buffers when ranks share GPUs.
std::unique_ptr<ntp::Comm> make_world(const ntp::Options& o) {
#ifdef NTPBENCH_HAVE_CUDA
  if (o.backend == ntp::BackendKind::Cuda && !o.allow_gpu_sharing) return ntp::make_nccl_comm(MPI_COMM_WORLD);
#else
  (void)o;
#endif
  return ntp::world_comm();
}
}  // namespace

int main(int argc, char** argv) {
  // Before anything else: the BLAS kernels are chosen when the library loads (blas_core.hpp).
  ntp::select_blas_kernels(argv);
  ntp::ignore_broken_links();
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  ntp::configure_heap();
  ntp::set_command_line(argc, argv);
  int code = 0;
  try {
    // A replacement for a dead rank, started by the survivors: it has no command line of its own.
    if (auto parent = ntp::join_parent()) {
      code = ntp::run_joined(*parent);
      parent.reset();
      return ntp::finish_mpi(code);
    }
    // Not for a replacement: the job's own launcher started it, and its peers wait for it.
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if ((code = ntp::check_launcher(rank, size)) != 0) return ntp::finish_mpi(code);
    ntp::connect_world();
    // Every rank parses the same arguments and so reaches the same verdict; rank 0 speaks.
    ntp::ParseResult parsed = ntp::parse_options(argc, argv, rank == 0, size);
    if (!parsed.options) {
      code = parsed.exit_code;
    } else {
      auto world = make_world(*parsed.options);
      code = parsed.options->replay.empty() ? ntp::run_training(*parsed.options, *world)
                                            : ntp::run_replay(*parsed.options, *world);
    }
  } catch (const ntp::UsageError& e) {
    if (rank == 0) std::fprintf(stderr, "ntpbench: error: %s\n", e.what());
    code = ntp::code(ntp::ExitCode::BadInput);
  } catch (const ntp::CheckpointError& e) {
    // Every rank reads the whole file and reaches the same verdict; rank 0 speaks.
    if (rank == 0) std::fprintf(stderr, "ntpbench: error: %s\n", e.what());
    code = ntp::code(ntp::ExitCode::BadInput);
  } catch (const std::exception& e) {
    // May be this rank alone: end the job rather than leave peers waiting in a collective.
    std::fprintf(stderr, "ntpbench: error on rank %d: %s\n", rank, e.what());
    std::fflush(stderr);
    // Under ULFM, MPI_Abort was seen to exit 0 (one rank) or hang (two): this process leaves,
    // non-zero, and its peers see it as a failed rank.
    if (ntp::ulfm_enabled()) ntp::leave_job(ntp::code(ntp::ExitCode::Failed));
    MPI_Abort(MPI_COMM_WORLD, ntp::code(ntp::ExitCode::Failed));
  }
  return ntp::finish_mpi(code);
}
