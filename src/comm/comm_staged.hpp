#pragma once
// Host staging for a communicator that cannot take device pointers: ranks sharing a GPU (NCCL
// refuses two ranks on one device) talk through MPI, and Debian's Open MPI is not CUDA-aware.
// A collective on a buffer in the backend's device memory copies it to a host buffer, runs the
// inner (MPI) call there and copies the result back; host buffers pass straight through. Slower
// than NCCL by two PCIe copies per call, but correct on any MPI.
#include <memory>

#include "backend.hpp"
#include "comm.hpp"

namespace ntp {

// `be` must outlive the result and every communicator split from it.
std::unique_ptr<Comm> make_host_staged_comm(std::unique_ptr<Comm> inner, Backend& be);

}  // namespace ntp
