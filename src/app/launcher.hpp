#pragma once
// Is this job running under a launcher of the MPI ntpbench was built against? Debian's Open MPI
// 4.1 `mpirun`, first on PATH, starts an Open MPI 5 build without a word: the ranks form their
// world, but a step of `tiny` on 8 ranks took 0.2-2 s instead of 7 ms, and `--with-ft ulfm` is refused.

namespace ntp {

// Returns 0 when the launcher belongs to the MPI this binary was built against, or cannot be told
// (none, srun, another MPI's). Otherwise 2, after one message naming the right mpirun, printed by
// the process the launcher numbered 0 alone. NTPBENCH_ALLOW_ANY_LAUNCHER=1 skips the check.
int check_launcher(int world_rank, int world_size);

// Whether a launcher (mpirun, srun) started this process: its rank in the environment. A process
// run on its own is a job of one rank.
bool started_by_launcher();

}  // namespace ntp
