#pragma once
// NCCL implementation of the communication seam, for ranks that each own one GPU.
//
// Collectives on device buffers (allreduce, broadcast, alltoallv) run on NCCL; buffers in host
// memory (the engine's small host-side reductions, names, metrics), the host-only calls
// (allgather, both gathers) and barrier go through MPI on the same group. Every rank of a group
// must pass the same kind of buffer to a call (alltoallv agrees on it first, since a rank with
// nothing to move cannot tell). Every call is blocking, as the seam promises: it first waits for
// all work queued on the device (so the backend's kernels that produced the buffer are done),
// then queues the NCCL operation on the communicator's own stream and waits for it.
//
// The NCCL communicator is bootstrapped from the MPI communicator on its first device-buffer call
// (a collective, so every member gets there together): rank 0 calls ncclGetUniqueId, MPI_Bcast
// hands the id to the group, every member calls ncclCommInitRank on its current GPU. Groups used
// only for host data never make one. split() and split_node() build an MPI sub-communicator and
// a new NcclComm on it, so every TP group, DP sync slot and reshard group gets its own NCCL
// communicator; the destructor calls ncclCommDestroy and frees the MPI communicator (a killed
// rank's communicators are destroyed, not leaked).
//
// Failures (with ULFM under the MPI group): NCCL cannot repair a communicator with a dead member.
// NCCL communicators are non-blocking, and every wait for one (its set-up, an operation's host
// part, its stream) polls the MPI group: once a member has died or the group is revoked, the NCCL
// communicator is aborted (ncclCommAbort) and the call throws PeerFailure, as an MPI call would.
// revoke() aborts it too; shrink() and spawn() repair the MPI group and return a new NcclComm on
// it, whose NCCL communicator is made again from the new group on first use.
//
// Preconditions: by the first device-buffer call the rank's GPU is current (the CUDA backend calls
// cudaSetDevice when it is made), and every rank of the group uses a different GPU. NCCL refuses
// two ranks on one GPU: when ranks share a GPU (--allow-gpu-sharing), the engine must use the MPI
// communicator (world_comm()) with host staging of device buffers instead of this one.
#include <mpi.h>

#include <memory>

#include "comm.hpp"

namespace ntp {

// A communicator over the ranks of `comm` (which is duplicated; the caller keeps its own).
// Collective over `comm`.
std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm);

}  // namespace ntp
