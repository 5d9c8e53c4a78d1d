// HangWatch (src/resilience/hang_watch.hpp) between real processes of one host, without MPI: a
// child that stops (SIGSTOP, every thread with it) is declared hung by its peer after the timeout
// and ended with SIGKILL; a child that is alive but makes no training progress (a long step) is not.
#include <chrono>
#include <csignal>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>

#include <gtest/gtest.h>

#include "hang_watch.hpp"
#include "schedule.hpp"

namespace {
using namespace std::chrono_literals;

std::string job_key(const char* name) { return ntp::hang_job_key(std::string("/tmp/hang-watch-test-") + name + std::to_string(getpid())); }

// Forks a child that keeps a HangWatch as `rank` (1 by default) and then runs `then`; returns its
// pid once its record exists.
template <class F>
pid_t child(const std::string& job, double timeout, F then, int rank = 1) {
  int ready[2];
  EXPECT_EQ(pipe(ready), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    ntp::HangWatch watch(job, rank, timeout);
    const char ok = watch.ok() ? 'y' : 'n';
    (void)!write(ready[1], &ok, 1);
    then(watch);
    _exit(0);
  }
  close(ready[1]);
  char ok = 0;
  EXPECT_EQ(read(ready[0], &ok, 1), 1);
  EXPECT_EQ(ok, 'y');
  close(ready[0]);
  return pid;
}

// Waits up to `limit` for `pid` to end; its wait status, or -1 if it is still running.
int wait_for(pid_t pid, std::chrono::duration<double> limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    std::this_thread::sleep_for(10ms);
  }
  return -1;
}
}  // namespace

TEST(HangWatch, AStoppedPeerIsDeclaredHungAfterTheTimeoutAndEnded) {
  const std::string job = job_key("stop");
  const double timeout = 0.4;
  ntp::HangWatch me(job, 0, timeout);
  ASSERT_TRUE(me.ok());
  const pid_t pid = child(job, timeout, [](ntp::HangWatch& w) {
    w.progress(3, "backward");
    raise(SIGSTOP);  // as a scheduled hang does
    std::this_thread::sleep_for(60s);
  });
  const auto t0 = std::chrono::steady_clock::now();
  const int status = wait_for(pid, 10s);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_NE(status, -1) << "the stopped child was not ended";
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_GE(took, timeout * 0.9);  // not before the timeout (its last beat may precede the stop)
  const auto hung = me.settle(1);
  ASSERT_TRUE(hung.has_value());
  EXPECT_GE(hung->froze_ago - hung->declared_ago, timeout);          // declared after the timeout ...
  EXPECT_LE(hung->froze_ago - hung->declared_ago, timeout + 0.5);    // ... by at most a period or so
  EXPECT_EQ(hung->step, 3);
  EXPECT_EQ(hung->what, "backward");
  EXPECT_FALSE(me.settle(1).has_value());  // settled once: the record is gone
}

TEST(HangWatch, ALongStepIsNotAHang) {
  const std::string job = job_key("long");
  const double timeout = 0.3;
  ntp::HangWatch me(job, 0, timeout);
  // Its training makes no progress for 5 timeouts, but the process runs: its heartbeat goes on.
  const pid_t pid = child(job, timeout, [](ntp::HangWatch& w) {
    w.progress(1, "forward");
    std::this_thread::sleep_for(1500ms);
  });
  const int status = wait_for(pid, 10s);
  ASSERT_NE(status, -1);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a live child was ended";
  EXPECT_FALSE(me.settle(1).has_value());
}

TEST(HangWatch, ADeadPeerIsNotAHang) {
  const std::string job = job_key("dead");
  ntp::HangWatch me(job, 0, 0.3);
  const pid_t pid = child(job, 0.3, [](ntp::HangWatch&) { raise(SIGKILL); });  // its record stays behind
  const int status = wait_for(pid, 10s);
  ASSERT_TRUE(WIFSIGNALED(status));
  std::this_thread::sleep_for(600ms);  // past the timeout: its stale beat must not count
  EXPECT_FALSE(me.settle(1).has_value());
}

TEST(HangWatch, RecordsOfProcessesGoneAreSweptAway) {
  // A job whose every process was killed leaves its records; the next watch on the host removes
  // them, and their directory.
  const std::string old_job = job_key("leftover");
  const pid_t pid = child(old_job, 10, [](ntp::HangWatch&) { raise(SIGKILL); });
  ASSERT_TRUE(WIFSIGNALED(wait_for(pid, 10s)));
  const std::string dir = "/dev/shm/ntpbench-" + old_job;
  ASSERT_EQ(access((dir + "/rank1").c_str(), F_OK), 0) << "the killed child left no record to sweep";
  ntp::HangWatch next(job_key("next"), 0, 10);
  EXPECT_NE(access(dir.c_str(), F_OK), 0) << dir << " is still there";
}

TEST(Schedule, HangsAreKillsWhoseProcessStops) {
  const ntp::Schedule s = ntp::Schedule::parse(
      "events:\n  - {step: 3, hang: [2], kill: [1], at: sync}\n  - {step: 6, revive: [1, 2]}\n", "h.yaml", 4, 10);
  const ntp::StepEvents& e = s.at(3);
  EXPECT_EQ(e.kill, (std::vector<int>{1, 2}));
  EXPECT_EQ(e.kill_hangs, (std::vector<char>{0, 1}));
  EXPECT_EQ(e.kill_at, (std::vector<ntp::StepPoint>{ntp::StepPoint::Sync, ntp::StepPoint::Sync}));
  EXPECT_THROW(ntp::Schedule::parse("events:\n  - {step: 3, hang: [1]}\n  - {step: 4, hang: [1]}\n", "h.yaml", 4, 10),
               ntp::ScheduleError);  // a hung rank cannot hang again before it is back
}

TEST(Schedule, TheGeneratorDrawsHangsWithoutMovingItsFailures) {
  const std::string base = "random: {mtbf_steps: 20, repair_steps: 5, seed: 3}\n";
  const std::string with = "random: {mtbf_steps: 20, repair_steps: 5, seed: 3, hang_fraction: 0.5}\n";
  const ntp::Schedule a = ntp::Schedule::parse(base, "a.yaml", 8, 400), b = ntp::Schedule::parse(with, "b.yaml", 8, 400);
  ASSERT_EQ(a.events().size(), b.events().size());
  int hangs = 0, kills = 0;
  for (const auto& [step, e] : b.events()) {
    EXPECT_EQ(e.kill, a.at(step).kill) << step;  // the same failures at the same steps
    for (char h : e.kill_hangs) hangs += h, ++kills;
    for (char h : a.at(step).kill_hangs) EXPECT_EQ(h, 0);
  }
  ASSERT_GT(kills, 20);
  EXPECT_GT(hangs, kills / 4);  // about half
  EXPECT_LT(hangs, 3 * kills / 4);
  EXPECT_THROW(ntp::Schedule::parse("random: {mtbf_steps: 20, repair_steps: 5, seed: 3, hang_fraction: 1.5}\n",
                                    "c.yaml", 8, 400),
               ntp::ScheduleError);
}

// A kill_node: the dying trainer ends the spares of its host (keys from the trainers' count up),
// and no trainer.
TEST(HangWatch, ANodeFailureEndsTheSparesOfTheHost) {
  const std::string job = job_key("node");
  ntp::HangWatch me(job, 0, 5.0);
  ASSERT_TRUE(me.ok());
  const auto wait = [](ntp::HangWatch&) { std::this_thread::sleep_for(60s); };
  const pid_t trainer = child(job, 5.0, wait, 1);
  const pid_t spare = child(job, 5.0, wait, 8);  // with 8 trainers: spare 0
  me.end_processes_from(8);
  const int status = wait_for(spare, 5s);
  ASSERT_NE(status, -1) << "the spare was not ended";
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(wait_for(trainer, 0.3s), -1) << "a trainer was ended";
  EXPECT_FALSE(me.settle(8).has_value());  // dead, not hung
  kill(trainer, SIGKILL);
  wait_for(trainer, 5s);
  me.settle(1);
}
