#pragma once
// The MPI implementation of the communication seam, for other implementations (NCCL) to reuse
// for host buffers and host-only calls.
#include <mpi.h>

#include <memory>

#include "comm.hpp"

namespace ntp {

// A Comm over `comm`; frees it on destruction when `owned`.
std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, bool owned);

}  // namespace ntp
