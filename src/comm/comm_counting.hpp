#pragma once
// The control plane's traffic, counted: a layer over the run's group (Membership) that counts the
// calls made on that group and the payload bytes each moves for this rank: the recorder's report
// gather, the commit vote, the step's checks, the straggler exchange, a repair's agreement. The
// training's own traffic (tensor, data and pipeline parallel) runs on groups split from it, which
// come back uncounted: those are the data plane, charged elsewhere (paced links, /ranks).
//
// Bytes are what this rank hands to a call plus what it gets back, as the interface sees them
// (an allreduce of n floats: 8n; a gather at its root: every member's part); the messages an MPI
// algorithm makes of a call on the wire (a tree's log n hops, say) are the library's, not counted.
#include <memory>
#include <string>
#include <vector>

#include "comm_forwarding.hpp"

namespace ntp {

struct CommTally {
  long long calls = 0;
  double bytes = 0;
};

class CountingComm final : public ForwardingComm {
 public:
  // Counts into `tally` the calls made on `group` through this layer (both must outlive it).
  CountingComm(Comm& group, std::shared_ptr<CommTally> tally) : ForwardingComm(group), tally_(std::move(tally)) {}

  void allreduce_sum(float* buf, std::size_t n) override {
    count(2.0 * n * sizeof *buf);
    inner_->allreduce_sum(buf, n);
  }
  void allreduce_sum(double* buf, std::size_t n) override {
    count(2.0 * n * sizeof *buf);
    inner_->allreduce_sum(buf, n);
  }
  void allreduce_max(float* buf, std::size_t n) override {
    count(2.0 * n * sizeof *buf);
    inner_->allreduce_max(buf, n);
  }
  void allreduce_max(double* buf, std::size_t n) override {
    count(2.0 * n * sizeof *buf);
    inner_->allreduce_max(buf, n);
  }
  void broadcast(void* buf, std::size_t bytes, int root) override;
  std::vector<int> allgather(int value) override;
  void gather(const double* send, std::size_t n, double* recv, int root) override;
  std::vector<std::string> gather(const std::string& s, int root) override;
  void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                 float* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) override;
  std::unique_ptr<CommRequest> ialltoallv(const float* send, const std::vector<int>& send_counts,
                                          const std::vector<int>& send_displs, float* recv,
                                          const std::vector<int>& recv_counts,
                                          const std::vector<int>& recv_displs) override;
  void barrier() override {
    count(0);
    inner_->barrier();
  }
  std::string post(const std::string& message, int root) override;
  void sendrecv(const float* send, std::size_t n_send, int dest, float* recv, std::size_t n_recv, int src) override;
  bool agree(bool ok) override {
    count(2.0 * sizeof(int));
    return inner_->agree(ok);
  }

 protected:
  // Groups split from the run's group are the training's: not counted.
  std::unique_ptr<Comm> wrap(std::unique_ptr<Comm> inner) override { return inner; }

 private:
  void count(double bytes) { ++tally_->calls, tally_->bytes += bytes; }

  std::shared_ptr<CommTally> tally_;
};

}  // namespace ntp
