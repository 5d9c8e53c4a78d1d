#pragma once
// How a process that took part in a repair leaves the job: without MPI_Finalize, which Open MPI
// 5.0.11 can wait in for ever once processes of the job have died and others were spawned, but as
// a finalized client of its launcher. Shared by ntpbench (finish_mpi) and bench/ulfm_respawn_cost,
// which measures the library alone and so links nothing else of ntpbench. Header-only for that.
#include <dlfcn.h>

#include <cstddef>
#include <cstdio>

namespace ntp {

// Leaves PMIx (Open MPI's link to its launcher) and flushes the C streams; the caller then
// _Exits. Without PMIx_Finalize the launcher's writes to processes that had exited raised SIGPIPE,
// of which PRRTE's prterun takes ten and then aborts with exit status 1 after a complete run: seen
// from 64 ranks up with a revival (docs/cluster.md). Found by name: Open MPI links PMIx in.
inline void leave_launcher() {
  if (auto pmix_finalize = reinterpret_cast<int (*)(const void*, std::size_t)>(dlsym(RTLD_DEFAULT, "PMIx_Finalize")))
    pmix_finalize(nullptr, 0);
  std::fflush(nullptr);
}

}  // namespace ntp
