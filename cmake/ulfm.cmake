# Does the MPI have ULFM (User-Level Failure Mitigation: MPIX_Comm_revoke/shrink/agree in
# mpi-ext.h)? Open MPI >= 5 does; Debian's 4.1 does not. Sets NTPBENCH_HAVE_ULFM (cached, so the
# tests can read it from CMakeCache.txt) and, where it is on, MPIEXEC_PREFLAGS gains
# `--with-ft ulfm` (a job launched without it is aborted by the launcher when a rank dies).
include(CheckCXXSourceCompiles)
set(CMAKE_REQUIRED_LIBRARIES MPI::MPI_CXX)
check_cxx_source_compiles([=[
#include <mpi.h>
#include <mpi-ext.h>
#if !defined(OMPI_HAVE_MPI_EXT_FTMPI) || !OMPI_HAVE_MPI_EXT_FTMPI
#error "no ULFM"
#endif
int main() {
  MPI_Comm c;
  MPIX_Comm_revoke(MPI_COMM_WORLD);
  MPIX_Comm_shrink(MPI_COMM_WORLD, &c);
  int flag = 1;
  return MPIX_Comm_agree(MPI_COMM_WORLD, &flag);
}
]=] NTPBENCH_HAVE_ULFM)
unset(CMAKE_REQUIRED_LIBRARIES)
if(NTPBENCH_HAVE_ULFM)
  message(STATUS "MPI fault tolerance: ULFM (kill mode signal available; launch with mpirun --with-ft ulfm)")
  set(MPIEXEC_PREFLAGS ${MPIEXEC_PREFLAGS} --with-ft ulfm)
else()
  message(STATUS "MPI fault tolerance: none (kill mode fence only)")
endif()
