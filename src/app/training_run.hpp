#pragma once
// One run of the training loop on one rank (app/run_training.cpp drives it): the steps, the
// schedule's kills and revivals, the per-step report, and every collective call. training_run.cpp
// holds the loop; real_failures.cpp what --kill-mode signal adds (repair after a death, spawning
// replacements, the recorder moving); what the recorder's rank writes and prints is RunRecord's
// (run_record.hpp), which this hands the gathered figures.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exit_codes.hpp"
#include "machine.hpp"
#include "membership.hpp"
#include "paced_machine.hpp"
#include "liveness.hpp"
#include "straggler.hpp"
#include "straggler_watch.hpp"
#include "recorder.hpp"
#include "run_record.hpp"
#include "schedule.hpp"
#include "trainer.hpp"

namespace ntp {

class SparePool;

// The peak MFU is measured against (collective over `world` when it is measured).
Peak find_peak(const Options& o, Comm& world, int threads);

// What a replacement process is told when it joins (run_joined).
struct JoinMessage {
  Options options;
  int step = 0;
  double elapsed = 0;              // the survivors' clock
  std::vector<int> ranks;          // logical ranks taken by the new processes, in spawn order
  JoinState state;                 // logical_rank filled by each joiner
  int recorder = 0;                // logical rank holding the results file
  std::vector<std::string> hosts;  // each logical rank's host at job start
  Peak peak;                       // the run's MFU denominator, fixed at its start
  std::vector<std::pair<int, int>> added_revivals;  // Schedule::added(): (step, rank)
  std::vector<StragglerDetector::RankState> stragglers;  // the survivors' detector (same on every rank)
  std::vector<int> evicted;        // logical ranks evicted as stragglers (--straggler-policy evict)
  double probe_base = 0;           // ... and the job's healthy probe time (StragglerWatch::measure_probe_base)
};

// What the trainers tell the spares waiting in the pool (SparePool::exchange): take these ranks,
// joining as `join` says, or the run is over and they may leave.
struct SparePlan {
  bool end = false;
  std::vector<std::pair<int, int>> assign;  // (spare key, logical rank)
  JoinMessage join;
};

// Real failures left no replica able to train and no revival still scheduled would let one train
// again: the run cannot go on.
// Also thrown, with exit code 4, for a non-finite loss or gradient norm under --on-nonfinite stop.
struct NoProgress : std::runtime_error {
  explicit NoProgress(const std::string& what, ExitCode code = ExitCode::NoReplica)
      : std::runtime_error(what), exit_code(ntp::code(code)) {}
  int exit_code;
};

// One run of the training loop on this rank. The recorder's rank (logical rank 0 until it dies,
// then the lowest live one) holds the RunRecord, which owns the results file and prints.
class TrainingRun {
 public:
  // hosts: each rank's host (job_hosts).
  TrainingRun(Options o, Comm& world, Schedule schedule, std::vector<std::string> hosts)
      : o_(std::move(o)), members_(world, std::move(hosts)), schedule_(std::move(schedule)),
        threads_(configure_threads(o_.threads, world)), trainer_(std::make_unique<Trainer>(o_, world, o_.micro_batch)) {
    if (!o_.init_from.empty()) trainer_->load_checkpoint(o_.init_from, o_.init_weights_only);
    o_.opt.total_steps = trainer_->steps_taken() + o_.steps;
    if (o_.pacing.enabled && o_.auto_time_scale()) calibrate_pacing();
    peak_ = find_peak(o_, world, threads_);
    hook_into_steps();
  }
  // A replacement process: the survivors' state from `m`, over `group` (which includes it).
  TrainingRun(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, Schedule schedule)
      : o_(m.options), members_(std::move(group), logical_rank, m.hosts, m.state.alive, m.recorder),
        schedule_(std::move(schedule)), threads_(configure_threads(o_.threads, members_.group())), peak_(m.peak) {
    // The join state's membership is the trainers' (evicted ranks out); an evicted rank is alive.
    for (int r : m.evicted) members_.evicted[r] = 1, members_.alive[r] = 1;
    stragglers_.restore(m.probe_base, m.stragglers);
    JoinState js = m.state;
    js.logical_rank = members_.me;
    trainer_ = std::make_unique<Trainer>(o_, members_.group(), o_.micro_batch, js);
    t0_ = std::chrono::steady_clock::now() - std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                   std::chrono::duration<double>(m.elapsed));
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
  int train_steps(int first, double recovery_before_first);
  void write_final_checkpoint();
  int finish();
  // After NoProgress: the root closes the file with what it holds (a /summary over the rows).
  void abandon(const NoProgress& e);
  // A replacement process's part of the revival at step s (the survivors are in revive()).
  double join(int s, const std::vector<int>& ranks);
  // Spares (spares.hpp): revivals are served from `pool`, and with --spare-use takeover a death
  // too. `processes`: on the recorder at job start, "pid host" of every spare, for the results file.
  void use_spares(SparePool* pool, std::vector<std::string> processes = {});

 private:
  // The rank that holds the results file: logical rank 0 at the start; when it dies, the lowest
  // live logical rank takes over, and keeps it (a revived rank 0 does not take it back).
  bool root() const { return members_.records(); }
  bool signal() const { return o_.kill_mode == KillMode::Signal; }
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void hook_into_steps();
  // This rank is at `what` of step s: the watchdog's countdown starts again (--hang-timeout).
  void progress(int s, const char* what);
  StepResult attempt(int s, double t_start, double recovery_seconds, double& idle_seconds);
  void report(int s, const StepResult& r, double t_start, double recovery_seconds, double idle_seconds);
  // The last report's straggler verdicts, acted on (collective; every rank holds the same ones):
  // evicted ranks leave the training groups or come back, or replicas take layouts by speed.
  // Returns the reconfiguration's seconds (0 when nothing changes).
  double act_on_stragglers(int s);
  // --time-scale auto: the factor chosen now (paced_machine.hpp), written into the options that
  // the record and any replacement process take.
  void calibrate_pacing();
  // Rank r died: it is no longer evicted nor a straggler, and whoever holds it next starts at full
  // speed (a rebalance by its speed ends with it).
  void forget_straggler(int r);
  // A schedule's `slow` events of step s: this rank's pacer, and the record.
  void apply_slowdowns(int s, const StepEvents& ev);
  double recover(int s, const PeerFailure& e, double t_attempt);
  // Throws NoProgress (exit code 3) when no replica can train after a repair and nothing will
  // bring a rank back.
  void stop_if_no_way_forward(int s);
  // After a repair, which of `lost` were hung (hang_watch.hpp): for each, the run times at which it
  // froze (its last heartbeat) and was declared hung, or -1 where it died (or no survivor shared
  // its host). Collective: the group agrees. `settled` keeps what this host's watch said of each
  // rank (a watch says it once) for a repair's later passes.
  std::vector<HangTimes> settle_hung(const std::vector<int>& lost, std::map<int, HangTimes>& settled);
  [[noreturn]] void die() { liveness_->die(members_.size()); }
  std::vector<std::pair<int, int>> repair_unscheduled(int s, const std::vector<int>& before);
  double revive(int s, const std::vector<int>& ranks);
  double complete_handover(int s, const StepEvents& ev, bool joining, double t_event,
                           const std::function<void(double)>& record_revival);
  JoinMessage join_message(int s, const std::vector<int>& ranks) const;
  std::unique_ptr<Comm> spawn_replacements(const JoinMessage& m);
  std::unique_ptr<Comm> hand_to_spares(const JoinMessage& m, const std::vector<std::pair<int, int>>& assign);
  Recovery reconfigure_survivors(const std::vector<int>& lost);
  double take_over(int s, const std::vector<int>& lost);
  void release_spares();
  double reconfigure(int s, const StepEvents& ev);
  // The recovery's figures over the group (collective): slowest rank for times, all ranks for bytes.
  RecoveryFigures figures(const Recovery& rc, int steps_before);
  void adopt(std::unique_ptr<Comm> group);
  void align_clock(bool joining);
  void record_processes(const std::vector<int>& only);
  void note_shared_cores();
  void take_over_recorder(const std::vector<int>& lost);
  void maybe_checkpoint(int s, bool trained);

  Options o_;
  Membership members_;  // the live group, who is alive, evicted, where, and who records
  Schedule schedule_;  // grows by the repairs of unscheduled deaths (Schedule::repair_unscheduled)
  const int threads_;
  std::unique_ptr<Trainer> trainer_;
  Peak peak_;
  std::optional<Calibration> calibration_;  // --time-scale auto's (first process of a rank only)
  // root() only. It refers to o_, members_.hosts, trainer_ and peak_, declared above so they outlive it.
  std::unique_ptr<RunRecord> record_;
  std::optional<Liveness> liveness_;  // the watchdog, the heartbeat and the schedule's end of this rank
  StragglerWatch stragglers_{o_};  // verdicts and the evict probe (straggler_watch.hpp)
  // This rank's last finished attempt: the row a failure kept out of the results file (a failed
  // metrics gather, a recorder that died) is written from it by whoever then holds the file.
  Attempt finished_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  int skipped_steps_ = 0;        // --on-nonfinite skip
  int step_ = 0;                 // the step being attempted (the step hook's progress names it)
  // With spares (spares.hpp): the pool of trainers and spares, and on the recorder at job start
  // "pid host" of each spare.
  struct Spares {
    SparePool* pool = nullptr;
    std::vector<std::string> processes;
    explicit operator bool() const { return pool != nullptr; }
  } spares_;
};
// A string from the group's rank 0 to every member.
std::string broadcast_string(Comm& c, std::string s);
nlohmann::json to_json(const JoinMessage& m);
JoinMessage join_message_from_json(const nlohmann::json& j);
std::string to_text(const SparePlan& plan);
SparePlan spare_plan_from_text(const std::string& text);
// A process that takes over logical rank `logical_rank` (spawned, or a spare): the survivors'
// state from `m` over `group`, healed, then the steps to the end. Returns the exit code.
int train_replacement(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, SparePool* spares);

}  // namespace ntp
