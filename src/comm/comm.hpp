#pragma once
// The communication seam. Model, reshard and training code talk to a group of ranks only through
// this interface; MpiComm implements it today, an NCCL implementation can sit beside it later.
#include <cstddef>
#include <memory>
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

  // Sub-group of the ranks passing the same colour, ordered by key; nullptr for colour < 0.
  virtual std::unique_ptr<Comm> split(int color, int key) = 0;
  // Sub-group of this group's ranks that share this rank's node (collective over the group).
  virtual std::unique_ptr<Comm> split_node() = 0;
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

// The whole job (MPI_COMM_WORLD). MPI must be initialised.
std::unique_ptr<Comm> world_comm();
// Ranks on this node (MPI_COMM_TYPE_SHARED).
std::unique_ptr<Comm> node_comm();
std::string mpi_library_version();
std::string host_name();

}  // namespace ntp
