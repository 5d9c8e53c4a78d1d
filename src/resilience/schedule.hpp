#pragma once
// Failure schedules (YAML):
//
//   events:                      # explicit, logical ranks (numbered as at job start)
//     - {step: 10, kill: [3]}    # takes effect at the start of the step
//     - {step: 12, kill: [5], at: backward}   # --kill-mode signal: dies inside the step
//     - {step: 14, hang: [6], at: forward}    # stops answering there (SIGSTOP), found and fenced
//     - {step: 5, slow: [2], factor: 2.0}     # runs at half speed from step 5 (a straggler) ...
//     - {step: 25, slow: [2], factor: 1}      # ... until step 25; link_factor: its links too
//     - {step: 40, revive: [3]}
//     - {step: 8, kill_node: node2}          # every rank on host node2 (a node failure)
//     - {step: 20, revive_node: node2}       # new processes for them, placed on node2
//   random:                      # and/or a seeded generator
//     mtbf_steps: 200            # mean steps between failures of one rank (exponential)
//     repair_steps: 20           # a failed rank is revived this many steps later (also an unscheduled death)
//     seed: 7
//     at: any                    # optional: the phase of its kills (default start; any: drawn)
//     hang_fraction: 0.25        # optional: the share of its failures that are hangs (default 0)
//     slow_mtbf_steps: 100       # optional, all three: a rank starts a slow episode every 100 steps
//     slow_steps: 10             #   on average, lasting 10 steps,
//     slow_factor: 2             #   at half speed
//
// `at` (signal kill mode; fence kills always act at the start): start (before the step's first
// collective), forward, backward, sync (inside the gradient sync), optimizer (after the sync,
// before the update).
// A hang is a kill whose process stops instead of dying (every thread stopped, as `kill -STOP`):
// under --kill-mode signal, MPI's failure detector finds it within --failure-timeout and a survivor
// on its host ends it (SIGKILL); from there it is a death. Under --kill-mode fence it is a kill.
// kill_node / revive_node name a host as the ranks report it (gethostname; Slurm's node name on a
// cluster): they stand for the logical ranks that ran on that host at job start, resolved with
// `hosts` (one per logical rank), which the program gathers after start-up.
// Everything is validated before step 1; an error names the file, the line and the problem.
// Random failures only touch ranks that have no explicit events.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "step_point.hpp"

namespace ntp {

struct ScheduleError : std::runtime_error {
  using std::runtime_error::runtime_error;
};


// A rank slowed from this step on: compute takes `factor` times as long, transfers `link_factor`
// times (Pacer::set_slowdown); 1 and 1 end an episode. The slowdown is the GPU's: a process that
// later replaces the rank (a revival, a spare) starts at full speed.
struct Slowdown {
  int rank;
  double factor = 1, link_factor = 1;
  bool operator==(const Slowdown&) const = default;
};

struct StepEvents {
  std::vector<int> kill, revive;  // logical ranks, ascending
  std::vector<StepPoint> kill_at;  // where in the step each kill strikes, parallel to `kill` (Repair: in the repair of another failure of the step, after the survivors' shrink)
  std::vector<char> kill_hangs;   // 1 where that kill is a hang (the process stops, not dies)
  std::vector<std::string> nodes_killed, nodes_revived;  // kill_node / revive_node hosts, ascending
  std::vector<Slowdown> slow;  // by rank, ascending
};

class Schedule {
 public:
  Schedule() = default;  // no failures
  // Parses and validates; throws ScheduleError, also for an empty schedule (no events, no 'random').
  // `hosts`: the host of each logical rank (needed only by kill_node / revive_node).
  static Schedule load(const std::string& path, int world_size, int steps,
                       const std::vector<std::string>& hosts = {});
  static Schedule parse(const std::string& yaml, const std::string& name, int world_size, int steps,
                        const std::vector<std::string>& hosts = {});

  // Events taking effect at the start of `step` (empty when none).
  const StepEvents& at(int step) const;
  bool empty() const { return events_.empty(); }
  // Is any rank revived at a step after `step`?
  bool revival_after(int step) const;
  // The ranks a revival after `step` brings back (scheduled or added), ascending, each once.
  std::vector<int> revived_after(int step) const;
  int kills() const;
  int revives() const;
  const std::map<int, StepEvents>& events() const { return events_; }

  // The generator's repair time (`random: repair_steps`); 0 when the schedule has no generator.
  int repair_steps() const { return repair_steps_; }
  // A process of logical rank `rank` died at `step`. Unless this step has a kill event for it (then
  // the schedule's own revival brings it back), it died unscheduled (signal mode: killed from
  // outside, or with another rank's failure); with a generator the rank then comes back
  // repair_steps later, as a generated failure would: a revival is added there, unless one is
  // already due by then or that step is past `steps`. Returns the added revival's step, or 0.
  // Every survivor calls it with the same arguments (after the shrink's agreement), so their
  // schedules stay the same; a repeated call adds nothing.
  int repair_unscheduled(int step, int rank, int steps);
  // Adds a revival of `rank` at `step` (repair_unscheduled's; a replacement process replays added()).
  void add_revival(int step, int rank);
  // The revivals added while the run goes, (step, rank) in the order added.
  const std::vector<std::pair<int, int>>& added() const { return added_; }

 private:
  std::map<int, StepEvents> events_;
  int repair_steps_ = 0;
  std::vector<std::pair<int, int>> added_;
};

}  // namespace ntp
