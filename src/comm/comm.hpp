#pragma once
// The communication seam. Model, reshard and training code talk to a group of ranks only through
// this interface: MPI (comm_mpi.cpp), NCCL for device buffers (comm_nccl.cpp), and host staging
// of device buffers over MPI (comm_staged.cpp) implement it.
#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace ntp {

// A nonblocking operation in flight. Its buffers must stay untouched until it completes;
// destroying an unfinished request waits for it.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Progresses the operation; true once it has completed.
  virtual bool test() = 0;
  virtual void wait() = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  virtual void allreduce_sum(float* buf, std::size_t n) = 0;
  virtual void allreduce_sum(double* buf, std::size_t n) = 0;
  virtual void allreduce_max(float* buf, std::size_t n) = 0;
  virtual void allreduce_max(double* buf, std::size_t n) = 0;
  virtual void broadcast(void* buf, std::size_t bytes, int root) = 0;
  // Gathers one int from every rank (e.g. counts), in rank order.
  virtual std::vector<int> allgather(int value) = 0;
  // Gathers n doubles from every rank to root (recv holds size()*n on root; ignored elsewhere).
  virtual void gather(const double* send, std::size_t n, double* recv, int root) = 0;
  // Gathers one short string (up to 255 bytes) from every rank to root; empty elsewhere.
  virtual std::vector<std::string> gather(const std::string& s, int root) = 0;
  // Personalised exchange of floats: send_counts[r] floats from send + send_displs[r] go to rank r.
  virtual void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                         float* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) = 0;
  // The same exchange, started and left in flight (the NTP sync overlaps its regroups with the
  // backward pass this way). This default runs the blocking call and returns a finished request;
  // implementations with real nonblocking exchanges override it.
  virtual std::unique_ptr<CommRequest> ialltoallv(const float* send, const std::vector<int>& send_counts,
                                                  const std::vector<int>& send_displs, float* recv,
                                                  const std::vector<int>& recv_counts,
                                                  const std::vector<int>& recv_displs);
  virtual void barrier() = 0;
  // `message` from `root` to every member by point-to-point messages; returns it on every member.
  // The others wait in a receive that yields the core (a spare waits in one for a whole run), and
  // no collective algorithm is involved, none of the hidden sub-groups a hierarchical one makes
  // behind a call: revoke() and a member's death end the wait everywhere. Default: broadcast.
  virtual std::string post(const std::string& message, int root);
  // Pipeline transfer: sends n_send floats to rank `dest` and receives n_recv from rank `src` at
  // once (either side may be absent: -1). Both directions in one call, as Megatron batches its
  // isend/irecv: in 1F1B's steady state neighbours send to each other at the same time, and two
  // blocking sends would wait for each other.
  virtual void sendrecv(const float* send, std::size_t n_send, int dest, float* recv, std::size_t n_recv,
                        int src) = 0;

  // Sub-group of the ranks passing the same colour, ordered by key; nullptr for colour < 0.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
  // Sub-group of this group's ranks that share this rank's node (collective over the group).
  virtual std::unique_ptr<Comm> split_node() = 0;

  // Fault tolerance (fault.hpp; ULFM). A group that has none throws std::logic_error.
  // revoke: every pending and future call on this group, on every member, fails with PeerFailure
  // (local, not collective). agree: true when every live member passed ok and no member has died;
  // uniform (every survivor gets the same answer) and usable on a revoked group. shrink: the live
  // members, in the same order, as a new group (collective over the survivors).
  // peer_failed: true once this group is revoked or the MPI knows one of its members died; local,
  // never blocks (it drives the MPI's progress, so a rank waiting outside MPI, e.g. on a GPU
  // stream, learns of a death by polling it); false for a group without fault tolerance.
  virtual void revoke();
  virtual bool agree(bool ok);
  virtual bool peer_failed() { return false; }
  virtual std::unique_ptr<Comm> shrink();
  // Starts `count` new processes of `command args` and returns this group with them appended
  // (collective; the new processes join with join_parent()). `hosts`, when given, lists the hosts
  // to start them on (MPI_Info "host", the launcher's --host syntax: a name repeated per process).
  virtual std::unique_ptr<Comm> spawn(const std::string& command, const std::vector<std::string>& args, int count,
                                      const std::vector<std::string>& hosts = {});
};

inline std::unique_ptr<CommRequest> Comm::ialltoallv(const float* send, const std::vector<int>& send_counts,
                                                    const std::vector<int>& send_displs, float* recv,
                                                    const std::vector<int>& recv_counts,
                                                    const std::vector<int>& recv_displs) {
  struct Finished final : CommRequest {
    bool test() override { return true; }
    void wait() override {}
  };
  alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  return std::make_unique<Finished>();
}

inline std::string Comm::post(const std::string& message, int root) {
  long long n = static_cast<long long>(message.size());
  broadcast(&n, sizeof n, root);
  std::string s = rank() == root ? message : std::string(static_cast<std::size_t>(n), '\0');
  broadcast(s.data(), s.size(), root);
  return s;
}

inline void Comm::revoke() { throw std::logic_error("this communicator has no fault tolerance"); }
inline bool Comm::agree(bool) { throw std::logic_error("this communicator has no fault tolerance"); }
inline std::unique_ptr<Comm> Comm::shrink() { throw std::logic_error("this communicator has no fault tolerance"); }
inline std::unique_ptr<Comm> Comm::spawn(const std::string&, const std::vector<std::string>&, int,
                                         const std::vector<std::string>&) {
  throw std::logic_error("this communicator cannot spawn processes");
}

// The whole job (MPI_COMM_WORLD). MPI must be initialised.
std::unique_ptr<Comm> world_comm();
// Under ULFM (a fault-tolerant job): every pair of the job's processes exchanges a message, so a
// later death cannot leave a survivor looking up the dead one's address for ever (comm_mpi.cpp,
// connect_every_pair; spawn() and join_parent() do the same for the group they make). Collective
// over MPI_COMM_WORLD; nothing without ULFM.
void connect_world();
// In a process started by Comm::spawn: the parents' group with the new processes appended (as
// the parents' spawn() returns it); nullptr in a process started by the launcher.
std::unique_ptr<Comm> join_parent();
// Ends MPI in this process and returns its exit status. One process carries a job's non-zero
// verdict, the others exit 0: Open MPI's launcher can hang when every process exits non-zero
// (comm_mpi.cpp has the figures). After MPI_Finalize `code` is the verdict every rank reached
// alike, and world rank 0 alone exits with it. A process that took part in a repair (a shrink, a
// spawn, or its start as a replacement) _Exit(code)s instead, so there the caller passes the
// verdict on one process only (TrainingRun::train: the recorder) and every live process must have
// passed a last barrier. Call once every Comm derived from the world is gone.
int finish_mpi(int code);
// Ranks on this node (MPI_COMM_TYPE_SHARED).
std::unique_ptr<Comm> node_comm();
std::string mpi_library_version();
std::string host_name();

}  // namespace ntp
