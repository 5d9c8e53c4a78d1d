#include "launcher.hpp"

#include <fmt/format.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "exit_codes.hpp"

// The launcher of the MPI this binary was built against (CMake's MPIEXEC_EXECUTABLE).
#ifndef NTPBENCH_MPIEXEC
#define NTPBENCH_MPIEXEC "mpirun"
#endif

namespace ntp {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

#ifdef OMPI_MAJOR_VERSION
constexpr int kBuiltMajor = OMPI_MAJOR_VERSION;
const std::string kBuilt = fmt::format("Open MPI {}.{}.{}", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#else
constexpr int kBuiltMajor = 0;  // not Open MPI: only the world-size test applies
const std::string kBuilt = "this MPI";
#endif

// What an Open MPI launcher leaves in its ranks' environment: Open MPI 5's (PRRTE) exports
// OMPI_VERSION; 4.x and older (ORTE) export OMPI_MCA_orte_launch and no version. Returns the
// launcher's name where it is not of the built major version, else "".
std::string foreign_launcher() {
  if (kBuiltMajor == 0) return "";
  if (const char* v = env("OMPI_VERSION"); v != nullptr && std::atoi(v) != kBuiltMajor)
    return fmt::format("Open MPI {}'s mpirun", v);
  if (env("OMPI_MCA_orte_launch") != nullptr && kBuiltMajor >= 5) return "an Open MPI 4 (or older) mpirun";
  return "";
}

// Why this launch is refused, or "" when it is not.
std::string launcher_mismatch(int world_size) {
  if (std::string who = foreign_launcher(); !who.empty())
    return fmt::format("this job was started by {}, but ntpbench was built against {}", who, kBuilt);
  // Another MPI's launcher whose ranks each start alone: every process is rank 0 of a world of 1.
  if (const char* n = env("OMPI_COMM_WORLD_SIZE"); n != nullptr && std::atoi(n) != world_size)
    return fmt::format("the launcher started {} processes (OMPI_COMM_WORLD_SIZE), but this one's MPI world "
                       "holds {}: it was not started by a launcher of {}, which ntpbench was built against",
                       n, world_size, kBuilt);
  return "";
}

}  // namespace

int check_launcher(int world_rank, int world_size) {
  const char* allow = env("NTPBENCH_ALLOW_ANY_LAUNCHER");
  if (allow != nullptr && std::string(allow) != "0") return 0;
  const std::string why = launcher_mismatch(world_size);
  if (why.empty()) return 0;
  // Where each process is a world of its own, the launcher's numbering picks the one that speaks.
  const char* launched_rank = env("OMPI_COMM_WORLD_RANK");
  if ((launched_rank != nullptr ? std::atoi(launched_rank) : world_rank) == 0) {
    // The venv's Open MPI 5 (`make`) or Debian's 4.1 (`make MPI=system`): the other build is the other way out.
    const char* other = kBuiltMajor >= 5 ? " (`source env.sh` puts it first on PATH), or use a build against that "
                                           "launcher's MPI (`make MPI=system` for Debian's: build-system/ntpbench)"
                                         : "";
    std::fprintf(stderr,
                 "ntpbench: error: %s. Launch it with %s%s. NTPBENCH_ALLOW_ANY_LAUNCHER=1 runs it under this "
                 "launcher anyway.\n",
                 why.c_str(), NTPBENCH_MPIEXEC, other);
    std::fflush(stderr);
  }
  return code(ExitCode::BadInput);
}

bool started_by_launcher() {
  // Open MPI's mpirun (OMPI_COMM_WORLD_RANK), a PMIx launcher (PMIX_RANK: srun --mpi=pmix), PMI-2 (PMI_RANK).
  return env("OMPI_COMM_WORLD_RANK") != nullptr || env("PMIX_RANK") != nullptr || env("PMI_RANK") != nullptr;
}

}  // namespace ntp
