// MPI implementation of the communication seam.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif
#ifdef NTPBENCH_HAVE_ULFM
#include <mpi-ext.h>
#endif

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <fstream>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm.hpp"
#include "comm_mpi.hpp"
#include "fault.hpp"
#include "leave_unfinalized.hpp"
#include "watchdog.hpp"

namespace ntp {

namespace {

// MPI counts are int: large buffers go in pieces so gpt2-xl-sized gradients still reduce.
constexpr std::size_t kMaxChunk = std::size_t(1) << 30;

template <typename T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() { return MPI_FLOAT; }
template <>
MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }

// Whether `comm` is revoked or the MPI knows one of its members died (Comm::peer_failed; local,
// nothing acknowledged). Always false without ULFM.
bool group_lost_a_process(MPI_Comm comm) {
#ifdef NTPBENCH_HAVE_ULFM
  if (comm == MPI_COMM_NULL) return false;
  int revoked = 0;
  if (MPIX_Comm_is_revoked(comm, &revoked) != MPI_SUCCESS || revoked) return true;
  // A probe drives the progress engine, which is where the MPI learns of a death; an error
  // from it is such a death (it matches no message: nothing is received).
  int flag = 0;
  if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return true;
  MPI_Group failed = MPI_GROUP_NULL;
  if (MPIX_Comm_get_failed(comm, &failed) != MPI_SUCCESS) return true;
  int n = 0;
  MPI_Group_size(failed, &n);
  MPI_Group_free(&failed);
  return n > 0;
#else
  (void)comm;
  return false;
#endif
}

// Error translation: a dead peer or a revoked group is a PeerFailure (the survivors repair and
// go on); anything else is a plain error. Open MPI 5.0's non-blocking collectives (libnbc) can
// report a peer's death as MPI_ERR_OTHER ("Error in NBC_Start_round() (-1)", seen when a round
// starts towards a process already known dead): an error on `comm` while it has a failed process
// is that death too.
void check(int rc, const char* what, MPI_Comm comm = MPI_COMM_NULL) {
  if (rc == MPI_SUCCESS) return;
  int cls = rc;
  MPI_Error_class(rc, &cls);
#ifdef NTPBENCH_HAVE_ULFM
  if (cls == MPIX_ERR_PROC_FAILED || cls == MPIX_ERR_REVOKED || cls == MPIX_ERR_PROC_FAILED_PENDING)
    throw PeerFailure(std::string(what) + (cls == MPIX_ERR_REVOKED ? ": communicator revoked" : ": a peer process died"));
#endif
  char msg[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  if (group_lost_a_process(comm))
    throw PeerFailure(std::string(what) + ": a peer process died (reported as " + std::string(msg, len) + ")");
  throw std::runtime_error(std::string("MPI error in ") + what + ": " + std::string(msg, len));
}

// Open MPI 5.0.11 can wait for ever in MPI_Comm_spawn or MPI_Intercomm_merge when a new process
// fails to start or to connect (seen in a long real-kill soak: a spawned process's TCP bind
// failed and its parents waited until the job was killed); neither call reports it. Within such a
// call a Watchdog ends this process with a message after spawn_seconds() instead (exit code 5;
// every member of the group has its own, so the whole job ends). A healthy spawn takes 1-2 s.
double spawn_seconds() {
  const char* env = std::getenv("NTPBENCH_SPAWN_TIMEOUT_S");  // for tests (docs/real-failures.md)
  const double s = env ? std::atof(env) : 0;
  return s > 0 ? s : 300;
}
void arm_spawn_deadline(Watchdog& w, const std::string& what) {
  const double limit = spawn_seconds();
  w.arm(limit, what + " did not finish within " + std::to_string(static_cast<int>(limit)) +
                   " s; Open MPI reported nothing, so this process ends (exit code 5)");
}

// Every member of `c` exchanges a message with every other, so each process has opened its
// endpoint to each peer (Open MPI looks up a peer's address on the first message to it). Under
// Open MPI 5.0.11 with ULFM that lookup must not come after the peer's death: a revoke is forwarded
// to members no message has reached yet, and the lookup (PMIx_Get, inside the progress engine)
// then waits for ever for the dead process's address. Seen with gdb in a real-kill soak: one
// process stuck so in an all-reduce, every other in the repair's agreement waiting for it; and in
// bench/ulfm_respawn_cost, which hangs so at its first kill of a replacement without this
// exchange. n-1 rounds of one int per member, at the start of a fault-tolerant job and after each
// spawn.
void connect_every_pair(MPI_Comm c) {
  int me = 0, n = 1;
  MPI_Comm_rank(c, &me);
  MPI_Comm_size(c, &n);
  for (int k = 1; k < n; ++k) {  // round k: send k ahead, receive from k behind (no deadlock)
    int out = me, in = -1;
    check(MPI_Sendrecv(&out, 1, MPI_INT, (me + k) % n, 71, &in, 1, MPI_INT, (me - k + n) % n, 71, c,
                       MPI_STATUS_IGNORE),
          "MPI_Sendrecv (connecting every pair)");
  }
}

// Intercommunicators to spawned processes (or, in one, to its parents): they stay open for the
// whole run (a process holding one ends without MPI_Finalize: finish_mpi).
std::vector<MPI_Comm>& spawn_links() {
  static std::vector<MPI_Comm> links;
  return links;
}

// Set once this process has taken part in a repair: a shrink, a spawn, or its start as a
// replacement (finish_mpi then does not call MPI_Finalize).
bool& repaired() {
  static bool seen = false;
  return seen;
}

// Errors come back as codes (check() translates them) instead of aborting the job.
MPI_Comm returning_errors(MPI_Comm c) {
  if (c != MPI_COMM_NULL) MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  return c;
}

// Completes a request, yielding the core between polls (spins briefly first for short waits).
// `comm`: the request's communicator (check()).
void wait_politely(MPI_Request& req, MPI_Comm comm) {
  int done = 0;
  for (int spin = 0; spin < 200 && !done; ++spin) check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test", comm);
  while (!done) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test", comm);
  }
}

class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MPI_Request r, MPI_Comm comm) : req_(r), comm_(comm) {}
  ~MpiRequest() override {
    // Waits for an unfinished operation (its buffers are about to go); on a failed or revoked
    // group it completes with an error, which is already being handled by whoever unwinds.
    try {
      if (req_ != MPI_REQUEST_NULL) wait_politely(req_, MPI_COMM_NULL);  // its group may be freed by now
    } catch (const std::exception&) {
    }
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test", comm_);
    return done != 0;
  }
  void wait() override {
    if (req_ != MPI_REQUEST_NULL) wait_politely(req_, comm_);
  }

 private:
  MPI_Request req_;
  MPI_Comm comm_;
};

class MpiComm final : public Comm {
 public:
  MpiComm(MPI_Comm comm, bool owned) : comm_(returning_errors(comm)), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiComm() override {
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(float* buf, std::size_t n) override { allreduce(buf, n, MPI_SUM); }
  void allreduce_sum(double* buf, std::size_t n) override { allreduce(buf, n, MPI_SUM); }
  void allreduce_max(float* buf, std::size_t n) override { allreduce(buf, n, MPI_MAX); }
  void allreduce_max(double* buf, std::size_t n) override { allreduce(buf, n, MPI_MAX); }

  void broadcast(void* buf, std::size_t bytes, int root) override {
    auto* p = static_cast<char*>(buf);
    for (std::size_t off = 0; off < bytes; off += kMaxChunk) {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - off));
      check(MPI_Bcast(p + off, n, MPI_BYTE, root, comm_), "MPI_Bcast", comm_);
    }
  }

  std::vector<int> allgather(int value) override {
    std::vector<int> all(size_);
    check(MPI_Allgather(&value, 1, MPI_INT, all.data(), 1, MPI_INT, comm_), "MPI_Allgather", comm_);
    return all;
  }

  void gather(const double* send, std::size_t n, double* recv, int root) override {
    // The metrics channel: idle and dead ranks wait here for the trainers, so wait politely
    // (test and sleep) instead of spinning on a core the trainers need.
    MPI_Request req;
    check(MPI_Igather(send, static_cast<int>(n), MPI_DOUBLE, recv, static_cast<int>(n), MPI_DOUBLE, root, comm_, &req),
          "MPI_Igather", comm_);
    wait_politely(req, comm_);
  }

  std::vector<std::string> gather(const std::string& s, int root) override {
    constexpr int kLen = 256;
    char mine[kLen] = {};
    s.copy(mine, kLen - 1);
    std::vector<char> all(rank_ == root ? std::size_t(size_) * kLen : 0);
    check(MPI_Gather(mine, kLen, MPI_CHAR, all.data(), kLen, MPI_CHAR, root, comm_), "MPI_Gather", comm_);
    std::vector<std::string> out;
    for (int r = 0; rank_ == root && r < size_; ++r) out.emplace_back(all.data() + std::size_t(r) * kLen);
    return out;
  }

  void alltoallv(const float* send, const std::vector<int>& send_counts, const std::vector<int>& send_displs,
                 float* recv, const std::vector<int>& recv_counts, const std::vector<int>& recv_displs) override {
    check(MPI_Alltoallv(send, send_counts.data(), send_displs.data(), MPI_FLOAT, recv, recv_counts.data(),
                        recv_displs.data(), MPI_FLOAT, comm_),
          "MPI_Alltoallv", comm_);
  }

  std::unique_ptr<CommRequest> ialltoallv(const float* send, const std::vector<int>& send_counts,
                                          const std::vector<int>& send_displs, float* recv,
                                          const std::vector<int>& recv_counts,
                                          const std::vector<int>& recv_displs) override {
    MPI_Request req;
    check(MPI_Ialltoallv(send, send_counts.data(), send_displs.data(), MPI_FLOAT, recv, recv_counts.data(),
                         recv_displs.data(), MPI_FLOAT, comm_, &req),
          "MPI_Ialltoallv", comm_);
    return std::make_unique<MpiRequest>(req, comm_);
  }

  void sendrecv(const float* send, std::size_t n_send, int dest, float* recv, std::size_t n_recv,
                int src) override {
    if (n_send > INT_MAX || n_recv > INT_MAX) throw std::invalid_argument("sendrecv: a message over 2^31 floats");
    constexpr int kTag = 7;  // pipeline activations and their gradients (one direction each per pair)
    MPI_Request req[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    if (src >= 0) check(MPI_Irecv(recv, int(n_recv), MPI_FLOAT, src, kTag, comm_, &req[0]), "MPI_Irecv", comm_);
    if (dest >= 0) check(MPI_Isend(send, int(n_send), MPI_FLOAT, dest, kTag, comm_, &req[1]), "MPI_Isend", comm_);
    wait_politely(req[0], comm_);
    wait_politely(req[1], comm_);
  }

  std::string post(const std::string& message, int root) override {
    constexpr int kTag = 8;  // the spare pool's plans (recovery/spare_pool.cpp)
    MPI_Request req = MPI_REQUEST_NULL;
    if (rank_ != root) {
      long long n = 0;
      check(MPI_Irecv(&n, 1, MPI_LONG_LONG, root, kTag, comm_, &req), "MPI_Irecv", comm_);
      wait_politely(req, comm_);
      std::string s(static_cast<std::size_t>(n), '\0');
      check(MPI_Irecv(s.data(), static_cast<int>(n), MPI_CHAR, root, kTag, comm_, &req), "MPI_Irecv", comm_);
      wait_politely(req, comm_);
      return s;
    }
    // Every live member gets it even when one has died: the failure is raised after the last send.
    long long n = static_cast<long long>(message.size());
    std::optional<PeerFailure> failed;
    for (int r = 0; r < size_; ++r) {
      if (r == root) continue;
      try {
        check(MPI_Isend(&n, 1, MPI_LONG_LONG, r, kTag, comm_, &req), "MPI_Isend", comm_);
        wait_politely(req, comm_);
        check(MPI_Isend(message.data(), static_cast<int>(n), MPI_CHAR, r, kTag, comm_, &req), "MPI_Isend", comm_);
        wait_politely(req, comm_);
      } catch (const PeerFailure& e) {
        if (!failed) failed = e;
      }
    }
    if (failed) throw *failed;
    return message;
  }

  void barrier() override {
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), "MPI_Ibarrier", comm_);
    wait_politely(req, comm_);
  }

  std::unique_ptr<Comm> split_node() override {
    MPI_Comm node;
    check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type", comm_);
    return std::make_unique<MpiComm>(node, true);
  }

  std::unique_ptr<Comm> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub), "MPI_Comm_split", comm_);
    if (sub == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiComm>(sub, true);
  }

#ifdef NTPBENCH_HAVE_ULFM
  void revoke() override { MPIX_Comm_revoke(comm_); }

  bool agree(bool ok) override {
    int flag = ok ? 1 : 0;
    const int rc = MPIX_Comm_agree(comm_, &flag);
    if (rc == MPI_SUCCESS) return flag != 0;
    int cls = rc;
    MPI_Error_class(rc, &cls);
    if (cls == MPIX_ERR_PROC_FAILED) {
      // A member died: acknowledge it, so later agreements on this group can still succeed.
      MPIX_Comm_failure_ack(comm_);
      return false;
    }
    check(rc, "MPIX_Comm_agree");
    return false;
  }

  bool peer_failed() override { return group_lost_a_process(comm_); }

  std::unique_ptr<Comm> shrink() override {
    MPI_Comm live;
    check(MPIX_Comm_shrink(comm_, &live), "MPIX_Comm_shrink", comm_);
    repaired() = true;
    return std::make_unique<MpiComm>(live, true);
  }
#endif

  std::unique_ptr<Comm> spawn(const std::string& command, const std::vector<std::string>& args, int count,
                              const std::vector<std::string>& hosts) override {
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    MPI_Comm inter = MPI_COMM_NULL, merged = MPI_COMM_NULL;
    std::vector<int> codes(count);
    MPI_Info info = MPI_INFO_NULL;
    if (!hosts.empty()) {
      std::string list;
      for (const auto& h : hosts) list += (list.empty() ? "" : ",") + h;
      MPI_Info_create(&info);
      MPI_Info_set(info, "host", list.c_str());
    }
    Watchdog deadline;
    arm_spawn_deadline(deadline, "MPI_Comm_spawn of " + std::to_string(count) + " new process(es) and their merge");
    const int rc = MPI_Comm_spawn(command.c_str(), argv.data(), count, info, 0, comm_, &inter, codes.data());
    if (info != MPI_INFO_NULL) MPI_Info_free(&info);
    check(rc, "MPI_Comm_spawn");
    spawn_links().push_back(returning_errors(inter));
    check(MPI_Intercomm_merge(inter, 0, &merged), "MPI_Intercomm_merge");  // the parents first, in their order
    repaired() = true;
    auto group = std::make_unique<MpiComm>(merged, true);
    connect_every_pair(merged);  // with join_parent() in the new processes
    return group;
  }

 private:
  template <typename T>
  void allreduce(T* buf, std::size_t n, MPI_Op op) {
    if (size_ == 1) return;
    for (std::size_t off = 0; off < n; off += kMaxChunk) {
      const int count = static_cast<int>(std::min(kMaxChunk, n - off));
      check(MPI_Allreduce(MPI_IN_PLACE, buf + off, count, mpi_type<T>(), op, comm_), "MPI_Allreduce", comm_);
    }
  }

  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Comm> make_mpi_comm(MPI_Comm comm, bool owned) { return std::make_unique<MpiComm>(comm, owned); }

std::unique_ptr<Comm> world_comm() { return std::make_unique<MpiComm>(MPI_COMM_WORLD, false); }

void connect_world() {
#ifdef NTPBENCH_HAVE_ULFM
  if (ulfm_enabled()) {
    connect_every_pair(returning_errors(MPI_COMM_WORLD));
  }
#endif
}

std::unique_ptr<Comm> join_parent() {
  MPI_Comm parent = MPI_COMM_NULL, merged = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent == MPI_COMM_NULL) return nullptr;
  spawn_links().push_back(returning_errors(parent));
  Watchdog deadline;
  arm_spawn_deadline(deadline, "a new process's merge with the survivors (MPI_Intercomm_merge)");
  check(MPI_Intercomm_merge(parent, 1, &merged), "MPI_Intercomm_merge");  // after the parents
  repaired() = true;
  auto group = std::make_unique<MpiComm>(merged, true);
  connect_every_pair(merged);  // with the parents' spawn()
  return group;
}

namespace {
// Open MPI's shared-memory segments this process maps (/dev/shm/sm_segment.*, 16 MB each) when it
// was started without a launcher (a singleton: --replay, a one-rank run). A launcher removes its
// job's segments when the job ends, a killed rank's included; nothing removes a singleton's, and a
// day of replays left dozens behind. A singleton is their only user, so it removes them itself.
std::vector<std::string> singleton_segments() {
  std::vector<std::string> out;
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) return out;  // launched (mpirun, srun, a spawn): the launcher's
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const auto at = line.find("/dev/shm/sm_segment.");
    if (at != std::string::npos && std::find(out.begin(), out.end(), line.substr(at)) == out.end())
      out.push_back(line.substr(at));
  }
  return out;
}
}  // namespace

int finish_mpi(int code) {
  if (!repaired()) {
    // One process carries the verdict. When every process of a job exits non-zero, Open MPI
    // 5.0.11's launcher sometimes never returns: all ranks gone, prterun blocked on a lock of its
    // own (gdb). Measured here with 12 ranks that only meet in a barrier, then exit 2:
    //   after MPI_Finalize, every rank: 16 of 200 launches hung (36 of 200 without --with-ft ulfm);
    //   after MPI_Finalize, rank 0 alone (the others 0): 0 of 200, and mpirun exited 2 in all;
    //   _Exit without MPI_Finalize (as below), every rank: 32 of 200; rank 0 alone: 0 of 100.
    // MPI_Finalize's closing fence completed, so world rank 0 is alive and returns `code`.
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const std::vector<std::string> segments = singleton_segments();
    MPI_Finalize();
    for (const std::string& path : segments) unlink(path.c_str());
    return rank == 0 ? code : 0;
  }
  // Open MPI 5.0.11 can hang for ever in MPI_Finalize (its closing fence) once processes of the
  // job have died and others were spawned: seen in 1 run in 5 here, in several variants of
  // waiting for the spawned processes first; and MPI_Comm_disconnect from a spawned process that
  // has died waits for it for ever. A process that took part in a repair (every process that
  // holds a link to a spawned one does) therefore ends here, after the caller's last barrier,
  // without either; the launcher accepts that with
  // prte_allowed_exit_without_sync (jobs/prte-mca-params.conf, which `make deps` installs into
  // the venv's Open MPI; docs/real-failures.md). It leaves the launcher first (leave_unfinalized.hpp).
  leave_launcher();
#ifdef __SANITIZE_ADDRESS__
  // `make test-sanitize`: _Exit skips the leak check a normal exit runs; run it here, so that the
  // processes that survived a failure or replaced a dead rank are checked too.
  __lsan_do_leak_check();
#endif
  std::_Exit(code);
}

void ignore_broken_links() { signal(SIGPIPE, SIG_IGN); }

void leave_job(int code) {
#ifdef NTPBENCH_HAVE_ULFM
  MPIX_Comm_revoke(MPI_COMM_WORLD);
#endif
  std::fflush(nullptr);
  std::_Exit(code);
}

bool ulfm_compiled() {
#ifdef NTPBENCH_HAVE_ULFM
  return true;
#else
  return false;
#endif
}

bool ulfm_enabled() {
  // `mpirun --with-ft ulfm` turns this MCA parameter on in every process it starts (spawned ones
  // included); without it the launcher ends the job when a process dies.
  const char* ft = std::getenv("OMPI_MCA_mpi_ft_enable");
  return ulfm_compiled() && ft && (std::string(ft) == "1" || std::string(ft) == "true");
}

std::string ulfm_unavailable_reason() {
  if (!ulfm_compiled())
    return "this build's MPI has no ULFM fault tolerance (" + mpi_library_version().substr(0, 40) +
           "...; build with Open MPI >= 5: `make`, not `make MPI=system`)";
  if (!ulfm_enabled()) return "the job was launched without fault tolerance: use `mpirun --with-ft ulfm`";
  return "";
}

std::unique_ptr<Comm> node_comm() {
  MPI_Comm node;
  check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  return std::make_unique<MpiComm>(node, true);
}

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);
  std::string s(buf, len);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string host_name() {
  char buf[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  MPI_Get_processor_name(buf, &len);
  return std::string(buf, len);
}

}  // namespace ntp
