#include "hang_watch.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <signal.h>
#include <sstream>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

namespace ntp {

// Times are steady_clock seconds (CLOCK_MONOTONIC: one clock for every process of the host).
// Writers store the time last, so a reader sees a whole update or the one before.
struct RankRecord {
  long long pid;
  unsigned long long start_ticks;  // /proc/PID/stat field 22
  std::atomic<double> heartbeat;   // the watch thread, every period
  std::atomic<double> progress;    // the training, at each phase
  std::atomic<int> step;
  char what[32];
  std::atomic<double> fenced;      // when a peer declared it hung and ended it; 0: never
  char host[64];                   // gethostname: /dev/shm may be shared by hosts (the namespace cluster)
};

namespace {
double steady() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// State and start time of a live process, from /proc/PID/stat (the fields after the name's ')').
bool proc_stat(long long pid, char& state, unsigned long long& start) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return false;
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return false;
  std::istringstream rest(line.substr(close + 2));
  rest >> state;
  std::string skip;
  for (int field = 4; field < 22; ++field) rest >> skip;
  rest >> start;
  return static_cast<bool>(rest);
}

// The process a record names, if it still exists (a zombie does not).
bool still_there(const RankRecord& r) {
  char state = '?';
  unsigned long long start = 0;
  return r.pid > 0 && proc_stat(r.pid, state, start) && start == r.start_ticks && state != 'Z' && state != 'X';
}

// A peer's record, mapped for reading and the fence's exchange; unmapped when it goes.
struct Mapped {
  RankRecord* r = nullptr;
  explicit Mapped(const std::string& path) {
    const int fd = open(path.c_str(), O_RDWR);
    if (fd < 0) return;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_size == static_cast<off_t>(sizeof(RankRecord))) {
      void* p = mmap(nullptr, sizeof(RankRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) r = static_cast<RankRecord*>(p);
    }
    close(fd);
  }
  ~Mapped() {
    if (r) munmap(r, sizeof(RankRecord));
  }
};

// Declares the process of `r` hung and ends it, unless another peer did: true for the one that did.
bool fence(RankRecord& r) {
  double none = 0;
  if (!r.fenced.compare_exchange_strong(none, steady())) return false;
  kill(static_cast<pid_t>(r.pid), SIGKILL);  // a stopped process dies too
  return true;
}
}  // namespace

std::string hang_job_key(const std::string& results_path) {
  // Not realpath: the file may exist on some ranks and not yet on others.
  const std::string abs = std::filesystem::absolute(results_path).lexically_normal().string();
  return fmt::format("{:016x}", std::hash<std::string>{}(abs));
}

namespace {
// Records that jobs ended without removing (every process of a job killed at once, an abort) stay
// in /dev/shm: each new watch removes those of processes that are gone, and their emptied
// directories. A fenced record is left to its job's repair unless it is ten minutes old.
void sweep_leftovers(const std::string& own_dir) {
  DIR* shm = opendir("/dev/shm");
  if (!shm) return;
  while (const dirent* j = readdir(shm)) {
    if (std::strncmp(j->d_name, "ntpbench-", 9) != 0) continue;
    const std::string dir = std::string("/dev/shm/") + j->d_name;
    if (dir == own_dir) continue;
    if (DIR* d = opendir(dir.c_str())) {
      while (const dirent* e = readdir(d)) {
        if (std::strncmp(e->d_name, "rank", 4) != 0) continue;
        const std::string path = dir + "/" + e->d_name;
        Mapped r(path);
        const bool stale = r.r && !still_there(*r.r) && (r.r->fenced.load() == 0 || steady() - r.r->fenced.load() > 600);
        if (stale) unlink(path.c_str());
      }
      closedir(d);
    }
    rmdir(dir.c_str());  // only if now empty
  }
  closedir(shm);
}
}  // namespace

HangWatch::HangWatch(const std::string& job, int rank, double timeout)
    : dir_(fmt::format("/dev/shm/ntpbench-{}", job)), path_(fmt::format("{}/rank{}", dir_, rank)), rank_(rank),
      timeout_(timeout) {
  sweep_leftovers(dir_);
  mkdir(dir_.c_str(), 0700);
  // Written whole under a name of its own, then renamed into place: a peer never reads a record
  // half written (a zero heartbeat would look hung), and one that still maps the record of an
  // earlier process of this rank keeps that file (truncating it in place would fault its reads).
  const std::string tmp = fmt::format("{}.new{}", path_, getpid());
  const int fd = open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd >= 0) {
    if (ftruncate(fd, sizeof(RankRecord)) == 0) {
      void* p = mmap(nullptr, sizeof(RankRecord), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) mine_ = static_cast<RankRecord*>(p);
    }
    close(fd);
  }
  if (!mine_) {
    unlink(tmp.c_str());
    return;
  }
  char state = '?';
  unsigned long long start = 0;
  mine_->pid = getpid();
  if (gethostname(mine_->host, sizeof mine_->host) != 0) mine_->host[0] = '\0';
  mine_->host[sizeof mine_->host - 1] = '\0';
  mine_->start_ticks = proc_stat(getpid(), state, start) ? start : 0;
  mine_->fenced.store(0);
  progress(0, "its start");
  mine_->heartbeat.store(steady());
  if (rename(tmp.c_str(), path_.c_str()) != 0) {
    munmap(mine_, sizeof(RankRecord));
    mine_ = nullptr;
    unlink(tmp.c_str());
    return;
  }
  thread_ = std::thread([this] { watch(); });
}

HangWatch::~HangWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (!mine_) return;
  munmap(mine_, sizeof(RankRecord));
  unlink(path_.c_str());
  rmdir(dir_.c_str());  // the last process of the host to leave removes the directory
}

void HangWatch::progress(int step, const char* what) {
  if (!mine_) return;
  mine_->step.store(step, std::memory_order_relaxed);
  std::snprintf(mine_->what, sizeof mine_->what, "%s", what);
  mine_->progress.store(steady(), std::memory_order_release);
}

// Beats every period (an eighth of the timeout, 20 ms to 1 s), and looks at the peers' beats.
void HangWatch::watch() {
  const auto period = std::chrono::duration<double>(std::clamp(timeout_ / 8, 0.02, 1.0));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    mine_->heartbeat.store(steady(), std::memory_order_release);
    look_at_peers();
    wake_.wait_for(lock, period, [this] { return stop_; });
  }
}

void HangWatch::look_at_peers() {
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  const std::string me = fmt::format("rank{}", rank_);
  while (const dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "rank", 4) != 0 || me == e->d_name || std::strchr(e->d_name, '.')) continue;
    const std::string path = dir_ + "/" + e->d_name;
    Mapped peer(path);
    if (!peer.r || peer.r->fenced.load() != 0) continue;  // a fenced record waits for the repair (settle)
    if (!still_there(*peer.r)) {
      unlink(path.c_str());  // it died: nothing to settle, and it would stay behind
      continue;
    }
    if (steady() - peer.r->heartbeat.load(std::memory_order_acquire) > timeout_) fence(*peer.r);
  }
  closedir(d);
}

void HangWatch::end_processes_from(int first) {
  DIR* d = opendir(dir_.c_str());
  if (!d) return;
  while (const dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, "rank", 4) != 0 || std::strchr(e->d_name, '.')) continue;
    const int key = std::atoi(e->d_name + 4);
    if (key < first || key == rank_) continue;
    Mapped peer(dir_ + "/" + e->d_name);
    if (peer.r && mine_ && std::strncmp(peer.r->host, mine_->host, sizeof mine_->host) == 0 && still_there(*peer.r))
      kill(static_cast<pid_t>(peer.r->pid), SIGKILL);
  }
  closedir(d);
}

std::optional<HungRank> HangWatch::settle(int rank) {
  const std::string path = fmt::format("{}/rank{}", dir_, rank);
  std::optional<HungRank> out;
  {
    Mapped peer(path);
    if (!peer.r) return std::nullopt;  // not on this host, or already settled
    RankRecord& r = *peer.r;
    // MPI declared it failed (its own detector) before this host's watch did: a process still there
    // is hung all the same.
    if (r.fenced.load() == 0 && still_there(r)) fence(r);
    if (r.fenced.load() != 0) {
      const double t = steady();
      r.what[sizeof r.what - 1] = '\0';
      out = HungRank{t - r.heartbeat.load(), t - r.fenced.load(), t - r.progress.load(), r.step.load(), r.what};
    }
  }
  unlink(path.c_str());
  return out;
}

}  // namespace ntp
