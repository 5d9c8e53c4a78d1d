// GoogleTest main for tests that run under mpiexec: initialises MPI, lets only rank 0 print (every
// rank with NTPBENCH_TEST_ALL_RANKS=1, to see a failure that only other ranks hit), and makes the
// job exit non-zero when any rank failed (rank 0 reports it: ntp::finish_mpi).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>

#include "comm.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (rank != 0 && !std::getenv("NTPBENCH_TEST_ALL_RANKS")) delete listeners.Release(listeners.default_result_printer());
  int failed = RUN_ALL_TESTS() != 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (failed && rank != 0) std::fprintf(stderr, "[rank %d] tests FAILED on this rank\n", rank);
  return ntp::finish_mpi(any_failed);
}
