// What --kill-mode signal adds to the training loop: the repair after a peer's death (revoke,
// agree, shrink, reconfigure), replacement processes (spawn, join message, heal), and the
// recorder moving to the next live rank.
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fault.hpp"
#include "option_table.hpp"
#include "run.hpp"
#include "spares.hpp"
#include "training_run.hpp"

namespace ntp {

// The join message as JSON: each field named once, here (nlohmann's macros); the options go
// through their own record (option_table.hpp), as in the results file.
void to_json(nlohmann::json& j, const Options& o) { j = to_json(o); }
void from_json(const nlohmann::json& j, Options& o) { o = options_from_json(j); }
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Peak, gflops, source)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StragglerDetector::RankState, straggler, streak)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JoinState, logical_rank, alive, rank_speed, valid, lost, cursor, initial_cursor, steps,
                                   initial_steps, restore_path)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JoinMessage, options, step, elapsed, ranks, state, recorder, hosts,
                                   peak, added_revivals, stragglers, evicted, probe_base)

nlohmann::json to_json(const JoinMessage& m) { return m; }
JoinMessage join_message_from_json(const nlohmann::json& j) { return j.get<JoinMessage>(); }

std::string to_text(const SparePlan& plan) {
  if (plan.end) return R"({"kind": "end"})";
  return nlohmann::json{{"kind", "take"}, {"assign", plan.assign}, {"join", to_json(plan.join)}}.dump();
}

SparePlan spare_plan_from_text(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  SparePlan plan;
  plan.end = j.at("kind") == "end";
  if (!plan.end) {
    plan.assign = j.at("assign").get<std::vector<std::pair<int, int>>>();
    plan.join = join_message_from_json(j.at("join"));
  }
  return plan;
}

namespace {
// One repair as the group saw it: the first and the last rank's notice of the failure, and the
// repair's time from the last notice to the last rank's end.
struct RepairClock {
  double first_notice, last_notice, repair;
};
// The repair after the last notice: a rank that noticed first waits in the agreement for the
// others, which is the notice's time, not the repair's.
RepairClock reduce_repair_clock(Comm& group, double notice, double done) {
  double v[3] = {notice, -notice, done};  // one max-reduction: the max of -t is the min of t
  group.allreduce_max(v, 3);
  return {-v[1], v[0], v[2] - v[0]};
}
}  // namespace

// A string from the group's rank 0 to every member.
std::string broadcast_string(Comm& c, std::string s) {
  long long n = static_cast<long long>(s.size());
  c.broadcast(&n, sizeof n, 0);
  s.resize(static_cast<std::size_t>(n));
  c.broadcast(s.data(), s.size(), 0);
  return s;
}

// The group is now `group` (after a shrink or a spawn): every member's logical rank, and the
// trainer talks over it.
void TrainingRun::adopt(std::unique_ptr<Comm> group) {
  trainer_->set_group(*group);
  members_.adopt(std::move(group));
  for (int r : members_.dead()) forget_straggler(r);
}

// What the processes taking over `ranks` at step s are told of the run.
JoinMessage TrainingRun::join_message(int s, const std::vector<int>& ranks) const {
  JoinMessage m;
  m.options = o_;
  m.options.threads = threads_;
  m.step = s;
  m.elapsed = now();
  m.ranks = ranks;
  m.state = trainer_->join_state(-1);
  m.recorder = members_.recorder;
  m.hosts = members_.hosts;
  m.peak = peak_;
  m.added_revivals = schedule_.added();
  for (int r = 0; r < int(members_.evicted.size()); ++r)
    if (members_.evicted[r]) m.evicted.push_back(r);
  m.probe_base = stragglers_.probe_base();
  m.stragglers = stragglers_.state();
  return m;
}

// New processes for m.ranks (MPI_Comm_spawn, then merged): the survivors' group with them, in
// logical order.
std::unique_ptr<Comm> TrainingRun::spawn_replacements(const JoinMessage& m) {
  std::vector<std::string> args;  // the child learns everything from the join message
  // On a job of several hosts, each replacement goes back to its rank's host (a node's ranks to
  // their node, where TP groups must stay); on one host, wherever the launcher has room.
  std::vector<std::string> where;
  if (std::set<std::string>(members_.hosts.begin(), members_.hosts.end()).size() > 1)
    for (int r : m.ranks) where.push_back(members_.hosts[r]);
  auto merged = members_.group().spawn(std::filesystem::read_symlink("/proc/self/exe").string(), args,
                              static_cast<int>(m.ranks.size()), where);
  broadcast_string(*merged, merged->rank() == 0 ? to_json(m).dump() : std::string());
  return merged->split(0, members_.me);
}

// Spares take m.ranks (`assign`: spare key, logical rank): the plan goes to the whole pool, and the
// trainers' group, spares included, comes back in logical order.
std::unique_ptr<Comm> TrainingRun::hand_to_spares(const JoinMessage& m, const std::vector<std::pair<int, int>>& assign) {
  spares_.pool->exchange(to_text(SparePlan{.end = false, .assign = assign, .join = m}));
  return spares_.pool->regroup(assign);
}

// Signal mode, on the survivors: processes take the dead logical ranks `wanted` (spares where the
// pool can serve them all; on one host, else new ones spawned), are told the run's state, and are
// healed from their peers. On a job of several hosts the ranks no spare can serve stay dead.
double TrainingRun::revive(int s, const std::vector<int>& wanted) {
  progress(s, "a revival: spawn or spares, merge, heal");
  const double t_event = now();
  auto assign = spares_ ? spares_.pool->choose(wanted, members_.hosts) : std::vector<std::pair<int, int>>{};
  std::vector<int> ranks = wanted;
  if (assign.size() < wanted.size() && spares_) {
    if (std::set<std::string>(members_.hosts.begin(), members_.hosts.end()).size() == 1) {
      assign.clear();  // spawn them all
    } else {
      ranks.clear();
      for (const auto& [key, rank] : assign) ranks.push_back(rank);
      std::vector<int> stay;
      for (int r : wanted)
        if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) stay.push_back(r);
      if (root()) record_->record_no_spare(s, t_event, stay);
      if (ranks.empty()) return 0;
    }
  }
  {
    PhaseScope phase(trainer_->clock(), Phase::Revival);
    const JoinMessage m = join_message(s, ranks);
    adopt(assign.empty() ? spawn_replacements(m) : hand_to_spares(m, assign));
  }
  StepEvents ev;
  ev.revive = ranks;
  ev.nodes_revived = schedule_.at(s).nodes_revived;
  return complete_handover(s, ev, false, t_event, [&](double spawn_seconds) {
    if (!root()) return;
    std::vector<SpareHandover> handover;
    for (const auto& [key, rank] : assign)
      handover.push_back({spares_.pool->spare_number(key), spares_.pool->host_of_spare(key), rank});
    record_->record_revival(s, t_event, spawn_seconds, ranks, handover, o_.spares_take_over_deaths());
  });
}

// A handover's second half, on both sides, once the new processes are members of the group: the
// clocks aligned, the processes and (survivors, through `record_revival`) the revival recorded,
// and the reconfiguration that heals the new processes. A failure in it (a survivor or a new
// process dies, or the schedule's kill `at: handover`) is repaired as one in a step, by the merged
// group: the new processes hold no state yet, and a heal cut short leaves every rank's state as it
// was before it (Trainer::reconfigure), so the repair heals them as the handover would have.
// Returns the revival's seconds (survivors: from `t_event`, its start).
double TrainingRun::complete_handover(int s, const StepEvents& ev, bool joining, double t_event,
                                      const std::function<void(double)>& record_revival) {
  bool recorded = false;
  try {
    {
      PhaseScope phase(trainer_->clock(), Phase::Revival);
      align_clock(joining);
      record_processes(ev.revive);
    }
    const double spawn_seconds = joining ? 0 : now() - t_event;
    if (record_revival) record_revival(spawn_seconds);
    recorded = true;
    if (liveness_->doomed_at(StepPoint::Handover)) die();
    return spawn_seconds + reconfigure(s, ev);
  } catch (const PeerFailure& e) {
    const double t_failure = now();
    const double repair = recover(s, e, t_failure);
    // What the failure came before (a process is recorded once).
    record_processes(ev.revive);
    if (record_revival && !recorded) record_revival(t_failure - t_event);
    if (root()) record_->record_revived_in_repair(s, ev, t_failure);
    return (joining ? 0 : t_failure - t_event) + repair;
  }
}

// The repair's change of configuration: the policy's over the survivors, or none yet where spares
// take every rank lost here over at once (take_over(): the one reconfiguration of their handover
// heals them in, and the survivors do not first shrink to the lost ranks' absence). Not under
// restart, which reloads the checkpoint once a replica is whole again.
Recovery TrainingRun::reconfigure_survivors(const std::vector<int>& lost) {
  bool at_once = !lost.empty() && spares_ && o_.spares_take_over_deaths() && o_.policy != Policy::Restart;
  if (at_once) {
    std::vector<int> served;
    for (const auto& [key, rank] : spares_.pool->choose(members_.dead(), members_.hosts)) served.push_back(rank);
    for (int r : lost) at_once = at_once && std::find(served.begin(), served.end(), r) != served.end();
  }
  return at_once ? trainer_->forget(members_.training()) : trainer_->reconfigure(members_.training());
}

// --spare-use takeover, right after the repair of a death: spares take the dead ranks now, when the
// pool can serve them all (a later revival of those ranks is then moot).
double TrainingRun::take_over(int s, const std::vector<int>& lost) {
  if (!spares_ || !o_.spares_take_over_deaths()) return 0;
  // Every dead rank, not only this repair's: a whole host's deaths can come in two repairs, and a
  // spare host serves the host once all its ranks are known dead (SparePool::choose).
  const std::vector<int> dead = members_.dead();
  std::vector<int> served, unserved;
  for (const auto& [key, rank] : spares_.pool->choose(dead, members_.hosts)) served.push_back(rank);
  for (int r : lost)
    if (!members_.alive[r] && std::find(served.begin(), served.end(), r) == served.end()) unserved.push_back(r);
  if (root() && !unserved.empty()) record_->record_no_spare(s, now(), unserved);
  return served.empty() ? 0 : revive(s, served);
}

void TrainingRun::use_spares(SparePool* pool, std::vector<std::string> processes) {
  spares_.pool = pool;
  spares_.processes = std::move(processes);
}

// The end of the run for the spares still waiting: every trainer sends it, so none waits for ever.
void TrainingRun::release_spares() {
  if (!spares_) return;
  try {
    spares_.pool->exchange(to_text(SparePlan{.end = true, .assign = {}, .join = {}}));
  } catch (const PeerFailure&) {
    // A spare died: the others see the trainers leave, and end when none is left (run_spare).
  }
}

// A new process's side of revive(): the same adoption and reconfiguration.
double TrainingRun::join(int s, const std::vector<int>& ranks) {
  progress(s, "joining the survivors");
  members_.gather_order();
  StepEvents ev;
  ev.revive = ranks;
  return complete_handover(s, ev, true, now(), nullptr);
}

// Every rank reads the run's clock as seconds since the survivors' start. A new process first set
// it from the join message's `elapsed`, which is late by the message and the process's own set-up
// (2-17 ms on 2 busy cores: enough to put a notice before the step that it interrupted). Here it
// takes the survivors' reading right after a barrier, so only the barrier's skew separates them.
void TrainingRun::align_clock(bool joining) {
  members_.group().barrier();
  double t = joining ? 0.0 : now();
  members_.group().allreduce_max(&t, 1);
  if (joining)
    t0_ = std::chrono::steady_clock::now() -
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t));
}

// The recorder moves: the lowest live logical rank (this one, now the group's rank 0) reopens the
// results file its dead predecessor wrote and appends from there.
void TrainingRun::take_over_recorder(const std::vector<int>& lost) {
  record_ = std::make_unique<RunRecord>(o_, *trainer_, peak_, members_.hosts, members_.size());
  record_->reopen(members_.me, lost, now());
}

// Signal mode: a peer died (or a survivor revoked the group). Every survivor takes the same path:
// an agreement vote for the attempt (unless the failure came from that vote), shrink to the live
// ranks, and the policy's reconfiguration over them. Returns the seconds it took.
//
// A failure during the repair starts it again over what is left. A pass that fails after its
// shrink has already adopted its deaths, so the next pass's membership no longer holds them: the
// ranks lost, the spares lost and the unscheduled deaths' revivals are kept across passes until
// the results record them, each once.
double TrainingRun::recover(int s, const PeerFailure& e, double t_attempt) {
  double t_notice = now();
  double total = 0;
  bool voted = dynamic_cast<const CommitRefused*>(&e) != nullptr;
  const std::vector<int> at_start = members_.in_group;
  std::vector<int> recorded;                        // ranks whose deaths the results hold already
  std::vector<int> spares_lost;                     // spare keys, not yet recorded
  std::vector<std::pair<int, int>> repairs;         // (rank, step of its revival), not yet recorded
  std::map<int, HangTimes> settled;                 // what this host's hang watch said, per rank
  for (;;) {
    progress(s, "the repair after a failure: revoke, agree, shrink, reconfigure");
    PhaseScope phase(trainer_->clock(), Phase::Recovery);  // the repair's calls too, not only the reconfiguration
    try {
      trainer_->revoke_all();
      if (spares_) spares_.pool->revoke();  // the spares wait in the pool: they repair it with us
      if (!voted) members_.group().agree(false);
      voted = false;
      const std::vector<int> before = members_.in_group;
      adopt(members_.group().shrink());
      if (liveness_->doomed_at(StepPoint::Repair)) die();  // a schedule's failure during this repair (at: repair)
      if (spares_)
        for (int key : spares_.pool->repair()) spares_lost.push_back(key);
      for (const auto& added : repair_unscheduled(s, before)) repairs.push_back(added);
      if (!members_.alive[members_.recorder]) members_.recorder = members_.in_group.front();
      const RepairClock clock = reduce_repair_clock(members_.group(), t_notice, now());
      std::vector<int> lost;  // the deaths of this repair that the results do not hold yet
      for (int r : at_start)
        if (!members_.alive[r] && std::find(recorded.begin(), recorded.end(), r) == recorded.end()) lost.push_back(r);
      const std::vector<HangTimes> hung = settle_hung(lost, settled);
      // Spares beat under their key (run_spare): a frozen one was, or is now, ended by its host.
      const std::vector<HangTimes> spares_hung = settle_hung(spares_lost, settled);
      if (root()) {  // before the reconfiguration, so that a missing row shows the step as it ran
        if (!record_) take_over_recorder(lost);
        record_->write_missing_row(finished_, members_.group().size());  // the previous step's, if a failure kept it out
      }
      const int steps_before = trainer_->steps_taken();
      stragglers_.resync(members_.evicted, trainer_->rank_speeds());
      const Recovery rc = reconfigure_survivors(lost);
      release_free_memory();
      const RecoveryFigures f = figures(rc, steps_before);
      // Recorded before any verdict on the run: a death that ends it (exit 3) is a death too.
      if (root()) {
        record_->record_repair(s, schedule_, repairs, lost, {t_attempt, clock.first_notice, clock.last_notice, clock.repair}, f, hung);
        if (spares_) record_->record_spares_lost(s, clock.first_notice, *spares_.pool, spares_lost, spares_hung);
      }
      recorded.insert(recorded.end(), lost.begin(), lost.end());
      spares_lost.clear();
      repairs.clear();
      stop_if_no_way_forward(s);
      take_over(s, lost);
      total += (now() - t_notice);
      return total;
    } catch (const PeerFailure&) {
      // Another failure during the repair: the same path again, over what is left.
      total += now() - t_notice;
      t_notice = now();
    }
  }
}

// After a repair: no replica trains, and neither the revivals still to come (were every one of them
// to succeed) nor a spare taking a dead rank over would let one train again, so the run cannot go
// on (exit code 3). Under restart, a rank that died unscheduled and that nothing revives leaves
// every replica idle to the end: that too is no way forward.
void TrainingRun::stop_if_no_way_forward(int s) {
  if (trainer_->configuration().active_replicas() > 0) return;
  if (spares_ && o_.spares_take_over_deaths() && !spares_.pool->choose(members_.dead(), members_.hosts).empty()) return;
  std::vector<char> hope = members_.alive;
  for (int r : schedule_.revived_after(s)) hope[r] = 1;
  if (plan_for(o_, trainer_->topology(), hope).active_replicas() > 0) return;
  throw NoProgress(fmt::format("step {}: rank(s) {} are dead, no replica can train under --policy {} and no "
                               "revival is scheduled that would let one train again",
                               s, members_.dead(), o_.policy));
}

// A rank MPI reported failed may have been hung, not dead: the survivors of its host know
// (HangWatch::settle); the group agrees on when it froze and when it was declared hung.
std::vector<HangTimes> TrainingRun::settle_hung(const std::vector<int>& lost, std::map<int, HangTimes>& settled) {
  std::vector<double> t(2 * lost.size(), -1);
  for (std::size_t i = 0; i < lost.size(); ++i) {
    auto it = settled.find(lost[i]);
    if (it == settled.end()) {
      HangTimes mine;
      if (HangWatch* watch = liveness_->hang_watch())
        if (const auto h = watch->settle(lost[i])) {
          const double at = now();
          mine = {at - h->froze_ago, at - h->declared_ago};
        }
      it = settled.emplace(lost[i], mine).first;
    }
    t[2 * i] = it->second.froze, t[2 * i + 1] = it->second.declared;
  }
  if (!lost.empty()) members_.group().allreduce_max(t.data(), static_cast<int>(t.size()));
  std::vector<HangTimes> out;
  for (std::size_t i = 0; i < lost.size(); ++i) out.push_back({t[2 * i], t[2 * i + 1]});
  return out;
}

// Right after a shrink: every member of `before` that is gone and had no kill event in this step
// died unscheduled; with a generator in the schedule it is revived repair_steps later
// (Schedule::repair_unscheduled decides). Returns (rank, step of its revival) for those added.
// Nothing here communicates, so a survivor that fails later in the repair and shrinks again still
// adds the same.
std::vector<std::pair<int, int>> TrainingRun::repair_unscheduled(int s, const std::vector<int>& before) {
  std::vector<std::pair<int, int>> added;
  for (int r : before)
    if (!members_.alive[r])
      if (const int back = schedule_.repair_unscheduled(s, r, o_.steps)) added.emplace_back(r, back);
  return added;
}

int run_joined(Comm& parent) {
  const JoinMessage m = join_message_from_json(nlohmann::json::parse(broadcast_string(parent, "")));
  // The new processes were started together: the k-th (its rank in its own MPI_COMM_WORLD) takes
  // the k-th logical rank revived.
  const int k = world_comm()->rank();
  const int me = m.ranks.at(k);
  return train_replacement(m, me, parent.split(0, me), nullptr);
}

int train_replacement(const JoinMessage& m, int logical_rank, std::unique_ptr<Comm> group, SparePool* spares) {
  Schedule schedule;
  if (!m.options.schedule.empty())
    schedule = Schedule::load(m.options.schedule, int(m.state.alive.size()), m.options.steps, m.hosts);
  for (const auto& [step, rank] : m.added_revivals) schedule.add_revival(step, rank);
  TrainingRun run(m, logical_rank, std::move(group), std::move(schedule));
  run.use_spares(spares);
  const double recovery_seconds = run.join(m.step, m.ranks);
  return run.train(m.step, recovery_seconds);
}

}  // namespace ntp
