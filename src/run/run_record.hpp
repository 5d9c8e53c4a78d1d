#pragma once
// What the recorder rank writes and prints: the results file (opened at the start, or reopened
// when the recorder moves), each step's row and line, the events and lines of recoveries,
// revivals and checkpoints, and the summary with the closing lines. TrainingRun
// (training_run.hpp) makes every collective call and hands the figures here; only the recorder's
// rank holds a RunRecord, so nothing here communicates.
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm_counting.hpp"
#include "emulated_clock.hpp"
#include "event_kind.hpp"
#include "machine_profile.hpp"
#include "recorder.hpp"
#include "schedule.hpp"
#include "straggler.hpp"
#include "straggler_policy.hpp"
#include "trainer.hpp"

namespace ntp {

// Whether some rank's peers are expected to wait on it this step, as they would on the real
// machine: a slowed rank, replicas not alike (degrees, layouts, a boost), or a TP group whose
// shards differ in size (4 heads over 3 ranks: 2, 1, 1). Late transfers then are waits, not overruns.
bool peers_uneven(const Configuration& cfg, bool slowed);

// The peak MFU is measured against, and where it came from.
struct Peak {
  double gflops = 0;
  std::string source;
};

// A finished attempt at a step (its step committed everywhere, or it was an idle slot): what its
// row is made of.
struct Attempt {
  int step = 0;
  StepResult r;
  double t_start = 0, t_end = 0, recovery_seconds = 0, idle_seconds = 0;
  bool slowed = false;  // some rank ran slowed (a schedule's slow event)
  // Every rank's calls and bytes on the run's group since its last report (comm_counting.hpp);
  // -1 calls: no reports were gathered (a row written after a failure).
  CommTally control{.calls = -1, .bytes = std::nan("")};
};

// A reconfiguration's figures over the group: the slowest rank's detect, reconfigure and heal
// seconds, every rank's healed bytes, and the optimizer step before it.
struct RecoveryFigures {
  Reconfiguration rc;
  double detect = 0, reconfigure = 0, heal = 0;  // the slowest rank's seconds of each part
  double bytes = 0;       // every rank's
  double rank_bytes = 0;  // the busiest rank's link: the most it sent or received
  int steps_before = 0;
  double seconds() const { return detect + reconfigure + heal; }
};

// What --straggler-policy did about a verdict: kind evict, evict_refused (why says why), rejoin,
// rebalance (its replica's shares follow its speed) or rebalance_end.

// A repair after real deaths, as the survivors measured it: the interrupted attempt's start, the
// first and the last survivor's notice, and the revoke + agree + shrink after the last notice.
struct RepairTimes {
  double t_attempt = 0, first = 0, last = 0, repair = 0;
};

// A spare that takes a logical rank (or, with rank -1, one that died while waiting).
struct SpareHandover {
  int spare = 0;  // its number, in job order
  std::string host;
  int rank = -1;
};

// A rank found hung (hang_watch.hpp), in run seconds: its last heartbeat and when a peer of its
// host declared it hung and ended it; both < 0 for a rank that died.
struct HangTimes {
  double froze = -1, declared = -1;
  bool hung() const { return declared >= 0; }
};

// --kill-mode and why, for the banner, the closing line and the results file: "signal (kills are
// real ...)" or "fence (kills are emulated: ...)".
std::string describe_kill_mode(const Options& o);

class RunRecord {
 public:
  // The run's facts live in the TrainingRun, which outlives its record. ranks: the job's logical
  // ranks, living or not.
  RunRecord(const Options& o, const Trainer& trainer, const Peak& peak, const std::vector<std::string>& hosts,
            int ranks)
      : o_(o), costs_(recovery_costs(o.machine, o.recovery_given)), trainer_(trainer), peak_(peak), hosts_(hosts), ranks_(ranks), phase_rows_(ranks), usage_rows_(ranks) {}

  // A new results file with the run's attributes (threads: per rank).
  void open(int threads);
  // The recorder moves: logical rank `me` reopens the file its dead predecessor(s) `lost` wrote and
  // appends from there (t: the run's clock).
  void reopen(int me, const std::vector<int>& lost, double t);
  // /ranks/incarnations: who[k] ("pid host") holds logical rank members[k]; only those in `only`
  // are recorded unless it is empty (the start of the run, at time 0).
  void incarnations(const std::vector<int>& members, const std::vector<std::string>& who,
                    const std::vector<int>& only, double t);

  // The seconds an idle slot lasts: as long as a healthy step would (the repair is measured in steps).
  double idle_wait() const;
  // The current step's per-rank parts of its row, filled from the metrics gather.
  void clear_rank_rows();
  void set_rank_row(int rank, const std::array<double, kPhaseCount>& phases, RankUsage usage);
  // The step's row and its line. group_size: the ranks that took part (MFU's denominator). A row
  // a failure kept out is written before the repair that followed it is recorded.
  void record_step(const Attempt& a, int group_size);
  // The attempt's row, if a failure kept it out of the file. It holds the phases the recorder
  // knows (its own when the metrics gather failed, none when it inherited the file).
  void write_missing_row(const Attempt& a, int group_size);

  // A reconfiguration's events and its line. kill_details and t_kill: the deaths' causes and time
  // when they were real (signal mode).
  void record_recovery(int s, const StepEvents& ev, const RecoveryFigures& f, double t_event,
                       const std::vector<std::string>* kill_details = nullptr, double t_kill = -1);
  // A schedule's slowdown of a rank, and a straggler found or gone (straggler.hpp), at step s.
  void record_slowdown(int s, const Slowdown& d, double t);
  void record_straggler(int s, const StragglerVerdict& v, double t);
  // What the straggler policy did at step s, with the reconfiguration's figures (null when nothing
  // changed, or for the second and later actions of one reconfiguration).
  void record_straggler_action(int s, const StragglerAction& a, const RecoveryFigures* f, double t);
  // A repair after the deaths of `lost` in step s (repairs: the unscheduled deaths and the step
  // each comes back at), then its reconfiguration. hung: for each of `lost`, when it froze and was
  // declared hung, if it was (TrainingRun::settle_hung).
  void record_repair(int s, const Schedule& schedule, const std::vector<std::pair<int, int>>& repairs,
                     const std::vector<int>& lost, const RepairTimes& t, const RecoveryFigures& f,
                     const std::vector<HangTimes>& hung);
  // Processes took `ranks` at step s in `seconds`: new ones spawned, or `spares` (takeover: in the
  // repair of the deaths, else at the revival). Its events and line.
  void record_revival(int s, double t_event, double seconds, const std::vector<int>& ranks,
                      const std::vector<SpareHandover>& spares, bool takeover);
  // A revival's events (each rank's `revive`, each host's `node_up`) where its own reconfiguration
  // did not come: a failure cut the handover short and the repair that followed healed the new
  // processes (its events are the repair's).
  void record_revived_in_repair(int s, const StepEvents& ev, double t);
  // No spare was left for `ranks` (a takeover, or a revival on a job of several hosts): they stay dead.
  void record_no_spare(int s, double t, const std::vector<int>& ranks);
  // Spares the pool lost in a repair (rank -1); `hung`: what their settled heartbeats say of each.
  void record_spares_lost(int s, double t, const std::vector<SpareHandover>& lost, const std::vector<HangTimes>& hung);
  // The root attribute `spares`: each spare's "pid host" at job start, in job order.
  void record_spares(const std::vector<std::string>& processes);
  void spares_left(int n);
  void record_checkpoint(int s, double t, double seconds, const std::string& path);
  void note_no_final_checkpoint();
  // The end-of-run checkpoint, written for --replay and resuming, is ntpbench's, not the emulated
  // job's: under paced timing its seconds here are charged nothing.
  void note_final_checkpoint(double t, double seconds);

  // Ranks share cores under --timing wall: said once, and recorded (root attribute shared_cores).
  void note_shared_cores(double ranks_per_core);
  // The worst ratio of real to emulated compute time a rank reported (paced timing).
  void note_overrun(double ratio);
  // Root attribute paced_machine (paced_machine.hpp).
  void record_paced_machine(const nlohmann::json& machine);
  // /summary and the closing lines (code: the run's verdict, 4 for a non-finite last step).
  void finish(double wall, const std::string& last_checkpoint, int skipped_steps, int code);
  // After a run that could not go on (why): /summary over the rows so far, and the error line.
  void abandon(double wall, const std::string& why);

 private:
  // How an event's seconds go on the emulated clock (emulated_clock.hpp): a span of the run clock
  // (a wait, or work run slowed: over the factor), this host's own work charged the machine's
  // price, or a figure already on the rows' clock (the rolled-back steps' time to recompute).
  enum class Clocked { Span, Charged, Figure };
  // Appends an event at run-clock t lasting `seconds` here; `emulated`: the charge (Charged) or
  // the figure (Figure). Under wall timing every event is a Span on the run clock.
  // Returns its duration on the emulated clock.
  double event(double t, int s, EventKind kind, int rank, int replica, double bytes, double seconds,
               const std::string& detail, Clocked how = Clocked::Span, double emulated = 0);
  // What the machine pays to heal (or load) f's bytes: the most any rank sent or received (or
  // read), as the emulated shape's, over the scale-out link (heal) or the checkpoint storage (load).
  double heal_charge(const RecoveryFigures& f) const;
  double load_charge(const RecoveryFigures& f) const;
  // The machine's costs (jobs/machines/*.yaml) and the emulated job's bytes per byte here.
  const RecoveryCosts& costs() const { return costs_; }
  double state_bytes_ratio() const;
  bool paced() const { return o_.pacing.enabled; }
  void start_clock();
  void write_summary(double wall);
  // A reconfiguration that reloaded the last checkpoint (--policy restart, or no live replica held
  // every shard): its restore, rollback and recompute events (the rows after it rolled back).
  // Returns the console's words for it.
  std::string record_restore(int s, const RecoveryFigures& f, double t_event);
  // The revive events of `ev`'s ranks, and one node event per host of `hosts` (kind node_down or
  // node_up) naming its ranks.
  void revive_events(int s, const std::vector<int>& ranks, double t);
  void node_events(int s, const std::vector<std::string>& hosts, EventKind kind, double t);
  std::string slots_line(int skipped_steps) const;
  std::string overrun_line() const;
  void warn_first_overrun(const StepRow& row);

  const Options& o_;
  const RecoveryCosts costs_;  // the machine's, with the run's own figures in their place
  const Trainer& trainer_;
  const Peak& peak_;
  const std::vector<std::string>& hosts_;  // each logical rank's host at job start
  const int ranks_;
  std::unique_ptr<Recorder> rec_;
  std::vector<std::array<double, kPhaseCount>> phase_rows_;
  std::vector<RankUsage> usage_rows_;  // every rank's process after the step (-1: none)
  std::vector<double> healthy_step_seconds_;
  double last_step_seconds_ = 0;
  double recorder_seconds_ = 0;  // time appending and flushing rows
  double worst_overrun_ = 0;     // paced: real / emulated compute time, the worst any rank reported
  bool warned_overrun_ = false;  // paced: the first step past the limit was announced
  EmulatedClock clock_;          // the rows' and events' clock: the run clock under wall timing
  double recovery_since_row_ = 0;  // paced: the recovery events' emulated seconds since the last row
};

}  // namespace ntp
