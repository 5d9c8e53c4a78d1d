#pragma once
// One rank's run as both its loop (TrainingRun, app/training_run) and its recovery (Recovery,
// recovery/recovery) see it: the options, who is in the run, the schedule, the trainer, the
// results file, this rank's liveness and stragglers, and the run's clock. The loop owns it; a
// recovery changes who is in it and what the trainer holds.
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "liveness.hpp"
#include "membership.hpp"
#include "options.hpp"
#include "run_record.hpp"
#include "schedule.hpp"
#include "straggler_watch.hpp"
#include "trainer.hpp"

namespace ntp {

struct RunState {
  // `threads` are configured for this rank over the members' group (configure_threads).
  RunState(Options options, Membership who, Schedule events);

  // The rank that holds the results file: logical rank 0 at the start; when it dies, the lowest
  // live logical rank takes over, and keeps it (a revived rank 0 does not take it back).
  bool root() const { return members.records(); }
  bool signal() const { return o.kill_mode == KillMode::Signal; }
  // Seconds since the run's start (on a replacement process: since the survivors' start).
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  // The run's clock reads `t` now.
  void set_now(double t);
  // This rank is at `what` of step s: the watchdog's countdown starts again (--hang-timeout).
  void progress(int s, const char* what) { liveness->progress(s, what, root()); }
  [[noreturn]] void die() { liveness->die(members.size()); }
  // Rank r died: it is no longer evicted nor a straggler, and whoever holds it next starts at full
  // speed (a rebalance by its speed ends with it).
  void forget_straggler(int r);
  // A reconfiguration's figures over the group (collective): slowest rank for times, all ranks
  // for bytes.
  RecoveryFigures figures(const Reconfiguration& rc, int steps_before);
  // /ranks/incarnations: which process holds each logical rank (the group's members not in
  // `only`, unless it is empty, are left as they are). Collective over the group.
  void record_processes(const std::vector<int>& only);

  Options o;
  Membership members;  // the live group, who is alive, evicted, where, and who records
  Schedule schedule;   // grows by the repairs of unscheduled deaths (Schedule::repair_unscheduled)
  const int threads;
  std::unique_ptr<Trainer> trainer;
  Peak peak;
  // root() only. It refers to o, members.hosts, trainer and peak, declared above so they outlive it.
  std::unique_ptr<RunRecord> record;
  std::optional<Liveness> liveness;  // the watchdog, the heartbeat and the schedule's end of this rank
  StragglerWatch stragglers{o};      // verdicts and the evict probe (straggler_watch.hpp)
  // This rank's last finished attempt: the row a failure kept out of the results file (a failed
  // metrics gather, a recorder that died) is written from it by whoever then holds the file.
  Attempt finished;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
};

}  // namespace ntp
