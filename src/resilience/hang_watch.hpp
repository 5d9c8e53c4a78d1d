#pragma once
// Hung ranks: a process that stops answering without dying (every thread stopped, as `kill -STOP`
// does; a schedule's `hang`) is found by the other processes of its host, ended for real, and from
// then on is a death that ULFM reports and the run repairs.
//
// Each trainer process keeps a small shared-memory record, /dev/shm/ntpbench-<job>/rank<R>: its pid
// and start time (to tell it from a later process with the same pid), a heartbeat that a thread of
// its own writes every period, and where its training last made progress (step, phase). The same
// thread reads the records of the job's other processes on its host: one whose heartbeat is older
// than --failure-timeout while its process still exists is hung. The first to see it marks the
// record fenced (an atomic exchange, so one process acts) and ends it with SIGKILL; MPI then
// reports a death. The heartbeat comes from its own thread, so a long step, checkpoint write or heal
// never looks hung; a process stuck in one call with its other threads running (a driver hang) is
// the watchdog's (--hang-timeout, exit code 5), as is a host whose every rank hangs (no peer there
// to see it). MPI's own detector (mpirun --mca mpi_ft_detector true) may declare a hung rank first:
// the repair then ends the process it finds (fence_now).
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ntp {

struct RankRecord;  // the shared record's layout (hang_watch.cpp)

// What the record of a rank that MPI reported failed says, read by a survivor of its host.
struct HungRank {
  double froze_ago = 0;     // seconds since its last heartbeat
  double declared_ago = 0;  // seconds since it was declared hung and ended
  double progress_ago = 0;  // seconds since its training last made progress
  int step = 0;             // ... at this step
  std::string what;         // ... and phase
};

class HangWatch {
 public:
  // `job`: hang_job_key(results path); `rank`: this process's logical rank; `timeout`: seconds.
  HangWatch(const std::string& job, int rank, double timeout);
  ~HangWatch();  // stops the thread and removes this rank's record
  HangWatch(const HangWatch&) = delete;
  HangWatch& operator=(const HangWatch&) = delete;

  // This rank's training made progress at step `step`, at `what` (cut to 31 characters).
  void progress(int step, const char* what);
  bool ok() const { return mine_ != nullptr; }  // false where /dev/shm is not writable

  // After MPI reported `rank` failed: was it hung? Reads its record on this host (nullopt: it died,
  // or ran elsewhere); a process still there is ended now. Removes the record either way.
  std::optional<HungRank> settle(int rank);

  // A node failure (a schedule's kill_node) takes every process of the job on this host: ends the
  // processes whose records have a key of `first` or more (the spares waiting here: their key is
  // the trainers' count plus their number), as the host's loss would. Their records stay for the
  // survivors' settle, which finds them dead, not hung.
  void end_processes_from(int first);

 private:
  void watch();
  void look_at_peers();

  std::string dir_, path_;
  int rank_;
  double timeout_;
  RankRecord* mine_ = nullptr;
  bool stop_ = false;
  std::mutex mu_;
  std::condition_variable wake_;
  std::thread thread_;
};

// A short key of the job for the records' directory: the same on every process of one job (the
// absolute results path, which every rank and replacement has), different between jobs.
std::string hang_job_key(const std::string& results_path);

}  // namespace ntp
