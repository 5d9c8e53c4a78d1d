// The training loop of one rank: the start, the schedule's events, each step's attempt and
// report, checkpoints and the end of the run (what the recorder writes of them: run_record.cpp).
#include "training_run.hpp"

#include "blas_core.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "machine.hpp"
#include "spares.hpp"

namespace ntp {

namespace {

// On leaving a scope, every live rank waits for the others (the root's last writes happen inside
// it): a process that saw a failure then ends without MPI_Finalize (finish_mpi).
struct GroupBarrierOnExit {
  Comm& group;
  ~GroupBarrierOnExit() {
    try {
      group.barrier();
    } catch (const std::exception&) {
    }
  }
};

std::string checkpoint_path(const Options& o, int step) {
  return (std::filesystem::path(checkpoint_dir_for(o)) / fmt::format("step_{:06d}.h5", step)).string();
}

// What every rank reports to the recorder's rank after a step (the metrics channel), its process's
// memory and descriptors included (a soak checks they stay flat).
struct Report {
  std::array<double, kPhaseCount> phases{};
  double trained = 0, loss = 0, grad_norm = 0, overruns = 0, overrun_ratio = 0, link_overruns = 0;
  double overrun_seconds = 0, link_overrun_seconds = 0, host_seconds = 0, slowed = 0;
  double rss_bytes = -1, open_fds = -1;
  double probe_ratio = std::nan("");  // an evicted straggler's probe this step
};

constexpr int kReportSize = sizeof(Report) / sizeof(double);

// A point of the step, as the watchdog's progress names it.
const char* progress_label(StepPoint p) {
  switch (p) {
    case StepPoint::Forward: return "forward";
    case StepPoint::Backward: return "backward";
    case StepPoint::Sync: return "gradient sync";
    default: return "optimizer";
  }
}

}  // namespace

Peak find_peak(const Options& o, Comm& world, int threads) {
  const bool root = world.rank() == 0;
  if (o.peak_gflops > 0) return {o.peak_gflops, "--peak-gflops"};
  if (o.pacing.enabled) {
    // At the machine's own speed: paced figures are on the emulated clock (emulated_clock.hpp).
    const PacingConfig r = paced_rates(o, 1.0);
    return {r.device_gflops, fmt::format("the emulated device (--machine {})", o.machine)};
  }
  if (o.backend != BackendKind::Cpu) {
    if (root) fmt::print("note: --backend {} without --peak-gflops: MFU is not reported\n", o.backend);
    return {0, "unknown: pass --peak-gflops (the device's peak) for MFU"};
  }
  // The machine's SGEMM peak (machine.hpp): probed now, and never below the best earlier probe.
  const MachinePeak peak = machine_sgemm_peak(world, threads);
  return {peak.gflops, peak.source};
}

// The trainer calls back at each phase of a step: the watchdog hears of the progress, and in
// signal mode this rank's scheduled death strikes there (the trainer then also agrees before
// every update). The watchdog's limit is --hang-timeout, or 20x the step the model's FLOPs take
// at the peak on this rank's share if that is more (a large model on a slow device).
void TrainingRun::hook_into_steps() {
  const double predicted = peak_.gflops > 0 ? training_flops(o_.model, replica_batch(o_), o_.seq) /
                                                  (double(o_.tp) * o_.pp * peak_.gflops * 1e9)
                                            : 0;
  liveness_.emplace(o_.hang_timeout > 0 ? std::max(o_.hang_timeout, 20 * predicted) : 0,
                    signal() ? hang_job_key(o_.out) : std::string(), members_.me, o_.failure_timeout);
  if (signal()) trainer_->set_commit_agreement(true);
  trainer_->set_step_hook([this](StepPoint p) {
    progress(step_, progress_label(p));
    if (liveness_->doomed_at(p)) die();  // the trainer reports neither Start nor Repair: those are the run's own
  });
}

void TrainingRun::progress(int s, const char* what) { liveness_->progress(s, what, root()); }

void TrainingRun::open_results() {
  progress(0, "the start of the run");
  if (root()) {
    record_ = std::make_unique<RunRecord>(o_, *trainer_, peak_, members_.hosts, members_.size());
    record_->open(threads_);
  }
  if (root() && spares_) record_->record_spares(spares_.processes);
  if (root() && o_.pacing.enabled)
    record_->record_paced_machine(paced_machine_record(o_, calibration_ ? &*calibration_ : nullptr));  // spares are numbered in job order
  note_shared_cores();
  record_processes({});
}

// Under --timing wall, ranks that share cores measure their contention, not themselves: the most
// crowded host's ranks per core, said once and recorded (collective over the group).
void TrainingRun::note_shared_cores() {
  double per_core = double(members_.group().split_node()->size()) / std::max(1u, std::thread::hardware_concurrency());
  members_.group().allreduce_max(&per_core, 1);
  if (root() && o_.timing == Timing::Wall && per_core > 1) record_->note_shared_cores(per_core);
}

// /ranks/incarnations: which process holds each logical rank (the group's members not in
// `only`, unless it is empty, are left as they are). Collective over the group.
void TrainingRun::record_processes(const std::vector<int>& only) {
  const auto who =
      members_.group().gather(fmt::format("{} {}", static_cast<long long>(getpid()), host_name()), members_.recorder_index());
  if (root()) record_->incarnations(members_.in_group, who, only, now());
}

void TrainingRun::print_banner() const {
  if (!root() || o_.quiet) return;
  const ModelConfig& m = o_.model;
  const std::string shape =
      m.family == Family::Llama ? fmt::format("llama L={} H={} KV={} d={} ffn={} V={}", m.layers, m.heads, m.kv(),
                                              m.hidden, m.mlp(), m.vocab)
                                : fmt::format("gpt2 L={} H={} d={} V={}", m.layers, m.heads, m.hidden, m.vocab);
  const std::string batch = o_.micro_batches == 1 ? fmt::format("B={} per replica", o_.micro_batch)
                                                  : fmt::format("B={} per replica in {} micro-batches of {}",
                                                                replica_batch(o_), o_.micro_batches, o_.micro_batch);
  const std::string pp = o_.pp > 1 ? fmt::format(" x PP {} (1F1B)", o_.pp) : "";
  const std::string spares =
      spares_.processes.empty() ? ""
                               : fmt::format(" + {} spare process(es) (--spare-use {})", spares_.processes.size(), o_.spare_use);
  fmt::print("ntpbench: {} ranks = {} replicas{} x TP {}{} | model {} ({}, {:.2f}M params) | "
             "{}, T={} | {} thread(s)/rank | timing {}{}\n",
             members_.group().size(), trainer_->topology().replicas, pp, o_.tp, spares, o_.preset, shape, parameter_count(m) / 1e6,
             batch, o_.seq, threads_, o_.timing,
             o_.schedule.empty() ? "" : fmt::format(" | policy {} | schedule {}", o_.policy, o_.schedule));
  fmt::print("data: {}\nresults: {}\n", trainer_->data().describe(), o_.out);
  if (o_.backend == BackendKind::Cpu) fmt::print("blas: {}\n", blas_core_note());
  if (!o_.schedule.empty()) fmt::print("kill mode: {}\n", describe_kill_mode(o_));
  if (o_.pacing.enabled) fmt::print("{}\n", describe_paced_machine(o_, calibration_ ? &*calibration_ : nullptr));
  if (o_.backend != BackendKind::Cpu) fmt::print("communication: {}\n", trainer_->communication());
  std::fflush(stdout);
}

void TrainingRun::calibrate_pacing() {
  calibration_ = calibrate_time_scale(o_, *trainer_, members_.group());
  o_.time_scale = fmt::format("{}", calibration_->scale);
}

void TrainingRun::start_clock() {
  if (o_.straggler_policy == StragglerPolicy::Evict) stragglers_.measure_probe_base(*trainer_, members_);
  members_.group().barrier();  // everyone starts the clock together
  t0_ = std::chrono::steady_clock::now();
  trainer_->clock().take();  // phase accounting starts with the first step
}

void TrainingRun::apply_slowdowns(int s, const StepEvents& ev) {
  for (const Slowdown& d : ev.slow) {
    if (d.rank == members_.me) trainer_->pacer().set_slowdown(d.factor, d.link_factor);
    if (root()) record_->record_slowdown(s, d, now());
  }
}

double TrainingRun::apply_events(int s) {
  const StepEvents& ev = schedule_.at(s);
  apply_slowdowns(s, ev);
  double stragglers = 0;
  try {
    stragglers = act_on_stragglers(s);
  } catch (const PeerFailure& e) {
    // A rank died during the straggler's reconfiguration (undone: act_on_stragglers): repaired
    // as in a step.
    if (!signal()) throw;
    stragglers = recover(s, e, now());
  }
  if (ev.kill.empty() && ev.revive.empty()) return stragglers;
  if (!signal()) return stragglers + reconfigure(s, ev);
  // Signal mode: a victim dies at its phase of this step and the others find out from MPI; ranks
  // to revive are new processes. A kill of a rank already dead (an unscheduled death) is moot, as
  // is a revival of one that lives.
  const bool host_killed =
      std::count(ev.nodes_killed.begin(), ev.nodes_killed.end(), members_.hosts.at(members_.me)) > 0;
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    if (ev.kill[i] == members_.me) liveness_->doom(ev.kill_at[i], ev.kill_hangs[i], host_killed);
  std::vector<int> back;
  for (int r : ev.revive)
    if (!members_.alive[r]) back.push_back(r);
  const double revival = back.empty() ? 0 : revive(s, back);
  // A kill meant for a handover that did not happen (a spare took the rank over already, or none
  // could be served) strikes at the step's start instead.
  liveness_->move_doom(StepPoint::Handover, StepPoint::Start);
  return stragglers + revival;
}

namespace {
// Speeds all at 1 are no speeds (the even split): Trainer::set_rank_speeds' empty.
std::vector<double> unless_all_full(std::vector<double> speed) {
  if (std::all_of(speed.begin(), speed.end(), [](double x) { return x == 1.0; })) speed.clear();
  return speed;
}
}  // namespace

void TrainingRun::forget_straggler(int r) {
  members_.evicted[r] = 0;
  stragglers_.forget(r);
  std::vector<double> speed = trainer_->rank_speeds();
  if (r < int(speed.size()) && speed[r] != 1.0) {
    speed[r] = 1.0;
    trainer_->set_rank_speeds(unless_all_full(std::move(speed)));
  }
}

double TrainingRun::act_on_stragglers(int s) {
  std::vector<StragglerVerdict> verdicts = stragglers_.take_verdicts();
  if (verdicts.empty()) return 0;
  const bool evict = o_.straggler_policy == StragglerPolicy::Evict;
  // An eviction that would stop every replica or lose shards no live rank holds is not made: the
  // straggler is tolerated instead.
  const auto refuse = [&](const std::vector<char>& evicted) -> std::string {
    const std::vector<char> members = members_.training(evicted);
    if (plan_for(o_, trainer_->topology(), members).active_replicas() == 0) return "no replica could train without it";
    if (!trainer_->state_survives(members)) return "no live rank holds its shards";
    return "";
  };
  const auto [evicted, speed, actions] = decide_straggler_actions(std::move(verdicts), evict, members_.alive,
                                                                  members_.evicted, trainer_->rank_speeds(), refuse);
  const bool changed = evicted != members_.evicted || (!evict && speed != trainer_->rank_speeds());
  if (!changed) {
    if (root())
      for (const StragglerAction& a : actions) record_->record_straggler_action(s, a, nullptr, now());
    return 0;
  }
  progress(s, "a reconfiguration for a straggler");
  const double t_event = now();
  const std::vector<char> old_evicted = members_.evicted;
  const std::vector<double> old_speed = trainer_->rank_speeds();
  members_.evicted = evicted;
  if (!evict) trainer_->set_rank_speeds(speed);
  const int before = trainer_->steps_taken();
  Recovery rc;
  try {
    rc = trainer_->reconfigure(members_.training());
  } catch (const PeerFailure&) {
    // A rank died in it: the action is undone everywhere (some ranks may not have begun it) and
    // the repair that follows reconfigures for the old membership; the detector names the
    // straggler again after a window (resync_stragglers).
    members_.evicted = old_evicted;
    trainer_->set_rank_speeds(old_speed);
    throw;
  }
  release_free_memory();
  const RecoveryFigures f = figures(rc, before);
  if (root()) {
    // The reconfiguration's figures go with the first action that changed something.
    bool attached = false;
    for (const StragglerAction& a : actions) {
      const bool here = !attached && a.kind != "evict_refused";
      record_->record_straggler_action(s, a, here ? &f : nullptr, t_event);
      attached = attached || here;
    }
  }
  return f.seconds();
}

// Fence mode: every rank applies the schedule's membership at once.
double TrainingRun::reconfigure(int s, const StepEvents& ev) {
  progress(s, "a reconfiguration");
  const double t_event = now();
  for (int r : ev.kill) members_.alive[r] = 0, forget_straggler(r);
  for (int r : ev.revive) members_.alive[r] = 1;
  const int before = trainer_->steps_taken();
  const Recovery rc = trainer_->reconfigure(members_.training());
  release_free_memory();
  const RecoveryFigures f = figures(rc, before);
  if (root()) record_->record_recovery(s, ev, f, t_event);
  return f.seconds();
}

RecoveryFigures TrainingRun::figures(const Recovery& rc, int steps_before) {
  double slowest[4] = {rc.detect, rc.reconfigure, rc.heal, rc.link_bytes};
  members_.group().allreduce_max(slowest, 4);
  RecoveryFigures f{.rc = rc, .detect = slowest[0], .reconfigure = slowest[1], .heal = slowest[2],
                    .bytes = rc.heal_bytes, .rank_bytes = slowest[3], .steps_before = steps_before};
  members_.group().allreduce_sum(&f.bytes, 1);
  return f;
}

void TrainingRun::run_step(int s, double recovery_seconds) {
  step_ = s;
  for (;;) {
    const double t_start = now();
    double idle_seconds = 0;
    progress(s, "its start");
    try {
      if (liveness_->doomed_at(StepPoint::Start)) die();
      const StepResult r = attempt(s, t_start, recovery_seconds, idle_seconds);
      // A long step (a large model, a slow device) raises the limit: 10x the longest so far.
      liveness_->saw_step(now() - t_start);
      report(s, r, t_start, recovery_seconds, idle_seconds);
      if (r.nonfinite) {
        // Every rank knows (the trainer reduced the flag): the same decision everywhere.
        if (o_.on_nonfinite == OnNonfinite::Stop)
          throw NoProgress(fmt::format("step {}: the loss or the gradient norm is not finite; no parameter was "
                                       "updated (--on-nonfinite skip would skip such steps)",
                                       s),
                           ExitCode::NonFinite);
        ++skipped_steps_;
        return;
      }
      maybe_checkpoint(s, r.samples > 0);
      return;
    } catch (const PeerFailure& e) {
      if (!signal()) throw;
      if (finished_.step == s) {
        // The attempt had finished (its step committed on every rank: the agreement before the
        // update) and the failure showed only after it, in the metrics gather or the checkpoint.
        // Other ranks may be in the next step already, where the repair belongs: this rank keeps
        // the step and meets the failure again at the next step's first call (the group is
        // revoked, or a peer is dead), so every survivor repairs in the same step.
        if (root()) record_->write_missing_row(finished_, members_.group().size());
        return;
      }
      recovery_seconds += recover(s, e, t_start);
      // What the interrupted attempt's pacing measured (transfers waiting on a dead peer until MPI
      // said so) is the failure's time, recorded as `lost`: not the next attempt's lateness.
      trainer_->pacer().reset_counters();
    }
  }
}

// One attempt at step s: the trainer's step (which agrees before the update in signal mode),
// then the wait that ends every rank's row at the same moment.
StepResult TrainingRun::attempt(int s, double t_start, double recovery_seconds, double& idle_seconds) {
  if (trainer_->configuration().active_replicas() == 0) {
    // Nobody can train: the slot lasts as long as a healthy step would (the repair is measured
    // in steps), and it counts against goodput.
    PhaseScope idle(trainer_->clock(), Phase::Idle);
    double wait = root() ? record_->idle_wait() : 0;
    members_.group().broadcast(&wait, sizeof wait, members_.recorder_index());
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    idle_seconds = wait;
  }
  if (members_.evicted[members_.me] && members_.alive[members_.me]) {
    // An evicted straggler measures itself while the others compute their forward and backward
    // (it would wait for them in the step's first collective anyway).
    PhaseScope idle(trainer_->clock(), Phase::Idle);
    stragglers_.probe(*trainer_);
  }
  const StepResult r = trainer_->step();  // with no active replica: advances nothing
  progress(s, "the barrier and the report after the update");
  // The step has committed (or the idle slot passed): a failure from here on does not undo it.
  finished_ = {s, r, t_start, now(), recovery_seconds, idle_seconds};
  if (root()) record_->clear_rank_rows();  // the row's per-rank parts, filled by the metrics gather (report)
  {
    // Ranks that trained less (or not at all) wait here for the rest: idle time, and every
    // rank's phases of this row then end at the same moment.
    PhaseScope idle(trainer_->clock(), Phase::Idle);
    members_.group().barrier();
  }
  return r;
}

// The metrics channel: every rank's phases and loss to the root, which records the row.
void TrainingRun::report(int s, const StepResult& r, double t_start, double recovery_seconds, double idle_seconds) {
  Report mine;
  // The row ends where every rank's phases end (just past the barrier), not after the gather: a
  // slow gather then falls in the next row on every rank alike, and phases never outgrow the row.
  const auto waited = trainer_->clock().take();
  const double t_end = now();
  for (int k = 0; k < kPhaseCount; ++k) mine.phases[k] = r.phase_seconds[k] + waited[k];
  mine.trained = r.trained, mine.loss = r.loss, mine.grad_norm = r.grad_norm, mine.overruns = r.overruns;
  mine.overrun_ratio = r.overrun_ratio, mine.link_overruns = r.link_overruns;
  mine.overrun_seconds = r.overrun_seconds, mine.link_overrun_seconds = r.link_overrun_seconds;
  mine.host_seconds = r.host_seconds;
  mine.slowed = trainer_->pacer().slowdown() != 1.0 ? 1 : 0;
  const ProcessUsage usage = process_usage();
  mine.rss_bytes = double(usage.rss_bytes), mine.open_fds = double(usage.open_fds);
  if (members_.evicted[members_.me]) mine.probe_ratio = stragglers_.probe_ratio();
  const auto usage_of = [](const Report& rep) {
    return RankUsage{static_cast<std::int64_t>(rep.rss_bytes), static_cast<std::int32_t>(rep.open_fds),
                     static_cast<float>(rep.probe_ratio)};
  };
  if (stragglers_.enabled())
    stragglers_.watch(s, mine.phases, r, *trainer_, members_, root() ? record_.get() : nullptr, now());
  // Its own part first: a row written after a failed gather holds what the root knows.
  if (root()) record_->set_rank_row(members_.me, mine.phases, usage_of(mine));
  std::vector<double> gathered(root() ? std::size_t(members_.group().size()) * kReportSize : 0);
  members_.group().gather(reinterpret_cast<const double*>(&mine), kReportSize, gathered.data(), members_.recorder_index());
  if (!root()) return;
  Report agg;
  bool slowed = false;
  double link_overruns = 0, overrun_seconds = 0, link_overrun_seconds = 0, host_seconds = 0;
  for (int k = 0; k < members_.group().size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * kReportSize]);
    record_->set_rank_row(members_.in_group[k], rep->phases, usage_of(*rep));
    if (rep->trained && !agg.trained) agg = *rep;
    link_overruns += rep->link_overruns;
    overrun_seconds += rep->overrun_seconds, link_overrun_seconds += rep->link_overrun_seconds;
    host_seconds += rep->host_seconds;
    slowed = slowed || rep->slowed > 0;
    record_->note_overrun(rep->overrun_ratio);
  }
  // Paced timing's verdict on this step: its worst rank's real time past emulated time (compute
  // over, transfers late where no peer was expected late, the host's own time outside the paced
  // calls), against the step's time. One late rank delays its whole replica: not an average.
  std::vector<RankLateness> late;
  for (int k = 0; k < members_.group().size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * kReportSize]);
    late.push_back({rep->overrun_seconds, rep->link_overrun_seconds, rep->host_seconds});
  }
  const double worst = worst_rank_lateness(late, peers_uneven(trainer_->configuration(), slowed));
  StepResult row = r;
  row.loss = agg.loss, row.grad_norm = agg.grad_norm;
  row.overruns = o_.pacing.enabled && step_overran(worst, t_end - t_start) ? 1 : 0;
  row.link_overruns = static_cast<int>(link_overruns);
  row.overrun_seconds = overrun_seconds, row.link_overrun_seconds = link_overrun_seconds;
  row.host_seconds = host_seconds, row.worst_rank_seconds = worst;
  record_->record_step({s, row, t_start, t_end, recovery_seconds, idle_seconds, slowed}, members_.group().size());
}

void TrainingRun::maybe_checkpoint(int s, bool trained) {
  if (o_.checkpoint_every <= 0 || !trained || trainer_->steps_taken() % o_.checkpoint_every != 0) return;
  const std::string path = checkpoint_path(o_, trainer_->steps_taken());
  progress(s, "a checkpoint");
  const double tc = now();
  if (trainer_->save_checkpoint(path)) {
    release_free_memory();
    if (root()) record_->record_checkpoint(s, tc, now() - tc, path);
  }
  members_.group().barrier();
}

// The final checkpoint (for --replay and resuming), /summary, and the closing line. The run's
// verdict (0; 3, no way forward; 4, not finite), which every live rank reaches alike, is the exit
// status of the recorder alone, the others' 0: Open MPI's launcher can hang when every process
// exits non-zero (finish_mpi).
int TrainingRun::train(int first, double recovery_before_first) {
  const int code = train_steps(first, recovery_before_first);
  liveness_->disarm();
  release_spares();
  return root() ? code : 0;
}

int TrainingRun::train_steps(int first, double recovery_before_first) {
  try {
    for (int s = first; s <= o_.steps; ++s) {
      const bool done = s == first && recovery_before_first >= 0;
      run_step(s, done ? recovery_before_first : apply_events(s));
    }
    write_final_checkpoint();
  } catch (const NoProgress& e) {
    abandon(e);
    return e.exit_code;
  }
  return finish();
}

// The end-of-run checkpoint (for --replay and resuming). A death while it is written (signal
// mode) is repaired as in a step, counted at the last step, and the checkpoint written again by
// the survivors.
void TrainingRun::write_final_checkpoint() {
  for (;;) {
    const std::string final_path = checkpoint_path(o_, trainer_->steps_taken());
    if (!o_.final_checkpoint || trainer_->last_checkpoint() == final_path) return;
    progress(o_.steps, "the final checkpoint");
    const double t_start = now();
    try {
      trainer_->save_checkpoint(final_path);
      members_.group().barrier();
      if (root()) record_->note_final_checkpoint(t_start, now() - t_start);
      if (trainer_->configuration().active_replicas() == 0 && root())
        record_->note_no_final_checkpoint();
      return;
    } catch (const PeerFailure& e) {
      if (!signal()) throw;
      recover(o_.steps, e, t_start);
    }
  }
}

int TrainingRun::finish() {
  // Every rank knows whether the last step was non-finite (the trainer reduced the flag).
  const int code = finished_.r.nonfinite ? 4 : 0;
  progress(o_.steps, "the end of the run");
  const GroupBarrierOnExit last{members_.group()};
  if (!root()) return code;
  record_->finish(now(), trainer_->last_checkpoint(), skipped_steps_, code);
  if (spares_) record_->spares_left(static_cast<int>(spares_.pool->live_spares().size()));
  return code;
}

void TrainingRun::abandon(const NoProgress& e) {
  progress(step_, "the end of the run");
  const GroupBarrierOnExit last{members_.group()};
  if (!root()) return;
  if (!record_) take_over_recorder({});
  record_->abandon(now(), e.what());
}

}  // namespace ntp
