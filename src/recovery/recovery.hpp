#pragma once
// A recovery, phase by phase: what the survivors of a failure do to go on training, and what
// brings dead ranks back. With --kill-mode signal a death surfaces as a PeerFailure from any Comm
// call, and repair() walks its phases in the order they happen:
//
//   1. revoke          every communicator fails fast, so no survivor waits on the dead
//   2. agree, shrink   the survivors agree on the attempt and form the group without the dead
//   3. settle the dead who died, who froze (hang_watch) and when, agreed by the group
//   4. keep the file   a live rank holds the results file, the row a failure kept out written
//   5. reconfigure     the policy's layouts over the survivors, shards healed (Trainer::reconfigure)
//   6. record          the repair's figures and deaths in the results file
//   7. judge           no replica can train and nothing will bring one back: the run ends (exit 3)
//   8. hand over       with --spare-use takeover, spares take the dead ranks at once
//
// A revival (revive(); join() on the new processes) hands dead ranks to new processes, spawned or
// spares from the pool, tells them the run's state, and heals them in with one reconfiguration.
// Under --kill-mode fence the schedule's kills and revivals are one reconfiguration
// (apply_membership).
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fault.hpp"
#include "handover.hpp"
#include "run_state.hpp"
#include "schedule.hpp"
#include "spare_pool.hpp"

namespace ntp {

class Recovery {
 public:
  explicit Recovery(RunState& run) : run_(run) {}

  // Spares (spare_pool.hpp): revivals are served from `pool`, and with --spare-use takeover a
  // death too. `processes`: on the recorder at job start, "pid host" of every spare.
  void use_spares(SparePool* pool, std::vector<std::string> processes = {});
  SparePool* spare_pool() const { return pool_; }
  const std::vector<std::string>& spare_processes() const { return spare_processes_; }

  // Signal mode: a peer died (or a survivor revoked the group) during step s, whose attempt began
  // at t_attempt. Every survivor takes the same phases; a failure during them starts them again
  // over what is left. Returns the seconds it took.
  double repair(int s, const PeerFailure& e, double t_attempt);
  // Fence mode: every rank applies the schedule's kills and revivals of step s at once.
  double apply_membership(int s, const StepEvents& ev);
  // Signal mode, on the survivors: processes take the dead logical ranks `wanted` and are healed.
  double revive(int s, const std::vector<int>& wanted);
  // A new process's side of revive(): the same adoption and reconfiguration.
  double join(int s, const std::vector<int>& ranks);
  // The end of the run for the spares still waiting: every trainer sends it, so none waits for ever.
  void release_spares();
  // The recorder moves: this rank, the lowest live one, reopens the results file its dead
  // predecessor wrote and appends from there.
  void take_over_recorder(const std::vector<int>& lost);

 private:
  // What a repair keeps across its passes. A pass that fails after its shrink has already adopted
  // its deaths, so the next pass's membership no longer holds them: the ranks lost, the spares
  // lost and the unscheduled deaths' revivals are kept until the results record them, each once.
  struct Ledger {
    std::vector<int> at_start;                     // the group when the failure came
    std::vector<int> recorded;                     // ranks whose deaths the results hold already
    std::vector<int> spares_lost;                  // spare keys, not yet recorded
    std::vector<std::pair<int, int>> revivals;     // (rank, step of its revival), not yet recorded
    std::map<int, HangTimes> settled;              // what this host's hang watch said, per rank
  };
  // Phase 3's verdict.
  struct Deaths {
    RepairTimes times;
    std::vector<int> lost;            // this repair's deaths the results do not hold yet
    std::vector<HangTimes> hung;      // per lost rank
    std::vector<HangTimes> spares_hung;  // per spare lost
  };

  void revoke();
  void agree_and_shrink(int s, bool& voted, Ledger& ledger);
  Deaths settle_the_dead(double t_attempt, double t_notice, Ledger& ledger);
  void keep_the_file(const std::vector<int>& lost);
  RecoveryFigures reconfigure_survivors(const std::vector<int>& lost);
  void record(int s, const Deaths& d, const RecoveryFigures& f, Ledger& ledger);
  void stop_if_no_way_forward(int s);
  double hand_over_to_spares(int s, const std::vector<int>& lost);

  // Which of `lost` were hung (hang_watch.hpp): for each, the run times at which it froze (its
  // last heartbeat) and was declared hung, or -1 where it died (or no survivor shared its host).
  // Collective: the group agrees. `settled` keeps what this host's watch said of each rank (a
  // watch says it once) for a repair's later passes.
  std::vector<HangTimes> settle_hung(const std::vector<int>& lost, std::map<int, HangTimes>& settled);
  // Right after a shrink, the unscheduled deaths' revivals (Schedule::repair_unscheduled).
  std::vector<std::pair<int, int>> repair_unscheduled(int s, const std::vector<int>& before);
  // The group is now `group` (after a shrink or a spawn).
  void adopt(std::unique_ptr<Comm> group);
  // The spares take every dead rank lost here at once (takeover: no shrink of the layouts first).
  bool spares_take_all_at_once(const std::vector<int>& lost) const;
  // Those of `ranks` the pool can serve now.
  std::vector<int> served_by_spares(const std::vector<int>& ranks) const;
  double complete_handover(int s, const StepEvents& ev, bool joining, double t_event,
                           const std::function<void(double)>& record_revival);
  JoinMessage join_message(int s, const std::vector<int>& ranks) const;
  std::unique_ptr<Comm> spawn_replacements(const JoinMessage& m);
  std::unique_ptr<Comm> hand_to_spares(const JoinMessage& m, const std::vector<std::pair<int, int>>& assign);
  void align_clock(bool joining);

  RunState& run_;
  SparePool* pool_ = nullptr;                 // with spares: the pool of trainers and spares
  std::vector<std::string> spare_processes_;  // on the recorder at job start: "pid host" of each spare
};

}  // namespace ntp
