#include "liveness.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

namespace ntp {

Liveness::Liveness(double limit, const std::string& key, int me, double failure_timeout)
    : me_(me), limit_(limit), hang_watch_(key.empty() ? nullptr : std::make_unique<HangWatch>(key, me, failure_timeout)) {}

void Liveness::progress(int s, const char* what, bool records) {
  if (hang_watch_) hang_watch_->progress(s, what);
  if (limit_ <= 0) return;
  watchdog_.arm(limit_, fmt::format("rank {} made no progress for {:.0f} s in step {} ({}): a peer has stopped without "
                                    "dying, or the MPI library hangs; this process ends so that the job does (exit "
                                    "code 5; --hang-timeout sets the limit){}",
                                    me_, limit_, s, what, records ? "; the results file holds the steps before it" : ""));
}

void Liveness::saw_step(double seconds) {
  if (limit_ > 0) limit_ = std::max(limit_, 10 * seconds);
}

[[noreturn]] void Liveness::die(int ranks) {
  std::fflush(nullptr);
  // A node failure: the spares waiting on this host go with it (their keys follow the trainers').
  if (takes_host_ && hang_watch_) hang_watch_->end_processes_from(ranks);
  if (hangs_) raise(SIGSTOP);
  raise(SIGKILL);
  std::abort();  // not reached
}

}  // namespace ntp
