// NCCL implementation of the communication seam; see comm_nccl.hpp for the rules.
#include "comm_nccl.hpp"

#include "comm_mpi.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace ntp {

namespace {

void mpi_check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw std::runtime_error(std::string("MPI error in ") + what);
}
void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("CUDA error in ") + what + ": " + cudaGetErrorName(e) + ": " +
                             cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string("NCCL error in ") + what + ": " + ncclGetErrorString(r));
}

template <typename T>
ncclDataType_t nccl_type();
template <>
ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <>
ncclDataType_t nccl_type<double>() { return ncclFloat64; }

// Device (or managed) memory: NCCL can use it. Plain host memory goes through MPI.
bool is_device(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

class NcclComm final : public Comm {
 public:
  // Takes ownership of `comm` (freed in the destructor). The NCCL communicator is made on first
  // use with a device buffer (see nccl()), so a group used only for host data (or only to learn
  // node-local ranks before the GPU is chosen: split_node()) never touches the GPU.
  explicit NcclComm(MPI_Comm comm) : comm_(comm), host_(make_mpi_comm(comm, false)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  ~NcclComm() override {
    // No throwing from a destructor: report and carry on.
    if (nccl_) report(ncclCommDestroy(nccl_));
    if (stream_) cudaStreamDestroy(stream_);
    MPI_Comm_free(&comm_);
  }

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Host buffers and host-only calls go to the MPI communicator over the same group.
  void allreduce_sum(float* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclSum)) host_->allreduce_sum(buf, n);
  }
  void allreduce_sum(double* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclSum)) host_->allreduce_sum(buf, n);
  }
  void allreduce_max(float* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclMax)) host_->allreduce_max(buf, n);
  }
  void allreduce_max(double* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclMax)) host_->allreduce_max(buf, n);
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    if (size_ == 1 || bytes == 0) return;
    if (is_device(buf)) {
      ncclComm_t c = nccl();
      begin();
      nccl_check(ncclBroadcast(buf, buf, bytes, ncclUint8, root, c, stream_), "ncclBroadcast");
      end();
      return;
    }
    host_->broadcast(buf, bytes, root);
  }

  std::vector<int> allgather(int value) override { return host_->allgather(value); }
  void gather(const double* send, std::size_t n, double* recv, int root) override {
    host_->gather(send, n, recv, root);
  }
  std::vector<std::string> gather(const std::string& s, int root) override { return host_->gather(s, root); }

  // Grouped ncclSend/ncclRecv when the buffers are on the device; MPI_Alltoallv when on the
  // host. A rank with nothing to move cannot tell from its pointers, so the group agrees first.
  void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                 float* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) override {
    long stotal = 0, rtotal = 0;
    for (int p = 0; p < size_; ++p) stotal += send_counts[p], rtotal += recv_counts[p];
    const bool send_dev = is_device(send), recv_dev = is_device(recv);
    int kind = (stotal > 0 && send_dev) || (rtotal > 0 && recv_dev) ? 2 : (stotal > 0 || rtotal > 0) ? 1 : 0;
    mpi_check(MPI_Allreduce(MPI_IN_PLACE, &kind, 1, MPI_INT, MPI_MAX, comm_), "MPI_Allreduce(alltoallv kind)");
    if (kind < 2) return host_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
    if ((stotal > 0 && !send_dev) || (rtotal > 0 && !recv_dev))
      throw std::invalid_argument("NCCL alltoallv: host and device buffers mixed across the group");
    ncclComm_t c = nccl();
    begin();
    if (send_counts[rank_] > 0)
      cuda_check(cudaMemcpyAsync(recv + recv_displs[rank_], send + send_displs[rank_],
                                 std::size_t(send_counts[rank_]) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                 "cudaMemcpyAsync");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      if (send_counts[p] > 0)
        nccl_check(ncclSend(send + send_displs[p], std::size_t(send_counts[p]), ncclFloat32, p, c, stream_),
                   "ncclSend");
      if (recv_counts[p] > 0)
        nccl_check(ncclRecv(recv + recv_displs[p], std::size_t(recv_counts[p]), ncclFloat32, p, c, stream_),
                   "ncclRecv");
    }
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    end();
  }

  // Host-side: this rank's queued GPU work is finished, then an MPI barrier (waited for politely,
  // as comm_mpi.cpp does). Not an NCCL all-reduce: that would make an NCCL communicator for every
  // group that only ever synchronises (the whole job, node groups).
  void barrier() override {
    if (nccl_) begin();
    if (size_ > 1) host_->barrier();
  }

  std::unique_ptr<Comm> split_node() override {
    MPI_Comm node;
    mpi_check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    return std::make_unique<NcclComm>(node);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm sub;
    mpi_check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split");
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<NcclComm>(sub);
  }

 private:
  static void report(ncclResult_t r) {
    if (r != ncclSuccess) std::fprintf(stderr, "ntpbench: warning: ncclCommDestroy: %s\n", ncclGetErrorString(r));
  }

  // The NCCL communicator, made on first use: rank 0 gets a unique id, MPI_Bcast hands it to the
  // group, every member calls ncclCommInitRank on its current GPU. Every rank of the group gets
  // here in the same collective call (the first one on a device buffer), so this is collective too.
  ncclComm_t nccl() {
    if (nccl_) return nccl_;
    ncclUniqueId id{};
    if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    mpi_check(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm_), "MPI_Bcast(ncclUniqueId)");
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    nccl_check(ncclCommInitRank(&nccl_, size_, id, rank_), "ncclCommInitRank");
    return nccl_;
  }

  // Before an NCCL call: every kernel queued so far (on any stream: the backend's included) has
  // finished writing the buffers. After it: the operation is complete, as the seam promises.
  void begin() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  void end() { cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  // NCCL all-reduce of a device buffer; false (nothing done) for a host buffer.
  template <typename T>
  bool device_allreduce(T* buf, std::size_t n, ncclRedOp_t op) {
    if (size_ == 1 || n == 0) return true;
    if (!is_device(buf)) return false;
    ncclComm_t c = nccl();
    begin();
    nccl_check(ncclAllReduce(buf, buf, n, nccl_type<T>(), op, c, stream_), "ncclAllReduce");
    end();
    return true;
  }

  MPI_Comm comm_;
  std::unique_ptr<Comm> host_;  // MPI over comm_ (not owning it)
  int rank_ = 0, size_ = 1;
  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm) {
  MPI_Comm dup;
  mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  return std::make_unique<NcclComm>(dup);
}

}  // namespace ntp
