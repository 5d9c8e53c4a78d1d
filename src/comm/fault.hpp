#pragma once
// Peer failures as the MPI reports them. With ULFM (Open MPI >= 5, launched with
// `mpirun --with-ft ulfm`) a call that involves a dead process, or runs on a communicator another
// rank has revoked, returns an error instead of hanging or aborting the job; the Comm seam turns
// it into PeerFailure, and the survivors repair with Comm::revoke / agree / shrink.
#include <stdexcept>
#include <string>

namespace ntp {

// Thrown by any Comm call that failed because a member process died (MPIX_ERR_PROC_FAILED) or the
// communicator was revoked (MPIX_ERR_REVOKED).
struct PeerFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Built against an MPI with ULFM.
bool ulfm_compiled();
// ... and this job was launched with fault tolerance on (mpirun --with-ft ulfm), so a dead rank
// is reported to the survivors rather than ending the job. MPI must be initialised.
bool ulfm_enabled();
// Why --kill-mode signal is not available here (empty when it is).
std::string ulfm_unavailable_reason();
// Before MPI_Init: a write to the socket of a peer that has just died fails (EPIPE), and the
// transport reports the peer failed, instead of SIGPIPE ending this process without a word. Open
// MPI 5.0's TCP transport leaves SIGPIPE at its default: a survivor whose revoke broadcast
// (MPIX_Comm_agree) wrote to a rank killed a moment before died with it, silently, and the run
// lost a second rank nothing had scheduled (`make chaos`, seeds 150, 158 and 198).
void ignore_broken_links();
// An error this process cannot recover from, under ULFM: revokes the launcher's world (peers
// blocked in a call on it, e.g. at start-up, then fail instead of waiting for this process) and
// ends the process with `code`. Peers that have moved to shrunk groups see it as a failed rank.
[[noreturn]] void leave_job(int code);

}  // namespace ntp
