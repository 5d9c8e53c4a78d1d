#include "comm_staged.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "comm_forwarding.hpp"

namespace ntp {

namespace {

class HostStagedComm final : public ForwardingComm {
 public:
  HostStagedComm(std::unique_ptr<Comm> inner, Backend& be) : ForwardingComm(std::move(inner)), be_(be) {}

  void allreduce_sum(float* buf, std::size_t n) override {
    staged(buf, n, [&](float* h) { inner_->allreduce_sum(h, n); });
  }
  void allreduce_max(float* buf, std::size_t n) override {
    staged(buf, n, [&](float* h) { inner_->allreduce_max(h, n); });
  }
  // Doubles are host values in the engine (norm partials, timings).
  void allreduce_sum(double* buf, std::size_t n) override { inner_->allreduce_sum(host_only(buf), n); }
  void allreduce_max(double* buf, std::size_t n) override { inner_->allreduce_max(host_only(buf), n); }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    if (!be_.is_device_memory(buf)) return inner_->broadcast(buf, bytes, root);
    if (bytes % sizeof(float) != 0) throw std::invalid_argument("staged broadcast: device buffer not whole floats");
    staged(static_cast<float*>(buf), bytes / sizeof(float), [&](float* h) { inner_->broadcast(h, bytes, root); });
  }
  using ForwardingComm::gather;
  void gather(const double* send, std::size_t n, double* recv, int root) override {
    inner_->gather(host_only(send), n, host_only(recv), root);
  }

  void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                 float* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) override {
    const bool send_dev = be_.is_device_memory(send), recv_dev = be_.is_device_memory(recv);
    if (!send_dev && !recv_dev)
      return inner_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
    auto extent = [&](const std::vector<int>& counts, const std::vector<int>& displs) {
      std::size_t n = 0;
      for (std::size_t p = 0; p < counts.size(); ++p) n = std::max(n, std::size_t(displs[p]) + counts[p]);
      return n;
    };
    const std::size_t ns = extent(send_counts, send_displs), nr = extent(recv_counts, recv_displs);
    std::vector<float> hs, hr;
    const float* s = send;
    float* r = recv;
    if (send_dev) {
      hs.resize(ns);
      be_.to_host(hs.data(), send, ns);
      s = hs.data();
    }
    if (recv_dev) {
      hr.resize(nr);
      r = hr.data();
    }
    inner_->alltoallv(s, send_counts, send_displs, r, recv_counts, recv_displs);
    // Only the received ranges: the gaps between them keep their device contents.
    if (recv_dev)
      for (std::size_t p = 0; p < recv_counts.size(); ++p)
        if (recv_counts[p] > 0) be_.from_host(recv + recv_displs[p], hr.data() + recv_displs[p], recv_counts[p]);
  }
  // Host buffers keep the inner communicator's nonblocking exchange; device ones are staged.
  std::unique_ptr<CommRequest> ialltoallv(const float* send, const std::vector<int>& send_counts,
                                          const std::vector<int>& send_displs, float* recv,
                                          const std::vector<int>& recv_counts,
                                          const std::vector<int>& recv_displs) override {
    if (!be_.is_device_memory(send) && !be_.is_device_memory(recv))
      return inner_->ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
    return Comm::ialltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
  }
  void sendrecv(const float* send, std::size_t n_send, int dest, float* recv, std::size_t n_recv,
                int src) override {
    std::vector<float> hs, hr;
    const float* s = send;
    float* r = recv;
    if (dest >= 0 && be_.is_device_memory(send)) {
      hs.resize(n_send);
      be_.to_host(hs.data(), send, n_send);
      s = hs.data();
    }
    const bool recv_dev = src >= 0 && be_.is_device_memory(recv);
    if (recv_dev) hr.resize(n_recv), r = hr.data();
    inner_->sendrecv(s, n_send, dest, r, n_recv, src);
    if (recv_dev) be_.from_host(recv, hr.data(), n_recv);
  }

 private:
  std::unique_ptr<Comm> wrap(std::unique_ptr<Comm> inner) override {
    return std::make_unique<HostStagedComm>(std::move(inner), be_);
  }

  template <typename F>
  void staged(float* buf, std::size_t n, F&& op) {
    if (!be_.is_device_memory(buf)) return op(buf);
    host_.resize(n);
    be_.to_host(host_.data(), buf, n);
    op(host_.data());
    be_.from_host(buf, host_.data(), n);
  }
  template <typename T>
  T* host_only(T* p) const {
    if (be_.is_device_memory(p)) throw std::invalid_argument("staged communicator: doubles must be in host memory");
    return p;
  }

  Backend& be_;
  std::vector<float> host_;
};

}  // namespace

std::unique_ptr<Comm> make_host_staged_comm(std::unique_ptr<Comm> inner, Backend& be) {
  return std::make_unique<HostStagedComm>(std::move(inner), be);
}

}  // namespace ntp
