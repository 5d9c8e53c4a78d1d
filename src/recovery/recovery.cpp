// The phases of a recovery (recovery.hpp lists them), a revival's handover, and the spares' part.
#include "recovery.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "machine.hpp"

namespace ntp {

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

// ---- The repair after a failure, phase by phase -------------------------------------------------

double Recovery::repair(int s, const PeerFailure& e, double t_attempt) {
  Ledger ledger;
  ledger.at_start = run_.members.in_group;
  bool voted = dynamic_cast<const CommitRefused*>(&e) != nullptr;  // the failure came from the vote itself
  double total = 0, t_notice = run_.now();
  for (;;) {
    run_.progress(s, "the repair after a failure: revoke, agree, shrink, reconfigure");
    PhaseScope phase(run_.trainer->clock(), Phase::Recovery);  // the repair's calls too, not only the reconfiguration
    try {
      revoke();
      agree_and_shrink(s, voted, ledger);
      const Deaths deaths = settle_the_dead(t_attempt, t_notice, ledger);
      keep_the_file(deaths.lost);
      const RecoveryFigures f = reconfigure_survivors(deaths.lost);
      record(s, deaths, f, ledger);
      stop_if_no_way_forward(s);
      hand_over_to_spares(s, deaths.lost);
      return total + (run_.now() - t_notice);
    } catch (const PeerFailure&) {
      // Another failure during the repair: the same phases again, over what is left.
      total += run_.now() - t_notice;
      t_notice = run_.now();
    }
  }
}

// 1. Revoke: every communicator of the trainer fails fast from now on, on every survivor; the
// spares waiting in the pool wake and repair it with the trainers.
void Recovery::revoke() {
  run_.trainer->revoke_all();
  if (pool_) pool_->revoke();
}

// 2. Agree and shrink: the survivors vote on the attempt (unless the failure came from that vote,
// `voted`: cleared once past the vote) and form the group of the live ranks. Nothing after the shrink communicates until phase 3, so a
// survivor that fails later in the repair and shrinks again still adds the same revivals.
void Recovery::agree_and_shrink(int s, bool& voted, Ledger& ledger) {
  if (!voted) run_.members.group().agree(false);
  voted = false;  // a failure from here on is met by a new pass, which votes again
  const std::vector<int> before = run_.members.in_group;
  adopt(run_.members.group().shrink());
  if (run_.liveness->doomed_at(StepPoint::Repair)) run_.die();  // a schedule's failure during this repair (at: repair)
  if (pool_)
    for (int key : pool_->repair()) ledger.spares_lost.push_back(key);
  for (const auto& added : repair_unscheduled(s, before)) ledger.revivals.push_back(added);
  if (!run_.members.alive[run_.members.recorder]) run_.members.recorder = run_.members.in_group.front();
}

// 3. Settle the dead: the repair's clock over the group, the deaths the results do not hold yet,
// and which of them (and of the spares lost) were hung rather than dead.
Recovery::Deaths Recovery::settle_the_dead(double t_attempt, double t_notice, Ledger& ledger) {
  const RepairClock clock = reduce_repair_clock(run_.members.group(), t_notice, run_.now());
  Deaths d;
  d.times = {t_attempt, clock.first_notice, clock.last_notice, clock.repair};
  for (int r : ledger.at_start)
    if (!run_.members.alive[r] && std::find(ledger.recorded.begin(), ledger.recorded.end(), r) == ledger.recorded.end())
      d.lost.push_back(r);
  d.hung = settle_hung(d.lost, ledger.settled);
  // Spares beat under their key (run_spare): a frozen one was, or is now, ended by its host.
  d.spares_hung = settle_hung(ledger.spares_lost, ledger.settled);
  return d;
}

// 4. Keep the file: the recorder's rank (the lowest live one if the last died) holds the results
// file, and writes the previous step's row if a failure kept it out; before the reconfiguration,
// so that a missing row shows the step as it ran.
void Recovery::keep_the_file(const std::vector<int>& lost) {
  if (!run_.root()) return;
  if (!run_.record) take_over_recorder(lost);
  run_.record->write_missing_row(run_.finished, run_.members.group().size());
}

// 5. Reconfigure: the policy's configuration over the survivors, shards healed from live peers
// (or a checkpoint restored), or none yet where spares take every rank lost here over at once
// (phase 8: the one reconfiguration of their handover heals them in, and the survivors do not
// first shrink to the lost ranks' absence). Returns its figures over the group.
RecoveryFigures Recovery::reconfigure_survivors(const std::vector<int>& lost) {
  const int steps_before = run_.trainer->steps_taken();
  run_.stragglers.resync(run_.members.evicted, run_.trainer->rank_speeds());
  const std::vector<char> training = run_.members.training();
  const Reconfiguration rc =
      spares_take_all_at_once(lost) ? run_.trainer->forget(training) : run_.trainer->reconfigure(training);
  release_free_memory();
  return run_.figures(rc, steps_before);
}

// 6. Record: the repair, its deaths and revivals, and the spares lost; before any verdict on the
// run, since a death that ends it (exit 3) is a death too. Each death is recorded once.
void Recovery::record(int s, const Deaths& d, const RecoveryFigures& f, Ledger& ledger) {
  if (run_.root()) {
    run_.record->record_repair(s, run_.schedule, ledger.revivals, d.lost, d.times, f, d.hung);
    if (pool_) {
      std::vector<SpareHandover> spares;
      for (int key : ledger.spares_lost) spares.push_back({pool_->spare_number(key), pool_->host_of_spare(key), -1});
      run_.record->record_spares_lost(s, d.times.first, spares, d.spares_hung);
    }
  }
  ledger.recorded.insert(ledger.recorded.end(), d.lost.begin(), d.lost.end());
  ledger.spares_lost.clear();
  ledger.revivals.clear();
}

// 7. Judge. After a repair: no replica trains, and neither the revivals still to come (were every one of them
// to succeed) nor a spare taking a dead rank over would let one train again, so the run cannot go
// on (exit code 3). Under restart, a rank that died unscheduled and that nothing revives leaves
// every replica idle to the end: that too is no way forward.
void Recovery::stop_if_no_way_forward(int s) {
  if (run_.trainer->configuration().active_replicas() > 0) return;
  if (pool_ && run_.o.spares_take_over_deaths() && !served_by_spares(run_.members.dead()).empty()) return;
  std::vector<char> hope = run_.members.alive;
  for (int r : run_.schedule.revived_after(s)) hope[r] = 1;
  if (plan_for(run_.o, run_.trainer->topology(), hope).active_replicas() > 0) return;
  throw NoProgress(fmt::format("step {}: rank(s) {} are dead, no replica can train under --policy {} and no "
                               "revival is scheduled that would let one train again",
                               s, run_.members.dead(), run_.o.policy));
}

// 8. Hand over: with --spare-use takeover, spares take the dead ranks now, when the pool can serve
// them all (a later revival of those ranks is then moot). Every dead rank, not only this repair's:
// a whole host's deaths can come in two repairs, and a spare host serves the host once all its
// ranks are known dead (SparePool::choose).
double Recovery::hand_over_to_spares(int s, const std::vector<int>& lost) {
  if (!pool_ || !run_.o.spares_take_over_deaths()) return 0;
  const std::vector<int> served = served_by_spares(run_.members.dead());
  std::vector<int> unserved;
  for (int r : lost)
    if (!run_.members.alive[r] && std::find(served.begin(), served.end(), r) == served.end()) unserved.push_back(r);
  if (run_.root() && !unserved.empty()) run_.record->record_no_spare(s, run_.now(), unserved);
  return served.empty() ? 0 : revive(s, served);
}

// ---- What the phases share ----------------------------------------------------------------------

std::vector<int> Recovery::served_by_spares(const std::vector<int>& ranks) const {
  std::vector<int> served;
  for (const auto& [key, rank] : pool_->choose(ranks, run_.members.hosts)) served.push_back(rank);
  return served;
}

// The takeover rule: spares take every rank this repair lost at once (not under restart, which
// reloads the checkpoint once a replica is whole again).
bool Recovery::spares_take_all_at_once(const std::vector<int>& lost) const {
  if (lost.empty() || !pool_ || !run_.o.spares_take_over_deaths() || run_.o.policy == Policy::Restart) return false;
  const std::vector<int> served = served_by_spares(run_.members.dead());
  return std::all_of(lost.begin(), lost.end(),
                     [&](int r) { return std::find(served.begin(), served.end(), r) != served.end(); });
}

// A rank MPI reported failed may have been hung, not dead: the survivors of its host know
// (HangWatch::settle); the group agrees on when it froze and when it was declared hung.
std::vector<HangTimes> Recovery::settle_hung(const std::vector<int>& lost, std::map<int, HangTimes>& settled) {
  std::vector<double> t(2 * lost.size(), -1);
  for (std::size_t i = 0; i < lost.size(); ++i) {
    auto it = settled.find(lost[i]);
    if (it == settled.end()) {
      HangTimes mine;
      if (HangWatch* watch = run_.liveness->hang_watch())
        if (const auto h = watch->settle(lost[i])) {
          const double at = run_.now();
          mine = {at - h->froze_ago, at - h->declared_ago};
        }
      it = settled.emplace(lost[i], mine).first;
    }
    t[2 * i] = it->second.froze, t[2 * i + 1] = it->second.declared;
  }
  if (!lost.empty()) run_.members.group().allreduce_max(t.data(), static_cast<int>(t.size()));
  std::vector<HangTimes> out;
  for (std::size_t i = 0; i < lost.size(); ++i) out.push_back({t[2 * i], t[2 * i + 1]});
  return out;
}

// Right after a shrink: every member of `before` that is gone and had no kill event in this step
// died unscheduled; with a generator in the schedule it is revived repair_steps later
// (Schedule::repair_unscheduled decides). Returns (rank, step of its revival) for those added.
// Nothing here communicates, so a survivor that fails later in the repair and shrinks again still
// adds the same.
std::vector<std::pair<int, int>> Recovery::repair_unscheduled(int s, const std::vector<int>& before) {
  std::vector<std::pair<int, int>> added;
  for (int r : before)
    if (!run_.members.alive[r])
      if (const int back = run_.schedule.repair_unscheduled(s, r, run_.o.steps)) added.emplace_back(r, back);
  return added;
}

// The group is now `group` (after a shrink or a spawn): every member's logical rank, and the
// trainer talks over it.
void Recovery::adopt(std::unique_ptr<Comm> group) {
  run_.members.adopt(std::move(group));
  run_.trainer->set_group(run_.members.group());
  for (int r : run_.members.dead()) run_.forget_straggler(r);
}

void Recovery::take_over_recorder(const std::vector<int>& lost) {
  run_.record = std::make_unique<RunRecord>(run_.o, *run_.trainer, run_.peak, run_.members.hosts, run_.members.size());
  run_.record->reopen(run_.members.me, lost, run_.now());
}

// ---- A revival: new processes or spares take dead ranks -------------------------------------------

// On the survivors: processes take the dead logical ranks `wanted` (spares where the
// pool can serve them all; on one host, else new ones spawned), are told the run's state, and are
// healed from their peers. On a job of several hosts the ranks no spare can serve stay dead.
double Recovery::revive(int s, const std::vector<int>& wanted) {
  run_.progress(s, "a revival: spawn or spares, merge, heal");
  const double t_event = run_.now();
  auto assign = pool_ ? pool_->choose(wanted, run_.members.hosts) : std::vector<std::pair<int, int>>{};
  std::vector<int> ranks = wanted;
  if (assign.size() < wanted.size() && pool_) {
    if (std::set<std::string>(run_.members.hosts.begin(), run_.members.hosts.end()).size() == 1) {
      assign.clear();  // spawn them all
    } else {
      ranks.clear();
      for (const auto& [key, rank] : assign) ranks.push_back(rank);
      std::vector<int> stay;
      for (int r : wanted)
        if (std::find(ranks.begin(), ranks.end(), r) == ranks.end()) stay.push_back(r);
      if (run_.root()) run_.record->record_no_spare(s, t_event, stay);
      if (ranks.empty()) return 0;
    }
  }
  {
    PhaseScope phase(run_.trainer->clock(), Phase::Revival);
    const JoinMessage m = join_message(s, ranks);
    adopt(assign.empty() ? spawn_replacements(m) : hand_to_spares(m, assign));
  }
  StepEvents ev;
  ev.revive = ranks;
  ev.nodes_revived = run_.schedule.at(s).nodes_revived;
  return complete_handover(s, ev, false, t_event, [&](double spawn_seconds) {
    if (!run_.root()) return;
    std::vector<SpareHandover> handover;
    for (const auto& [key, rank] : assign)
      handover.push_back({pool_->spare_number(key), pool_->host_of_spare(key), rank});
    run_.record->record_revival(s, t_event, spawn_seconds, ranks, handover, run_.o.spares_take_over_deaths());
  });
}

double Recovery::join(int s, const std::vector<int>& ranks) {
  run_.progress(s, "joining the survivors");
  run_.members.gather_order();
  StepEvents ev;
  ev.revive = ranks;
  return complete_handover(s, ev, true, run_.now(), nullptr);
}

// A handover's second half, on both sides, once the new processes are members of the group: the
// clocks aligned, the processes and (survivors, through `record_revival`) the revival recorded,
// and the reconfiguration that heals the new processes. A failure in it (a survivor or a new
// process dies, or the schedule's kill `at: handover`) is repaired as one in a step, by the merged
// group: the new processes hold no state yet, and a heal cut short leaves every rank's state as it
// was before it (Trainer::reconfigure), so the repair heals them as the handover would have.
// Returns the revival's seconds (survivors: from `t_event`, its start).
double Recovery::complete_handover(int s, const StepEvents& ev, bool joining, double t_event,
                                      const std::function<void(double)>& record_revival) {
  bool recorded = false;
  try {
    {
      PhaseScope phase(run_.trainer->clock(), Phase::Revival);
      align_clock(joining);
      run_.record_processes(ev.revive);
    }
    const double spawn_seconds = joining ? 0 : run_.now() - t_event;
    if (record_revival) record_revival(spawn_seconds);
    recorded = true;
    if (run_.liveness->doomed_at(StepPoint::Handover)) run_.die();
    return spawn_seconds + apply_membership(s, ev);
  } catch (const PeerFailure& e) {
    const double t_failure = run_.now();
    const double repair_seconds = repair(s, e, t_failure);
    // What the failure came before (a process is recorded once).
    run_.record_processes(ev.revive);
    if (record_revival && !recorded) record_revival(t_failure - t_event);
    if (run_.root()) run_.record->record_revived_in_repair(s, ev, t_failure);
    return (joining ? 0 : t_failure - t_event) + repair_seconds;
  }
}

// Every rank reads the run's clock as seconds since the survivors' start. A new process first set
// it from the join message's `elapsed`, which is late by the message and the process's own set-up
// (2-17 ms on 2 busy cores: enough to put a notice before the step that it interrupted). Here it
// takes the survivors' reading right after a barrier, so only the barrier's skew separates them.
void Recovery::align_clock(bool joining) {
  run_.members.group().barrier();
  double t = joining ? 0.0 : run_.now();
  run_.members.group().allreduce_max(&t, 1);
  if (joining) run_.set_now(t);
}

// What the processes taking over `ranks` at step s are told of the run.
JoinMessage Recovery::join_message(int s, const std::vector<int>& ranks) const {
  JoinMessage m;
  m.options = run_.o;
  m.options.threads = run_.threads;
  m.step = s;
  m.elapsed = run_.now();
  m.ranks = ranks;
  m.state = run_.trainer->join_state(-1);
  m.recorder = run_.members.recorder;
  m.hosts = run_.members.hosts;
  m.peak = run_.peak;
  m.added_revivals = run_.schedule.added();
  for (int r = 0; r < int(run_.members.evicted.size()); ++r)
    if (run_.members.evicted[r]) m.evicted.push_back(r);
  m.probe_base = run_.stragglers.probe_base();
  m.stragglers = run_.stragglers.state();
  return m;
}

// New processes for m.ranks (MPI_Comm_spawn, then merged): the survivors' group with them, in
// logical order.
std::unique_ptr<Comm> Recovery::spawn_replacements(const JoinMessage& m) {
  std::vector<std::string> args;  // the child learns everything from the join message
  // On a job of several hosts, each replacement goes back to its rank's host (a node's ranks to
  // their node, where TP groups must stay); on one host, wherever the launcher has room.
  std::vector<std::string> where;
  if (std::set<std::string>(run_.members.hosts.begin(), run_.members.hosts.end()).size() > 1)
    for (int r : m.ranks) where.push_back(run_.members.hosts[r]);
  auto merged = run_.members.group().spawn(std::filesystem::read_symlink("/proc/self/exe").string(), args,
                              static_cast<int>(m.ranks.size()), where);
  merged->post(merged->rank() == 0 ? to_json(m).dump() : std::string(), 0);
  return merged->split(0, run_.members.me);
}

// Spares take m.ranks (`assign`: spare key, logical rank): the plan goes to the whole pool, and the
// trainers' group, spares included, comes back in logical order.
std::unique_ptr<Comm> Recovery::hand_to_spares(const JoinMessage& m, const std::vector<std::pair<int, int>>& assign) {
  pool_->exchange(to_text(SparePlan{.end = false, .assign = assign, .join = m}));
  return pool_->regroup(assign);
}

// ---- Spares ------------------------------------------------------------------------------------------

void Recovery::use_spares(SparePool* pool, std::vector<std::string> processes) {
  pool_ = pool;
  spare_processes_ = std::move(processes);
}

void Recovery::release_spares() {
  if (!pool_) return;
  try {
    pool_->exchange(to_text(SparePlan{.end = true, .assign = {}, .join = {}}));
  } catch (const PeerFailure&) {
    // A spare died: the others see the trainers leave, and end when none is left (run_spare).
  }
}

// ---- Fence mode ----------------------------------------------------------------------------------

double Recovery::apply_membership(int s, const StepEvents& ev) {
  run_.progress(s, "a reconfiguration");
  const double t_event = run_.now();
  for (int r : ev.kill) run_.members.alive[r] = 0, run_.forget_straggler(r);
  for (int r : ev.revive) run_.members.alive[r] = 1;
  const int before = run_.trainer->steps_taken();
  const Reconfiguration rc = run_.trainer->reconfigure(run_.members.training());
  release_free_memory();
  const RecoveryFigures f = run_.figures(rc, before);
  if (run_.root()) run_.record->record_recovery(s, ev, f, t_event);
  return f.seconds();
}

}  // namespace ntp
