#include "comm_counting.hpp"

#include <numeric>

namespace ntp {

namespace {
double floats(const std::vector<int>& counts) {
  return double(std::accumulate(counts.begin(), counts.end(), 0LL)) * sizeof(float);
}
}  // namespace

void CountingComm::broadcast(void* buf, std::size_t bytes, int root) {
  // The root sends, the others receive: `bytes` either way (the root's copies to each member are
  // the algorithm's).
  count(double(bytes));
  inner_->broadcast(buf, bytes, root);
}

std::vector<int> CountingComm::allgather(int value) {
  count(double(sizeof value) * (1 + size()));
  return inner_->allgather(value);
}

void CountingComm::gather(const double* send, std::size_t n, double* recv, int root) {
  count(double(n * sizeof *send) * (rank() == root ? size() : 1));
  inner_->gather(send, n, recv, root);
}

std::vector<std::string> CountingComm::gather(const std::string& s, int root) {
  std::vector<std::string> all = inner_->gather(s, root);
  double bytes = double(s.size());
  for (const std::string& part : all) bytes += double(part.size());
  count(bytes);
  return all;
}

void CountingComm::alltoallv(const float* send, const std::vector<int>& send_counts,
                             const std::vector<int>& send_displs, float* recv, const std::vector<int>& recv_counts,
                             const std::vector<int>& recv_displs) {
  count(floats(send_counts) + floats(recv_counts));
  inner_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

std::unique_ptr<CommRequest> CountingComm::ialltoallv(const float* send, const std::vector<int>& send_counts,
                                                      const std::vector<int>& send_displs, float* recv,
                                                      const std::vector<int>& recv_counts,
                                                      const std::vector<int>& recv_displs) {
  count(floats(send_counts) + floats(recv_counts));
  return inner_->ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

std::string CountingComm::post(const std::string& message, int root) {
  // Point to point from the root to every member: the root sends it size() - 1 times.
  std::string got = inner_->post(message, root);
  count(double(got.size()) * (rank() == root ? size() - 1 : 1));
  return got;
}

void CountingComm::sendrecv(const float* send, std::size_t n_send, int dest, float* recv, std::size_t n_recv,
                            int src) {
  count(double((dest >= 0 ? n_send : 0) + (src >= 0 ? n_recv : 0)) * sizeof(float));
  inner_->sendrecv(send, n_send, dest, recv, n_recv, src);
}

}  // namespace ntp
