#pragma once
// One run of the training loop on one rank (app/run_training.cpp drives it): the steps, the
// schedule's events, the per-step report, checkpoints and the end of the run. The run's state is
// a RunState (run/run_state.hpp); what a failure or a revival does to it is the Recovery's
// (recovery/recovery.hpp); what the recorder's rank writes and prints is RunRecord's
// (run/run_record.hpp), which this hands the gathered figures.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "exit_codes.hpp"
#include "handover.hpp"
#include "paced_machine.hpp"
#include "recovery.hpp"
#include "run_state.hpp"
#include "schedule.hpp"

namespace ntp {

// The peak MFU is measured against (collective over `world` when it is measured).
Peak find_peak(const Options& o, Comm& world, int threads);

// One run of the training loop on this rank. The recorder's rank (logical rank 0 until it dies,
// then the lowest live one) holds the RunRecord, which owns the results file and prints.
class TrainingRun {
 public:
  // hosts: each rank's host (job_hosts).
  TrainingRun(Options o, Comm& world, Schedule schedule, std::vector<std::string> hosts)
      : run_(std::move(o), Membership(world, std::move(hosts)), std::move(schedule)) {
    run_.trainer = std::make_unique<Trainer>(run_.o, run_.members.group(), run_.o.micro_batch);
    if (!run_.o.init_from.empty()) run_.trainer->load_checkpoint(run_.o.init_from, run_.o.init_weights_only);
    run_.o.opt.total_steps = run_.trainer->steps_taken() + run_.o.steps;
    if (run_.o.pacing.enabled && run_.o.auto_time_scale()) calibrate_pacing();
    run_.peak = find_peak(run_.o, world, run_.threads);
    hook_into_steps();
  }
  // A replacement process: the survivors' state from `m`, over `group` (which includes it).
  TrainingRun(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, Schedule schedule)
      : run_(m.options, Membership(std::move(group), logical_rank, m.hosts, m.state.alive, m.recorder),
             std::move(schedule)) {
    run_.peak = m.peak;
    // The join state's membership is the trainers' (evicted ranks out); an evicted rank is alive.
    for (int r : m.evicted) run_.members.evicted[r] = 1, run_.members.alive[r] = 1;
    run_.stragglers.restore(m.probe_base, m.stragglers);
    JoinState js = m.state;
    js.logical_rank = run_.members.me;
    run_.trainer = std::make_unique<Trainer>(run_.o, run_.members.group(), run_.o.micro_batch, js);
    run_.set_now(m.elapsed);
    hook_into_steps();
  }

  void open_results();
  void print_banner() const;
  void start_clock();
  // Applies step s's kills and revivals; returns the recovery's seconds (0 when nothing happens).
  double apply_events(int s);
  // The step, redone after a failure until it commits (signal mode); returns when it has.
  void run_step(int s, double recovery_seconds);
  // Steps first..--steps (each: the schedule's events, then the step; before `first`, the events
  // were applied already when `recovery_before_first` is given), then the end of the run. Returns
  // the exit code: 0; 3 when failures leave no way forward; 4 for a non-finite loss or gradient
  // norm (a stop, or a last step that --on-nonfinite skip could not save).
  int train(int first, double recovery_before_first = -1);
  // A replacement process's part of the revival at step s (the survivors' is Recovery::revive).
  double join(int s, const std::vector<int>& ranks) { return recovery_.join(s, ranks); }
  // Spares (spare_pool.hpp): revivals are served from `pool`, and with --spare-use takeover a death
  // too. `processes`: on the recorder at job start, "pid host" of every spare, for the results file.
  void use_spares(SparePool* pool, std::vector<std::string> processes = {}) {
    recovery_.use_spares(pool, std::move(processes));
  }

 private:
  int train_steps(int first, double recovery_before_first);
  void write_final_checkpoint();
  int finish();
  // After NoProgress: the root closes the file with what it holds (a /summary over the rows).
  void abandon(const NoProgress& e);
  void hook_into_steps();
  StepResult attempt(int s, double t_start, double recovery_seconds, double& idle_seconds);
  void report(int s, const StepResult& r, double t_start, double recovery_seconds, double idle_seconds);
  // The last report's straggler verdicts, acted on (collective; every rank holds the same ones):
  // evicted ranks leave the training groups or come back, or replicas take layouts by speed.
  // Returns the reconfiguration's seconds (0 when nothing changes).
  double act_on_stragglers(int s);
  // --time-scale auto: the factor chosen now (paced_machine.hpp), written into the options that
  // the record and any replacement process take.
  void calibrate_pacing();
  // A schedule's `slow` events of step s: this rank's pacer, and the record.
  void apply_slowdowns(int s, const StepEvents& ev);
  void note_shared_cores();
  void maybe_checkpoint(int s, bool trained);

  RunState run_;
  Recovery recovery_{run_};
  CommTally reported_;  // the control plane's tally at this process's last report (report())
  std::optional<Calibration> calibration_;  // --time-scale auto's (first process of a rank only)
  int skipped_steps_ = 0;                   // --on-nonfinite skip
  int step_ = 0;                            // the step being attempted (the step hook's progress names it)
};

// A process that takes over logical rank `logical_rank` (spawned, or a spare): the survivors'
// state from `m` over `group`, healed, then the steps to the end. Returns the exit code.
int train_replacement(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, SparePool* spares);

}  // namespace ntp
