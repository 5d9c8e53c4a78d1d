// What the recorder rank writes and prints: the results file's attributes, rows and events, the
// console's per-step and recovery lines, and the summary at the end.
#include "run_record.hpp"

#include "paced_machine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fault.hpp"
#include "interrupt.hpp"
#include "rebalance.hpp"
#include "machine.hpp"
#include "option_table.hpp"

namespace ntp {

namespace {

// A straggler action's /events kind.
EventKind event_kind(StragglerActionKind k) {
  switch (k) {
    case StragglerActionKind::Evict: return EventKind::Evict;
    case StragglerActionKind::EvictRefused: return EventKind::EvictRefused;
    case StragglerActionKind::Rejoin: return EventKind::Rejoin;
    case StragglerActionKind::Rebalance: return EventKind::Rebalance;
    case StragglerActionKind::RebalanceEnd: return EventKind::RebalanceEnd;
  }
  throw std::logic_error("an unknown straggler action");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

std::string describe_kill_mode(const Options& o) {
  if (o.kill_mode == KillMode::Signal) return "signal (kills are real SIGKILLs, repaired with ULFM)";
  const std::string why = ulfm_unavailable_reason();
  return "fence (kills are emulated: " +
         (why.empty() ? std::string("the process stays, fenced off from its peers") : why) + ")";
}

void RunRecord::open(int threads) {
  const int ranks = ranks_;
  rec_ = std::make_unique<Recorder>(o_.out, o_.overwrite, ranks, trainer_.topology().replicas, o_.model.experts);
  const nlohmann::json env = environment_record();
  for (auto& [k, v] : env.items()) rec_->set_attr(k, v.get<std::string>());
  rec_->set_attr("config", to_json(o_).dump());
  rec_->set_attr("ranks", static_cast<long long>(ranks));
  rec_->set_attr("tp", static_cast<long long>(o_.tp));
  rec_->set_attr("pp", static_cast<long long>(o_.pp));
  rec_->set_attr("micro_batches", static_cast<long long>(o_.micro_batches));
  std::vector<int> stages;
  for (int r = 0; r < ranks; ++r) stages.push_back(Topology(ranks, r, o_.tp, o_.pp).stage);
  rec_->set_rank_stages(stages);
  rec_->set_attr("replicas", static_cast<long long>(trainer_.topology().replicas));
  rec_->set_attr("timing", choice_name(o_.timing));
  rec_->set_attr("policy", o_.schedule.empty() ? std::string("none") : choice_name(o_.policy));
  rec_->set_attr("kill_mode", choice_name(o_.kill_mode.value()));
  rec_->set_attr("kill_mode_reason", describe_kill_mode(o_));
  rec_->set_attr("threads_per_rank", static_cast<long long>(threads));
  rec_->set_attr("peak_gflops_per_rank", peak_.gflops);
  rec_->set_attr("peak_gflops_source", peak_.source);
  rec_->set_attr("data", trainer_.data().describe());
  rec_->set_attr("tokens_per_sample", static_cast<long long>(o_.seq));
  rec_->set_attr("hosts", nlohmann::json(hosts_).dump());
  // What a heal's bandwidth can be held against (analysis revivals): measured on this host, now.
  rec_->set_attr("memcpy_gbps", measure_memcpy_gbps());
  start_clock();
  report_interrupts(o_.out);
}

void RunRecord::start_clock() { clock_ = EmulatedClock(paced() ? time_scale_value(o_) : 1.0); }

double RunRecord::event(double t, int s, EventKind kind, int rank, int replica, double bytes, double seconds,
                        const std::string& detail, Clocked how, double emulated) {
  EventRow e = make_event(clock_.at(t), s, name(kind), rank, replica, bytes, seconds, detail);
  e.host_time = t, e.host_duration = seconds;
  if (paced()) {
    e.duration = how == Clocked::Charged ? clock_.charge(t, seconds, emulated)
                 : how == Clocked::Figure ? emulated
                                          : clock_.span(t, seconds);
    if (is_recovery(kind)) recovery_since_row_ += e.duration;
  }
  rec_->event(e);
  return e.duration;
}

double RunRecord::state_bytes_ratio() const {
  return paced() && o_.emulates_shape() ? paced_rates(o_, 1.0).shape.parameter_bytes : 1.0;
}

double RunRecord::heal_charge(const RecoveryFigures& f) const {
  if (f.rank_bytes <= 0) return 0;
  const PacingConfig own = paced_rates(o_, 1.0);  // the machine at its own speed
  return own.latency_us * 1e-6 + f.rank_bytes * state_bytes_ratio() / (own.dp_gbps * 1e9);
}

double RunRecord::load_charge(const RecoveryFigures& f) const {
  return f.rank_bytes * state_bytes_ratio() / (costs().checkpoint_gbps.value * 1e9) +
         (o_.policy == Policy::Restart ? costs().restart.value : 0.0);
}

void RunRecord::reopen(int me, const std::vector<int>& lost, double t) {
  rec_ = Recorder::reopen(o_.out, ranks_, trainer_.topology().replicas, o_.model.experts);
  start_clock();
  const auto [host, emulated] = rec_->last_moment();
  clock_.resume(host, emulated);
  // The idle slot's length carries over: the healthy steps the file holds (a wait here: host seconds).
  for (const auto& row : rec_->rows())
    if (row.samples > 0 && row.live_ranks == ranks_ && row.active_replicas == trainer_.topology().replicas)
      healthy_step_seconds_.push_back(row.host_t_end - row.host_t_start);
  if (!rec_->rows().empty()) last_step_seconds_ = rec_->rows().back().host_t_end - rec_->rows().back().host_t_start;
  report_interrupts(o_.out);
  note_progress(rec_->rows().empty() ? 0 : static_cast<int>(rec_->rows().back().step),
                static_cast<int>(rec_->rows().size()));
  fmt::print("logical rank {} takes over the results file from rank(s) {} ({} rows so far)\n", me, lost,
             rec_->rows().size());
  event(t, static_cast<int>(rec_->rows().size()) + 1, EventKind::Recorder, me, trainer_.topology().replica_of_rank(me),
        0, 0, fmt::format("rank {} reopened the file", me));
}

void RunRecord::incarnations(const std::vector<int>& members, const std::vector<std::string>& who,
                             const std::vector<int>& only, double t) {
  for (std::size_t k = 0; k < who.size(); ++k) {
    const int r = members[k];
    if (!only.empty() && std::find(only.begin(), only.end(), r) == only.end()) continue;
    const auto space = who[k].find(' ');
    rec_->incarnation_start(r, std::stoll(who[k].substr(0, space)), who[k].substr(space + 1), only.empty() ? 0.0 : t);
  }
}

double RunRecord::idle_wait() const {
  return healthy_step_seconds_.empty() ? last_step_seconds_ : median(healthy_step_seconds_);
}

void RunRecord::clear_rank_rows() {
  std::fill(phase_rows_.begin(), phase_rows_.end(), std::array<double, kPhaseCount>{});
  std::fill(usage_rows_.begin(), usage_rows_.end(), RankUsage{});
}

void RunRecord::set_rank_row(int rank, const std::array<double, kPhaseCount>& phases, RankUsage usage) {
  phase_rows_[rank] = phases;
  usage_rows_[rank] = usage;
}

bool peers_uneven(const Configuration& cfg, bool slowed) {
  if (slowed || !cfg.uniform()) return true;
  for (const ReplicaPlan& r : cfg.replicas) {
    if (!r.active()) continue;
    if (r.speed != 1.0) return true;
    for (const ShardMap& m : r.layout.maps)
      if (m.units() % r.degree() != 0) return true;
  }
  return false;
}

namespace {
// Each replica's TP degree (0: not training), batch and state, for /replicas.
ReplicaRow replica_row(const Configuration& cfg) {
  ReplicaRow rr;
  for (const auto& rp : cfg.replicas) {
    rr.tp_degree.push_back(rp.active() ? rp.degree() : 0);
    rr.batch.push_back(rp.batch);
    rr.state.push_back(static_cast<signed char>(rp.state));
  }
  return rr;
}

// Each of `ranks` ranks' share of its replica's compute (0: not training), for /ranks.
std::vector<float> compute_share_row(const Options& o, const Configuration& cfg, std::size_t ranks) {
  std::vector<float> shares(ranks, 0.0f);
  for (const ReplicaPlan& rp : cfg.replicas) {
    if (!rp.active()) continue;
    const std::vector<double> of = compute_shares(o.model, o.seq, rp.layout);
    for (std::size_t k = 0; k < rp.ranks.size(); ++k) shares[rp.ranks[k]] = float(of[k % rp.degree()]);
  }
  return shares;
}
}  // namespace

void RunRecord::record_step(const Attempt& a, int group_size) {
  clock_.settle(a.t_start);  // the recoveries told so far came before it
  const int s = a.step;
  const StepResult& r = a.r;
  const Configuration& cfg = trainer_.configuration();
  const bool overrun = r.overruns > 0;
  // The row on the emulated clock under paced timing; this host's seconds beside them.
  const double host_secs = a.t_end - a.t_start;
  const double t_start = clock_.at(a.t_start), t_end = clock_.at(a.t_end), secs = t_end - t_start;
  const long long tokens = r.samples * o_.seq;
  // Under --emulate-shape, the FLOPs charged: the target's for the same tokens.
  const double flops = training_flops(o_.model, r.samples, o_.seq) * (o_.pacing.enabled ? paced_rates(o_).shape.flops : 1.0);
  const double peak = peak_.gflops;
  const double mfu = secs > 0 && peak > 0 ? flops / (secs * group_size * peak * 1e9) : std::nan("");
  const double nan = std::nan("");
  // A non-finite step updated nothing: its tokens are processed, not committed.
  const StepRow row{.step = s,
                    .optimizer_step = trainer_.steps_taken(),
                    .t_start = t_start,
                    .t_end = t_end,
                    .host_t_start = a.t_start,
                    .host_t_end = a.t_end,
                    .sample_begin = r.sample_begin,
                    .samples = r.samples,
                    .tokens = tokens,
                    .tokens_committed = r.nonfinite ? 0 : tokens,
                    .loss = r.samples ? r.loss : nan,
                    .grad_norm = r.samples ? r.grad_norm : nan,
                    .lr = r.lr,
                    .flops = flops,
                    .mfu = mfu,
                    .live_ranks = cfg.live_ranks(),
                    .active_replicas = cfg.active_replicas(),
                    .recovery_seconds = paced() ? recovery_since_row_ : a.recovery_seconds,
                    .idle_seconds = a.idle_seconds / clock_.factor(),  // a wait
                    .paced_overrun = static_cast<std::int8_t>(overrun),
                    .paced_link_overruns = r.link_overruns,
                    .paced_overrun_seconds = r.overrun_seconds,
                    .paced_link_overrun_seconds = r.link_overrun_seconds,
                    .paced_peers_uneven = static_cast<std::int8_t>(peers_uneven(cfg, a.slowed)),
                    .paced_host_seconds = r.host_seconds,
                    .paced_worst_rank_seconds = r.worst_rank_seconds,
                    .control_calls = a.control.calls,
                    .control_bytes = a.control.bytes,
                    .moe_kept = r.moe_kept,
                    .moe_dropped = r.moe_dropped,
                    .moe_load_max = o_.model.moe() ? r.moe_load_max : nan};
  const auto tr = std::chrono::steady_clock::now();
  if (r.nonfinite)
    event(a.t_end, s, EventKind::Nonfinite, -1, -1, 0, 0,
          fmt::format("loss {} grad norm {}: no update ({})", r.loss, r.grad_norm,
                      o_.on_nonfinite == OnNonfinite::Skip ? "skipped" : "the run stops"));
  // Per expert only where the reports were gathered (else the recorder's own counts alone).
  rec_->append(row, replica_row(cfg), phase_rows_, usage_rows_, compute_share_row(o_, cfg, usage_rows_.size()),
               a.control.calls >= 0 ? r.moe_tokens_per_expert : std::vector<std::int64_t>{});
  recovery_since_row_ = 0;
  note_progress(s, static_cast<int>(rec_->rows().size()));
  warn_first_overrun(row);
  recorder_seconds_ += seconds_since(tr);
  if (r.samples > 0) {  // how long an idle slot waits here: this host's seconds
    last_step_seconds_ = host_secs;
    if (cfg.active_replicas() == trainer_.topology().replicas && cfg.live_ranks() == ranks_)
      healthy_step_seconds_.push_back(host_secs);
  }
  if (o_.quiet) return;
  if (r.samples > 0)
    fmt::print("step {:5d}/{} | loss {:.4f} | norm {:.4f} | {:8.1f} ms | {:9.0f} tok/s | MFU {:5.1f}% | TP {}{}\n", s,
               o_.steps, r.loss, r.grad_norm, secs * 1e3, tokens / secs, 100 * mfu, cfg.degrees(),
               overrun ? " | paced overrun" : "");
  else
    fmt::print("step {:5d}/{} | idle: every replica is down | {:8.1f} ms\n", s, o_.steps, secs * 1e3);
  std::fflush(stdout);
}

// Paced timing is re-checked at every step: the first step whose real work ran past its emulated
// time by more than the verdict's limit is announced when it happens (the time scale stays: the
// run's verdict and the closing line say the rest).
void RunRecord::warn_first_overrun(const StepRow& row) {
  const double seconds = row.host_t_end - row.host_t_start;  // lateness is this host's
  if (!o_.pacing.enabled || warned_overrun_ || seconds <= 0 || !row.paced_overrun) return;
  warned_overrun_ = true;
  fmt::print(stderr,
             "ntpbench: warning: paced timing overran at step {}: its worst rank's real time ran {:.3g} s past "
             "emulated time ({:.2g}% of the step, the limit is {:g}%; compute over {:.3g} s, transfers late {:.3g} s, "
             "outside the paced calls {:.3g} s, summed over the ranks); from here this run's times are partly this "
             "machine's (a larger --time-scale keeps up)\n",
             row.step, row.paced_worst_rank_seconds, 100 * row.paced_worst_rank_seconds / seconds,
             100 * kPacedOverrunLimit, row.paced_overrun_seconds, row.paced_link_overrun_seconds, row.paced_host_seconds);
  std::fflush(stderr);
}

void RunRecord::write_missing_row(const Attempt& a, int group_size) {
  if (a.step == 0 || static_cast<int>(rec_->rows().size()) >= a.step) return;
  if (static_cast<int>(rec_->rows().size()) < a.step - 1)
    throw std::logic_error(fmt::format("the results file lacks rows before step {}", a.step));
  record_step(a, group_size);
}

void RunRecord::record_recovery(int s, const StepEvents& ev, const RecoveryFigures& f, double t_event,
                                const std::vector<std::string>* kill_details, double t_kill) {
  const Reconfiguration& rc = f.rc;
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    event(t_kill >= 0 ? t_kill : t_event, s, EventKind::Kill, ev.kill[i],
          trainer_.topology().replica_of_rank(ev.kill[i]), 0, 0, kill_details ? (*kill_details)[i] : "");
  revive_events(s, ev.revive, t_event);
  node_events(s, ev.nodes_killed, EventKind::NodeDown, t_kill >= 0 ? t_kill : t_event);
  node_events(s, ev.nodes_revived, EventKind::NodeUp, t_event);
  const std::string change = fmt::format("TP {} -> {}", rc.before, rc.after);
  // Paced: a death is noticed after the machine's detection (also where spares take the dead
  // ranks over at once, and the configuration waits for their handover); a revival needs none.
  double detect = 0, reconfigure = 0;
  if (rc.changed || !ev.kill.empty())
    detect = event(t_event, s, EventKind::Detect, -1, -1, 0, f.detect, "", Clocked::Charged,
                   ev.kill.empty() ? 0.0 : costs().detect.value);
  if (rc.changed)
    reconfigure = event(t_event + f.detect, s, EventKind::Reconfigure, -1, -1, 0, f.reconfigure, change,
                        Clocked::Charged, costs().reconfigure.value);
  // Deaths no event scheduled (kill -9 from outside, a crash) are named as such.
  std::vector<int> scheduled, unscheduled;
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    (kill_details && (*kill_details)[i].rfind("unscheduled", 0) == 0 ? unscheduled : scheduled).push_back(ev.kill[i]);
  std::string killed = scheduled.empty() ? "" : fmt::format("kill {} ", scheduled);
  if (!unscheduled.empty()) killed += fmt::format("unscheduled death of rank(s) {} ", unscheduled);
  std::string what = fmt::format("step {:5d}: {}{}| ", s, killed, ev.revive.empty() ? "" : fmt::format("revive {} ", ev.revive));
  if (rc.changed) what += fmt::format("detect {:.2f} ms | reconfigure {:.2f} ms | ", detect * 1e3, reconfigure * 1e3);
  const double t_heal = t_event + f.detect + f.reconfigure;
  if (!rc.changed) {  // Trainer::forget: the spares taking the ranks over are healed in at their handover
    what += fmt::format("spares take the rank(s) over now: one reconfiguration, at their handover | {}", change);
  } else if (rc.restored) {
    what += fmt::format("{} | {}", record_restore(s, f, t_event), change);
  } else if (trainer_.configuration().active_replicas() == 0) {
    what += fmt::format("every replica is down: idle until a revival | {}", change);
  } else {
    const double heal =
        event(t_heal, s, EventKind::Heal, -1, -1, f.bytes, f.heal, change, Clocked::Charged, heal_charge(f));
    what += fmt::format("heal {:.2f} MB in {:.2f} ms | {}", f.bytes / 1e6, heal * 1e3, change);
  }
  fmt::print("{}\n", what);
  std::fflush(stdout);
}

void RunRecord::revive_events(int s, const std::vector<int>& ranks, double t) {
  for (int r : ranks) event(t, s, EventKind::Revive, r, trainer_.topology().replica_of_rank(r), 0, 0, "");
}

// A whole node's failure or return (kill_node / revive_node): one event naming its ranks.
void RunRecord::node_events(int s, const std::vector<std::string>& hosts, EventKind kind, double t) {
  for (const auto& host : hosts) {
    std::vector<int> on;
    for (int r = 0; r < int(hosts_.size()); ++r)
      if (hosts_[r] == host) on.push_back(r);
    event(t, s, kind, -1, -1, 0, 0, fmt::format("{}: ranks {}", host, on));
  }
}

void RunRecord::record_revived_in_repair(int s, const StepEvents& ev, double t) {
  revive_events(s, ev.revive, t);
  node_events(s, ev.nodes_revived, EventKind::NodeUp, t);
  fmt::print("step {:5d}: revive {} | healed by the repair of the failure during its handover\n", s, ev.revive);
  std::fflush(stdout);
}

std::string RunRecord::record_restore(int s, const RecoveryFigures& f, double t_event) {
  const Reconfiguration& rc = f.rc;
  // Paced: the load at the checkpoint storage's speed, and under restart the job's restart.
  event(t_event + f.detect + f.reconfigure, s, EventKind::Restore, -1, -1, f.bytes, f.heal,
        fmt::format("from {} (optimizer step {})", rc.restored_from, rc.restored_step), Clocked::Charged,
        load_charge(f));
  const Recorder::RolledBack rolled = rec_->roll_back_after(rc.restored_step);
  const int lost_rows = rolled.rows;
  const double lost_seconds = rolled.seconds;
  event(t_event, s, EventKind::Rollback, -1, -1, 0, 0,
        fmt::format("{} steps rolled back (optimizer step {} -> {})", lost_rows, f.steps_before, rc.restored_step));
  event(t_event, s, EventKind::Recompute, -1, -1, 0, rolled.host_seconds, fmt::format("{} steps to redo", lost_rows),
        Clocked::Figure, lost_seconds);
  // Why the state was reloaded: the policy's rule, or shards that no live rank held.
  return fmt::format("{}: restored {} (optimizer step {}), {} steps rolled back ({:.2f} s to recompute)",
                     o_.policy == Policy::Restart ? "--policy restart reloads the last checkpoint"
                                                  : "no live replica holds every shard",
                     rc.restored_from, rc.restored_step, lost_rows, lost_seconds);
}

void RunRecord::record_slowdown(int s, const Slowdown& d, double t) {
  const int replica = trainer_.topology().replica_of_rank(d.rank);
  const std::string what = d.factor == 1 && d.link_factor == 1
                               ? std::string("back to full speed")
                               : fmt::format("compute x{:g}, links x{:g}", d.factor, d.link_factor);
  event(t, s, EventKind::Slow, d.rank, replica, 0, 0, what);
  fmt::print("step {:5d}: rank {} slowed by the schedule: {}\n", s, d.rank, what);
  std::fflush(stdout);
}

void RunRecord::record_straggler(int s, const StragglerVerdict& v, double t) {
  const int replica = trainer_.topology().replica_of_rank(v.rank);
  event(t, s, v.starts ? EventKind::Straggler : EventKind::StragglerEnd, v.rank, replica, 0, 0,
        fmt::format("compute per FLOP {:.2f}x its peers' median over {} steps (threshold {:g})", v.ratio,
                    o_.straggler_window, o_.straggler_threshold));
  const std::string then = o_.straggler_policy == StragglerPolicy::Evict       ? "it leaves the training groups next step"
                           : o_.straggler_policy == StragglerPolicy::Rebalance ? "its replica shares by speed from the next step"
                                                                : "the job runs at its pace";
  if (v.starts)
    fmt::print("step {:5d}: rank {} is a straggler: its compute per FLOP took {:.2f}x its peers' (median of {} steps, "
               "--straggler-threshold {:g}); {}\n",
               s, v.rank, v.ratio, o_.straggler_window, o_.straggler_threshold, then);
  else
    fmt::print("step {:5d}: rank {} is no longer a straggler ({:.2f}x its peers' over {} steps)\n", s, v.rank, v.ratio,
               o_.straggler_window);
  std::fflush(stdout);
}

void RunRecord::record_straggler_action(int s, const StragglerAction& a, const RecoveryFigures* f, double t) {
  const int replica = trainer_.topology().replica_of_rank(a.rank);
  const Configuration& cfg = trainer_.configuration();
  const std::string now = fmt::format("TP {} batches {}", format_degrees(cfg.degrees()), cfg.batches());
  std::string what = a.why.empty() ? now : a.why;
  double seconds = 0, bytes = 0, charged = 0;
  if (f) {
    // Paced: the new layout's communicators, and its heal over the links (a reload is the restore's).
    seconds = f->rc.restored ? f->detect + f->reconfigure : f->seconds();
    charged = costs().reconfigure.value + (f->rc.restored ? 0.0 : heal_charge(*f));
    bytes = f->bytes;
    what = fmt::format("TP {} -> {}; now {}", f->rc.before, f->rc.after, now);
  }
  seconds = event(t, s, event_kind(a.kind), a.rank, replica, bytes, seconds, what, Clocked::Charged, charged);
  // A replica that comes back when no live one held the state (every replica was down) reloads the
  // last checkpoint: the steps since are rolled back, as after a failure.
  const std::string done = !f                ? ""
                           : f->rc.restored ? " | " + record_restore(s, *f, t)
                                            : fmt::format(" | reconfigured and healed {:.2f} MB in {:.2f} ms", bytes / 1e6,
                                                          seconds * 1e3);
  if (a.kind == StragglerActionKind::EvictRefused)
    fmt::print("step {:5d}: straggler rank {} stays: {} (tolerated)\n", s, a.rank, a.why);
  else
    fmt::print("step {:5d}: straggler rank {}: {} | {}{}\n", s, a.rank, name(event_kind(a.kind)), what, done);
  std::fflush(stdout);
}

void RunRecord::record_repair(int s, const Schedule& schedule, const std::vector<std::pair<int, int>>& repairs,
                              const std::vector<int>& lost, const RepairTimes& t, const RecoveryFigures& f,
                              const std::vector<HangTimes>& hung) {
  const StepEvents& sched = schedule.at(s);
  for (const auto& [r, back] : repairs)
    fmt::print("step {:5d}: rank {} died unscheduled: back at step {} (the schedule's repair_steps {})\n", s, r, back,
               schedule.repair_steps());
  StepEvents ev;
  ev.kill = lost;
  for (const auto& h : sched.nodes_killed)  // a scheduled node failure among the losses
    for (int r : lost)
      if (hosts_[r] == h && (ev.nodes_killed.empty() || ev.nodes_killed.back() != h)) ev.nodes_killed.push_back(h);
  std::vector<std::string> how;
  // Paced: a hang is noticed after --failure-timeout on the machine too; hangs overlap, so the
  // longest is charged (the others' spans are inside it).
  std::size_t longest = hung.size();
  for (std::size_t i = 0; i < hung.size(); ++i)
    if (hung[i].hung() && (longest == hung.size() || hung[i].declared - hung[i].froze > hung[longest].declared - hung[longest].froze))
      longest = i;
  for (std::size_t i = 0; i < lost.size(); ++i) {
    const int r = lost[i];
    rec_->incarnation_end(r, t.first);
    auto it = std::find(sched.kill.begin(), sched.kill.end(), r);
    const bool scheduled = it != sched.kill.end();
    const std::string at = scheduled ? step_point_name(sched.kill_at[it - sched.kill.begin()]) : "";
    const bool hang_scheduled = scheduled && sched.kill_hangs[it - sched.kill.begin()];
    if (!hung[i].hung()) {
      how.push_back(!scheduled       ? std::string("unscheduled: the process died")
                    : hang_scheduled ? fmt::format("scheduled: SIGSTOP at {} (a hang; no peer of its host ended it)", at)
                                     : fmt::format("scheduled: SIGKILL at {}", at));
      continue;
    }
    // Hung: a peer of its host saw its heartbeat stop, declared it hung and ended it (SIGKILL).
    how.push_back(scheduled ? fmt::format("scheduled: SIGSTOP at {} (a hang), fenced", at)
                            : std::string("unscheduled: the process stopped answering (hung), fenced"));
    const double latency = hung[i].declared - hung[i].froze;
    event(hung[i].froze, s, EventKind::Hang, r, trainer_.topology().replica_of_rank(r), 0, latency,
          fmt::format("last heartbeat {:.3f} s, declared hung {:.3f} s later (timeout {:g} s); SIGKILL", hung[i].froze,
                      latency, o_.failure_timeout),
          i == longest ? Clocked::Charged : Clocked::Span, o_.failure_timeout);
    fmt::print("step {:5d}: rank {} stopped answering{} (last heartbeat {:.2f} s before it was declared hung; "
               "--failure-timeout {:g} s): its process was ended (SIGKILL)\n",
               s, r, scheduled ? fmt::format(" at {} (scheduled hang)", at) : "", latency, o_.failure_timeout);
  }
  // The attempt's work lost and the survivors' notices are the machine's time run slowly; the
  // repair is this host's MPI, charged the machine's.
  const double lost_s = event(t.t_attempt, s, EventKind::Lost, -1, -1, 0, t.first - t.t_attempt,
                              "the interrupted attempt's time until the first survivor noticed");
  const double notice_s = event(t.first, s, EventKind::Notice, -1, -1, 0, t.last - t.first,
                                "from the first survivor's notice to the last's");
  const double repair_s = event(t.last, s, EventKind::Repair, -1, -1, 0, t.repair, "revoke + agree + shrink",
                                Clocked::Charged, costs().repair.value);
  fmt::print("step {:5d}: rank(s) {} died | first survivor noticed {:.2f} ms into the step, the last {:.2f} ms "
             "later | revoke + agree + shrink {:.2f} ms\n",
             s, lost, lost_s * 1e3, notice_s * 1e3, repair_s * 1e3);
  record_recovery(s, ev, f, t.last + t.repair, &how, t.first);
}

void RunRecord::record_revival(int s, double t_event, double seconds, const std::vector<int>& ranks,
                               const std::vector<SpareHandover>& spares, bool takeover) {
  // A spawn is one event; spares one each (rank: the rank taken), the handover's seconds on the first.
  // Paced: new processes cost the machine's replacement, spares its takeover (both at once).
  const double host_seconds = seconds;
  if (spares.empty())
    seconds = event(t_event, s, EventKind::Spawn, -1, -1, 0, host_seconds,
                    fmt::format("{} new process(es) for rank(s) {}", ranks.size(), ranks), Clocked::Charged,
                    costs().replace.value);
  std::vector<std::string> who;
  for (const SpareHandover& h : spares) {
    who.push_back(fmt::format("spare {} ({}) -> rank {}", h.spare, h.host, h.rank));
    const bool first = who.size() == 1;
    const double d = event(t_event, s, takeover ? EventKind::Takeover : EventKind::Spare, h.rank,
                           trainer_.topology().replica_of_rank(h.rank), 0, first ? host_seconds : 0, who.back(),
                           Clocked::Charged, first ? costs().takeover.value : 0.0);
    if (first) seconds = d;
  }
  fmt::print("step {:5d}: {} in {:.2f} ms\n", s,
             spares.empty() ? fmt::format("{} new process(es) spawned for rank(s) {}", ranks.size(), ranks)
                            : fmt::format("{}", fmt::join(who, "; ")),
             seconds * 1e3);
  std::fflush(stdout);
}

void RunRecord::record_no_spare(int s, double t, const std::vector<int>& ranks) {
  fmt::print("step {:5d}: no spare for rank(s) {}: they stay dead (none left on their host, and a spare host takes "
             "only a host whose ranks are all dead), until a revival, where a process can be spawned\n", s, ranks);
  event(t, s, EventKind::NoSpare, -1, -1, 0, 0, fmt::format("rank(s) {} stay dead", ranks));
}

void RunRecord::record_spares_lost(int s, double t, const std::vector<SpareHandover>& lost,
                                   const std::vector<HangTimes>& hung) {
  for (std::size_t i = 0; i < lost.size(); ++i) {
    const int spare = lost[i].spare;
    const std::string& host = lost[i].host;
    const bool froze = i < hung.size() && hung[i].hung();
    const std::string what = froze ? fmt::format("spare {} ({}) froze; a process of its host ended it", spare, host)
                                   : fmt::format("spare {} ({}) died", spare, host);
    event(t, s, EventKind::SpareLost, -1, -1, 0, 0, what);
    fmt::print("step {:5d}: {}\n", s, what);
  }
}

void RunRecord::record_spares(const std::vector<std::string>& processes) {
  nlohmann::json spares = nlohmann::json::array();
  for (std::size_t k = 0; k < processes.size(); ++k) {
    const auto space = processes[k].find(' ');
    spares.push_back({{"spare", k}, {"pid", std::stoll(processes[k].substr(0, space))},
                      {"host", processes[k].substr(space + 1)}});
  }
  rec_->set_attr("spares", spares.dump());
}

void RunRecord::spares_left(int n) { rec_->set_summary("spares_left", static_cast<double>(n)); }

void RunRecord::record_checkpoint(int s, double t, double seconds, const std::string& path) {
  // Paced: every rank writes its share of the emulated job's state at the storage's speed.
  const double bytes = 3.0 * parameter_count(o_.model) * sizeof(float);
  event(t, s, EventKind::Checkpoint, -1, -1, bytes, seconds, path, Clocked::Charged,
        bytes * state_bytes_ratio() / ranks_ / (costs().checkpoint_gbps.value * 1e9));
  if (!o_.quiet) fmt::print("checkpoint: {}\n", path);
}

void RunRecord::note_final_checkpoint(double t, double seconds) {
  if (paced()) clock_.charge(t, seconds, 0.0);  // under wall timing the run clock is the only one
}

void RunRecord::note_no_final_checkpoint() { fmt::print("no replica is active at the end: no final checkpoint\n"); }

void RunRecord::write_summary(double wall) {
  rec_->write_summary(clock_.at(wall), wall, ranks_, peak_.gflops, o_.pacing.enabled);
  rec_->set_summary("recorder_seconds", recorder_seconds_);
  if (o_.pacing.enabled) rec_->set_summary("paced_overrun_worst_ratio", worst_overrun_);
}

void RunRecord::finish(double wall, const std::string& last_checkpoint, int skipped_steps, int code) {
  if (!last_checkpoint.empty())
    rec_->set_attr("final_checkpoint", std::filesystem::absolute(last_checkpoint).string());
  write_summary(wall);
  rec_->set_summary("skipped_steps", static_cast<double>(skipped_steps));
  double tokens = 0, committed = 0, step_s = 0;
  for (const auto& row : rec_->rows())
    tokens += row.tokens, committed += row.tokens_committed, step_s += row.t_end - row.t_start;
  // The loss of the last step that trained: a run can end with every replica down (idle rows have none).
  std::string final_loss = "final loss - (no step trained)";
  for (auto it = rec_->rows().rbegin(); it != rec_->rows().rend(); ++it)
    if (it->samples > 0) {
      final_loss = fmt::format("final loss {:.4f}", it->loss);
      if (it->step != o_.steps) final_loss += fmt::format(" (step {}; idle since)", it->step);
      break;
    }
  const double emulated_wall = clock_.at(wall);
  const std::string clock = paced() ? fmt::format(" emulated ({:.2f} s here)", wall) : "";
  fmt::print("done: {}, {:.0f} tokens ({:.0f} committed) in {:.2f} s{} | throughput {:.0f} tok/s | goodput "
             "{:.0f} tok/s | {}{}\nwrote {}{}\n",
             slots_line(skipped_steps), tokens, committed, emulated_wall, clock, step_s > 0 ? tokens / step_s : 0.0,
             committed / emulated_wall,
             final_loss, !o_.schedule.empty() ? " | kill mode " + choice_name(o_.kill_mode.value()) : std::string(), o_.out, last_checkpoint.empty() ? "" : " and checkpoint " + last_checkpoint);
  if (!overrun_line().empty()) fmt::print("{}\n", overrun_line());
  if (code != 0)
    std::fprintf(stderr, "ntpbench: error: the last step's loss is not finite (%d step(s) skipped by --on-nonfinite "
                 "skip); the training diverged\n", skipped_steps);
  std::fflush(stdout);
}

// "30 steps" when every slot of the run committed a training step; else "30 slots, 11 training
// steps committed (19 idle or rolled back)": --steps counts slots.
std::string RunRecord::slots_line(int skipped_steps) const {
  int committed = 0, idle = 0;
  for (const auto& row : rec_->rows()) committed += row.tokens_committed > 0, idle += row.samples == 0;
  const int slots = static_cast<int>(rec_->rows().size());
  if (committed == slots) return fmt::format("{} steps", slots);
  const int undone = slots - committed - idle - skipped_steps;
  std::vector<std::string> why;
  if (idle) why.push_back(fmt::format("{} idle", idle));
  if (undone > 0) why.push_back(fmt::format("{} rolled back", undone));
  if (skipped_steps) why.push_back(fmt::format("{} skipped as non-finite", skipped_steps));
  return fmt::format("{} slots, {} training steps committed ({})", slots, committed, fmt::join(why, ", "));
}

// Paced timing whose real time ran past emulated time: by how much, the verdict (Recorder::
// write_summary's rule), and a time scale that would have kept up.
std::string RunRecord::overrun_line() const {
  const PacedVerdict v = rec_->paced_verdict();
  // Within the limit the run's times are the machine's: nothing to say (the seconds are in /steps).
  if (!o_.pacing.enabled || !v.overran()) return "";
  int overrun_steps = 0, link_steps = 0;
  long long links = 0;
  for (const auto& row : rec_->rows()) {
    overrun_steps += row.paced_overrun;
    links += row.paced_link_overruns;
    link_steps += row.paced_link_overruns > 0;
  }
  const double scale = paced_rates(o_).time_scale;
  std::string line = fmt::format(
      "paced timing OVERRAN: {} of {} steps had a rank whose real time ran past emulated time by more than {:g}% of "
      "the step (a run may have {:g}% of its steps so, or one); in all, real compute ran {:.3g} s past emulated time ({:.2g}% of "
      "the ranks' step time); transfers {:.3g} s ({} in {} steps; {:.2g}% of the step time where no peer was "
      "expected late, the rest waits on slowed or uneven peers)",
      overrun_steps, rec_->rows().size(), 100 * kPacedOverrunLimit, 100 * kPacedOverrunLimit, v.compute_seconds,
      100 * v.compute_share, v.link_seconds, links, link_steps, 100 * v.link_share);
  if (worst_overrun_ > 0)
    line += fmt::format("; compute needed --time-scale {:g} or more (worst phase {:.2f}x its emulated time)",
                        power_of_2_at_least(scale * worst_overrun_ * 1.1), worst_overrun_);
  else
    line += "; --time-scale auto measures a factor that fits";
  return line;
}

void RunRecord::note_shared_cores(double ranks_per_core) {
  const std::string what = fmt::format("{:.2g} ranks per core on the most crowded host", ranks_per_core);
  rec_->set_attr("shared_cores", what);
  fmt::print("note: --timing wall with {}: step times, tokens/s and MFU measure the ranks' contention for cores, "
             "not the ranks; --timing paced emulates a device per rank (docs/timing.md)\n",
             what);
}

void RunRecord::record_paced_machine(const nlohmann::json& machine) { rec_->set_attr("paced_machine", machine.dump()); }

void RunRecord::note_overrun(double ratio) { worst_overrun_ = std::max(worst_overrun_, ratio); }

void RunRecord::abandon(double wall, const std::string& why) {
  write_summary(wall);
  rec_->mark_stopped(why);
  std::fprintf(stderr, "ntpbench: error: %s; the results file holds every step so far: %s\n", why.c_str(),
               o_.out.c_str());
}

}  // namespace ntp
