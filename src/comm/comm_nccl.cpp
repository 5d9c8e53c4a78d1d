// NCCL implementation of the communication seam; see comm_nccl.hpp for the rules.
#include "comm_nccl.hpp"

#include "comm_forwarding.hpp"
#include "comm_mpi.hpp"
#include "cuda_pointer.hpp"
#include "fault.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

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


class NcclComm final : public ForwardingComm {
 public:
  // Over the group `host` (an MPI communicator, owned: inner_). The NCCL communicator is made on first use
  // with a device buffer (see nccl()), so a group used only for host data (or only to learn
  // node-local ranks before the GPU is chosen: split_node()) never touches the GPU.
  explicit NcclComm(std::unique_ptr<Comm> host) : ForwardingComm(std::move(host)) {}

  ~NcclComm() override {
    // No throwing from a destructor: report and carry on. A communicator that saw a failure is
    // aborted (destroying it would wait for peers that are gone).
    if (nccl_) report(broken_ ? ncclCommAbort(nccl_) : ncclCommDestroy(nccl_));
    if (stream_) cudaStreamDestroy(stream_);
  }

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Host buffers and host-only calls (the gathers, from ForwardingComm) go to the MPI
  // communicator over the same group.
  void allreduce_sum(float* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclSum)) inner_->allreduce_sum(buf, n);
  }
  void allreduce_sum(double* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclSum)) inner_->allreduce_sum(buf, n);
  }
  void allreduce_max(float* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclMax)) inner_->allreduce_max(buf, n);
  }
  void allreduce_max(double* buf, std::size_t n) override {
    if (!device_allreduce(buf, n, ncclMax)) inner_->allreduce_max(buf, n);
  }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    if (size() == 1 || bytes == 0) return;
    if (!is_device_pointer(buf)) return inner_->broadcast(buf, bytes, root);
    ncclComm_t c = nccl();
    begin();
    settle(ncclBroadcast(buf, buf, bytes, ncclUint8, root, c, stream_), "ncclBroadcast");
    end();
  }

  // Grouped ncclSend/ncclRecv when the buffers are on the device; MPI_Alltoallv when on the
  // host. A rank with nothing to move cannot tell from its pointers, so the group agrees first.
  void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                 float* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) override {
    long stotal = 0, rtotal = 0;
    for (int p = 0; p < size(); ++p) stotal += send_counts[p], rtotal += recv_counts[p];
    const bool send_dev = is_device_pointer(send), recv_dev = is_device_pointer(recv);
    double kind = (stotal > 0 && send_dev) || (rtotal > 0 && recv_dev) ? 2 : (stotal > 0 || rtotal > 0) ? 1 : 0;
    inner_->allreduce_max(&kind, 1);
    if (kind < 2) return inner_->alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);
    if ((stotal > 0 && !send_dev) || (rtotal > 0 && !recv_dev))
      throw std::invalid_argument("NCCL alltoallv: host and device buffers mixed across the group");
    ncclComm_t c = nccl();
    begin();
    const int me = rank();
    if (send_counts[me] > 0)
      cuda_check(cudaMemcpyAsync(recv + recv_displs[me], send + send_displs[me],
                                 std::size_t(send_counts[me]) * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                 "cudaMemcpyAsync");
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < size(); ++p) {
      if (p == me) continue;
      if (send_counts[p] > 0)
        settle(ncclSend(send + send_displs[p], std::size_t(send_counts[p]), ncclFloat32, p, c, stream_), "ncclSend");
      if (recv_counts[p] > 0)
        settle(ncclRecv(recv + recv_displs[p], std::size_t(recv_counts[p]), ncclFloat32, p, c, stream_), "ncclRecv");
    }
    settle(ncclGroupEnd(), "ncclGroupEnd");
    end();
  }

  // Grouped ncclSend/ncclRecv for device buffers (the pipeline's neighbours know each other's
  // buffer kind: the same tensors on every stage), MPI for host ones.
  void sendrecv(const float* send, std::size_t n_send, int dest, float* recv, std::size_t n_recv,
                int src) override {
    const bool dev = (dest >= 0 && is_device_pointer(send)) || (src >= 0 && is_device_pointer(recv));
    if (!dev) return inner_->sendrecv(send, n_send, dest, recv, n_recv, src);
    ncclComm_t c = nccl();
    begin();
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    if (dest >= 0) settle(ncclSend(send, n_send, ncclFloat32, dest, c, stream_), "ncclSend");
    if (src >= 0) settle(ncclRecv(recv, n_recv, ncclFloat32, src, c, stream_), "ncclRecv");
    settle(ncclGroupEnd(), "ncclGroupEnd");
    end();
  }

  // Host-side: this rank's queued GPU work is finished, then an MPI barrier (waited for politely,
  // as comm_mpi.cpp does). Not an NCCL all-reduce: that would make an NCCL communicator for every
  // group that only ever synchronises (the whole job, node groups).
  void barrier() override {
    if (nccl_) begin();
    if (size() > 1) inner_->barrier();
  }

  // Fault tolerance. An NCCL communicator with a dead member cannot be repaired: revoke aborts it
  // (ncclCommAbort also ends any NCCL operation still waiting for the dead peer) and revokes the
  // MPI group; shrink and spawn (ForwardingComm) repair the MPI group, and the NCCL communicator
  // over the new group is made again from it on its first device-buffer call. agree and
  // peer_failed are the MPI group's.
  void revoke() override {
    abort_nccl();
    ForwardingComm::revoke();
  }

 private:
  static void report(ncclResult_t r) {
    if (r != ncclSuccess) std::fprintf(stderr, "ntpbench: warning: ending an NCCL communicator: %s\n", ncclGetErrorString(r));
  }
  // split(), split_node(), shrink() and spawn() give a new MPI group: a new NcclComm over it.
  std::unique_ptr<Comm> wrap(std::unique_ptr<Comm> host) override {
    return std::make_unique<NcclComm>(std::move(host));
  }

  // The NCCL communicator, made on first use: rank 0 gets a unique id, the MPI group hands it
  // round, every member calls ncclCommInitRankConfig on its current GPU. Every rank of the group
  // gets here in the same collective call (the first one on a device buffer), so this is
  // collective too. Non-blocking (config.blocking = 0): no NCCL call waits inside NCCL for a
  // peer, so settle() and end() can watch the MPI group for deaths meanwhile.
  ncclComm_t nccl() {
    if (nccl_) return nccl_;
    if (broken_) throw PeerFailure("NCCL communicator aborted after a peer failure: shrink the group first");
    ncclUniqueId id{};
    if (rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    inner_->broadcast(&id, sizeof id, 0);
    if (!stream_) cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, size(), id, rank(), &config);
    nccl_ = c;
    settle(r, "ncclCommInitRankConfig");
    return nccl_;
  }

  // A non-blocking NCCL call returns ncclInProgress while its host-side part runs: wait for it to
  // finish, watching for a dead peer.
  void settle(ncclResult_t r, const char* what) {
    Watch watch(*this, what);
    while (r == ncclInProgress) {
      watch.poll();
      if (ncclCommGetAsyncError(nccl_, &r) != ncclSuccess) break;
    }
    if (r != ncclSuccess) fail(r, what);
  }

  // Before an NCCL call: every kernel queued so far (on any stream: the backend's included) has
  // finished writing the buffers. After it: the operation is complete, as the seam promises; a
  // peer that dies meanwhile ends the wait with PeerFailure instead of a hang.
  void begin() { cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }
  void end() {
    Watch watch(*this, "NCCL operation");
    for (;;) {
      const cudaError_t q = cudaStreamQuery(stream_);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) cuda_check(q, "cudaStreamQuery");
      ncclResult_t async = ncclSuccess;
      nccl_check(ncclCommGetAsyncError(nccl_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) fail(async, "NCCL operation");
      watch.poll();
    }
  }

  // The wait of one NCCL call: it spins for the first 200 us (a healthy collective is done by
  // then), then yields the core between polls; from then on it asks the MPI group about deaths
  // every millisecond. A death or a revocation aborts the NCCL communicator: PeerFailure.
  class Watch {
   public:
    Watch(NcclComm& c, const char* what) : comm_(c), what_(what), start_(clock::now()), next_(start_ + kSpin) {}
    void poll() {
      const auto now = clock::now();
      if (now < start_ + kSpin) return;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      if (now < next_) return;
      next_ = now + std::chrono::milliseconds(1);
      if (!comm_.inner_->peer_failed()) return;
      comm_.abort_nccl();
      throw PeerFailure(std::string(what_) + ": a peer process died (NCCL communicator aborted)");
    }

   private:
    using clock = std::chrono::steady_clock;
    static constexpr auto kSpin = std::chrono::microseconds(200);
    NcclComm& comm_;
    const char* what_;
    clock::time_point start_, next_;
  };

  // An NCCL error: a peer failure if the MPI group knows of one, else a plain error.
  [[noreturn]] void fail(ncclResult_t r, const char* what) {
    const bool peer = inner_->peer_failed();
    abort_nccl();
    const std::string msg = std::string(what) + ": " + ncclGetErrorString(r);
    if (peer) throw PeerFailure(msg + " (a peer process died)");
    throw std::runtime_error("NCCL error in " + msg);
  }

  void abort_nccl() {
    broken_ = true;
    if (!nccl_) return;
    report(ncclCommAbort(nccl_));
    nccl_ = nullptr;
  }

  // NCCL all-reduce of a device buffer; false (nothing done) for a host buffer.
  template <typename T>
  bool device_allreduce(T* buf, std::size_t n, ncclRedOp_t op) {
    if (size() == 1 || n == 0) return true;
    if (!is_device_pointer(buf)) return false;
    ncclComm_t c = nccl();
    begin();
    settle(ncclAllReduce(buf, buf, n, nccl_type<T>(), op, c, stream_), "ncclAllReduce");
    end();
    return true;
  }

  ncclComm_t nccl_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool broken_ = false;  // aborted after a failure: this group is done with NCCL
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(MPI_Comm comm) {
  MPI_Comm dup;
  mpi_check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
  return std::make_unique<NcclComm>(make_mpi_comm(dup, true));
}

}  // namespace ntp
