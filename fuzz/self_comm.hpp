#pragma once
// A group of one rank without MPI: every collective is the identity. Enough for a model at TP 1
// (the checkpoint loader's), so the fuzz targets need no MPI.
#include <algorithm>
#include <cstring>

#include "comm.hpp"

namespace ntp::fuzz {

class SelfComm final : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allreduce_sum(float*, std::size_t) override {}
  void allreduce_sum(double*, std::size_t) override {}
  void allreduce_max(float*, std::size_t) override {}
  void allreduce_max(double*, std::size_t) override {}
  void broadcast(void*, std::size_t, int) override {}
  std::vector<int> allgather(int value) override { return {value}; }
  void gather(const double* send, std::size_t n, double* recv, int) override { std::copy_n(send, n, recv); }
  std::vector<std::string> gather(const std::string& s, int) override { return {s}; }
  void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                 float* recv, const std::vector<int>&, const std::vector<int>& recv_displs) override {
    std::copy_n(send + send_displs[0], send_counts[0], recv + recv_displs[0]);
  }
  void sendrecv(const float*, std::size_t, int dest, float*, std::size_t, int src) override {
    if (dest >= 0 || src >= 0) throw std::logic_error("a one-rank group has no pipeline neighbour");
  }
  void barrier() override {}
  std::unique_ptr<Comm> split(int color, int) override {
    return color < 0 ? nullptr : std::make_unique<SelfComm>();
  }
  std::unique_ptr<Comm> split_node() override { return std::make_unique<SelfComm>(); }
};

}  // namespace ntp::fuzz
