// The training loop of one rank: the start, the schedule's events, each step's attempt and
// report, checkpoints and the end of the run (what the recorder writes of them: run_record.cpp).
#include "training_run.hpp"

#include "blas_core.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "machine.hpp"

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
  double control_calls = 0, control_bytes = 0;  // on the run's group since the last report
  double moe_kept = 0, moe_dropped = 0, moe_load_max = 0;  // StepResult's
};

constexpr int kReportSize = sizeof(Report) / sizeof(double);

// What goes on the channel: the report, then a mixture of experts' kept assignments per expert
// (`experts` more values, none for a dense model; zero where this rank did not route: only a
// replica-stage's first TP rank does).
std::vector<double> report_values(const Report& mine, const StepResult& r, int experts) {
  std::vector<double> values(std::size_t(kReportSize) + std::size_t(experts), 0.0);
  std::memcpy(values.data(), &mine, sizeof mine);
  for (std::size_t e = 0; e < r.moe_tokens_per_expert.size() && e < std::size_t(experts); ++e)
    values[kReportSize + e] = double(r.moe_tokens_per_expert[e]);
  return values;
}

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
  const double predicted = run_.peak.gflops > 0 ? training_flops(run_.o.model, replica_batch(run_.o), run_.o.seq) /
                                                  (double(run_.o.tp) * run_.o.pp * run_.peak.gflops * 1e9)
                                            : 0;
  run_.liveness.emplace(run_.o.hang_timeout > 0 ? std::max(run_.o.hang_timeout, 20 * predicted) : 0,
                    run_.signal() ? hang_job_key(run_.o.out) : std::string(), run_.members.me, run_.o.failure_timeout);
  if (run_.signal()) run_.trainer->set_commit_agreement(true);
  run_.trainer->set_step_hook([this](StepPoint p) {
    run_.progress(step_, progress_label(p));
    if (run_.liveness->doomed_at(p))
      run_.die();  // the trainer reports neither Start nor Repair: those are the run's own
  });
}

void TrainingRun::open_results() {
  run_.progress(0, "the start of the run");
  if (run_.root()) {
    run_.record =
        std::make_unique<RunRecord>(run_.o, *run_.trainer, run_.peak, run_.members.hosts, run_.members.size());
    run_.record->open(run_.threads);
  }
  // Spares are numbered in job order.
  if (run_.root() && recovery_.spare_pool()) run_.record->record_spares(recovery_.spare_processes());
  if (run_.root() && run_.o.pacing.enabled)
    run_.record->record_paced_machine(paced_machine_record(run_.o, calibration_ ? &*calibration_ : nullptr));
  note_shared_cores();
  run_.record_processes({});
}

// Under --timing wall, ranks that share cores measure their contention, not themselves: the most
// crowded host's ranks per core, said once and recorded (collective over the group).
void TrainingRun::note_shared_cores() {
  double per_core =
      double(run_.members.group().split_node()->size()) / std::max(1u, std::thread::hardware_concurrency());
  run_.members.group().allreduce_max(&per_core, 1);
  if (run_.root() && run_.o.timing == Timing::Wall && per_core > 1) run_.record->note_shared_cores(per_core);
}

void TrainingRun::print_banner() const {
  if (!run_.root() || run_.o.quiet) return;
  const ModelConfig& m = run_.o.model;
  const std::string shape =
      m.family == Family::Llama ? fmt::format("llama L={} H={} KV={} d={} ffn={} V={}", m.layers, m.heads, m.kv(),
                                              m.hidden, m.mlp(), m.vocab)
                                : fmt::format("gpt2 L={} H={} d={} V={}", m.layers, m.heads, m.hidden, m.vocab);
  const std::string batch = run_.o.micro_batches == 1
                                ? fmt::format("B={} per replica", run_.o.micro_batch)
                                : fmt::format("B={} per replica in {} micro-batches of {}", replica_batch(run_.o),
                                              run_.o.micro_batches, run_.o.micro_batch);
  const std::string pp = run_.o.pp > 1 ? fmt::format(" x PP {} (1F1B)", run_.o.pp) : "";
  const std::string spares = recovery_.spare_processes().empty()
                                 ? ""
                                 : fmt::format(" + {} spare process(es) (--spare-use {})",
                                               recovery_.spare_processes().size(), run_.o.spare_use);
  fmt::print(
      "ntpbench: {} ranks = {} replicas{} x TP {}{} | model {} ({}, {:.2f}M params) | "
      "{}, T={} | {} thread(s)/rank | timing {}{}\n",
      run_.members.group().size(), run_.trainer->topology().replicas, pp, run_.o.tp, spares, run_.o.preset, shape,
      parameter_count(m) / 1e6, batch, run_.o.seq, run_.threads, run_.o.timing,
      run_.o.schedule.empty() ? "" : fmt::format(" | policy {} | schedule {}", run_.o.policy, run_.o.schedule));
  fmt::print("data: {}\nresults: {}\n", run_.trainer->data().describe(), run_.o.out);
  if (run_.o.backend == BackendKind::Cpu) fmt::print("blas: {}\n", blas_core_note());
  if (!run_.o.schedule.empty()) fmt::print("kill mode: {}\n", describe_kill_mode(run_.o));
  if (run_.o.pacing.enabled)
    fmt::print("{}\n", describe_paced_machine(run_.o, calibration_ ? &*calibration_ : nullptr));
  if (run_.o.backend != BackendKind::Cpu) fmt::print("communication: {}\n", run_.trainer->communication());
  std::fflush(stdout);
}

void TrainingRun::calibrate_pacing() {
  calibration_ = calibrate_time_scale(run_.o, *run_.trainer, run_.members.group());
  run_.o.time_scale = calibration_->scale;
}

void TrainingRun::start_clock() {
  if (run_.o.straggler_policy == StragglerPolicy::Evict)
    run_.stragglers.measure_probe_base(*run_.trainer, run_.members);
  run_.members.group().barrier();  // everyone starts the clock together
  run_.t0 = std::chrono::steady_clock::now();
  run_.trainer->clock().take();  // phase accounting starts with the first step
  // The control plane is counted from here too: the start-up's calls (the time scale's
  // calibration among them, which --time-scale changes) are in no step's row.
  reported_ = run_.members.control();
}

void TrainingRun::apply_slowdowns(int s, const StepEvents& ev) {
  for (const Slowdown& d : ev.slow) {
    if (d.rank == run_.members.me) run_.trainer->pacer().set_slowdown(d.factor, d.link_factor);
    if (run_.root()) run_.record->record_slowdown(s, d, run_.now());
  }
}

double TrainingRun::apply_events(int s) {
  const StepEvents& ev = run_.schedule.at(s);
  apply_slowdowns(s, ev);
  double stragglers = 0;
  try {
    stragglers = act_on_stragglers(s);
  } catch (const PeerFailure& e) {
    // A rank died during the straggler's reconfiguration (undone: act_on_stragglers): repaired
    // as in a step.
    if (!run_.signal()) throw;
    stragglers = recovery_.repair(s, e, run_.now());
  }
  if (ev.kill.empty() && ev.revive.empty()) return stragglers;
  if (!run_.signal()) return stragglers + recovery_.apply_membership(s, ev);
  // Signal mode: a victim dies at its phase of this step and the others find out from MPI; ranks
  // to revive are new processes. A kill of a rank already dead (an unscheduled death) is moot, as
  // is a revival of one that lives.
  const bool host_killed =
      std::count(ev.nodes_killed.begin(), ev.nodes_killed.end(), run_.members.hosts.at(run_.members.me)) > 0;
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    if (ev.kill[i] == run_.members.me) run_.liveness->doom(ev.kill_at[i], ev.kill_hangs[i], host_killed);
  std::vector<int> back;
  for (int r : ev.revive)
    if (!run_.members.alive[r]) back.push_back(r);
  const double revival = back.empty() ? 0 : recovery_.revive(s, back);
  // A kill meant for a handover that did not happen (a spare took the rank over already, or none
  // could be served) strikes at the step's start instead.
  run_.liveness->move_doom(StepPoint::Handover, StepPoint::Start);
  return stragglers + revival;
}

double TrainingRun::act_on_stragglers(int s) {
  std::vector<StragglerVerdict> verdicts = run_.stragglers.take_verdicts();
  if (verdicts.empty()) return 0;
  const bool evict = run_.o.straggler_policy == StragglerPolicy::Evict;
  // An eviction that would stop every replica or lose shards no live rank holds is not made: the
  // straggler is tolerated instead.
  const auto refuse = [&](const std::vector<char>& evicted) -> std::string {
    const std::vector<char> members = run_.members.training(evicted);
    if (plan_for(run_.o, run_.trainer->topology(), members).active_replicas() == 0)
      return "no replica could train without it";
    if (!run_.trainer->state_survives(members)) return "no live rank holds its shards";
    return "";
  };
  const auto [evicted, speed, actions] = decide_straggler_actions(
      std::move(verdicts), evict, run_.members.alive, run_.members.evicted, run_.trainer->rank_speeds(), refuse);
  const bool changed = evicted != run_.members.evicted || (!evict && speed != run_.trainer->rank_speeds());
  if (!changed) {
    if (run_.root())
      for (const StragglerAction& a : actions) run_.record->record_straggler_action(s, a, nullptr, run_.now());
    return 0;
  }
  run_.progress(s, "a reconfiguration for a straggler");
  const double t_event = run_.now();
  const std::vector<char> old_evicted = run_.members.evicted;
  const std::vector<double> old_speed = run_.trainer->rank_speeds();
  run_.members.evicted = evicted;
  if (!evict) run_.trainer->set_rank_speeds(speed);
  const int before = run_.trainer->steps_taken();
  Reconfiguration rc;
  try {
    rc = run_.trainer->reconfigure(run_.members.training());
  } catch (const PeerFailure&) {
    // A rank died in it: the action is undone everywhere (some ranks may not have begun it) and
    // the repair that follows reconfigures for the old membership; the detector names the
    // straggler again after a window (resync_stragglers).
    run_.members.evicted = old_evicted;
    run_.trainer->set_rank_speeds(old_speed);
    throw;
  }
  release_free_memory();
  const RecoveryFigures f = run_.figures(rc, before);
  if (run_.root()) {
    // The reconfiguration's figures go with the first action that changed something.
    bool attached = false;
    for (const StragglerAction& a : actions) {
      const bool here = !attached && a.kind != StragglerActionKind::EvictRefused;
      run_.record->record_straggler_action(s, a, here ? &f : nullptr, t_event);
      attached = attached || here;
    }
  }
  return f.seconds();
}

void TrainingRun::run_step(int s, double recovery_seconds) {
  step_ = s;
  for (;;) {
    const double t_start = run_.now();
    double idle_seconds = 0;
    run_.progress(s, "its start");
    try {
      if (run_.liveness->doomed_at(StepPoint::Start)) run_.die();
      const StepResult r = attempt(s, t_start, recovery_seconds, idle_seconds);
      // A long step (a large model, a slow device) raises the limit: 10x the longest so far.
      run_.liveness->saw_step(run_.now() - t_start);
      report(s, r, t_start, recovery_seconds, idle_seconds);
      if (r.nonfinite) {
        // Every rank knows (the trainer reduced the flag): the same decision everywhere.
        if (run_.o.on_nonfinite == OnNonfinite::Stop)
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
      if (!run_.signal()) throw;
      if (run_.finished.step == s) {
        // The attempt had finished (its step committed on every rank: the agreement before the
        // update) and the failure showed only after it, in the metrics gather or the checkpoint.
        // Other ranks may be in the next step already, where the repair belongs: this rank keeps
        // the step and meets the failure again at the next step's first call (the group is
        // revoked, or a peer is dead), so every survivor repairs in the same step.
        if (run_.root()) run_.record->write_missing_row(run_.finished, run_.members.group().size());
        return;
      }
      recovery_seconds += recovery_.repair(s, e, t_start);
      // What the interrupted attempt's pacing measured (transfers waiting on a dead peer until MPI
      // said so) is the failure's time, recorded as `lost`: not the next attempt's lateness.
      run_.trainer->pacer().reset_counters();
    }
  }
}

// One attempt at step s: the trainer's step (which agrees before the update in signal mode),
// then the wait that ends every rank's row at the same moment.
StepResult TrainingRun::attempt(int s, double t_start, double recovery_seconds, double& idle_seconds) {
  if (run_.trainer->configuration().active_replicas() == 0) {
    // Nobody can train: the slot lasts as long as a healthy step would (the repair is measured
    // in steps), and it counts against goodput.
    PhaseScope idle(run_.trainer->clock(), Phase::Idle);
    double wait = run_.root() ? run_.record->idle_wait() : 0;
    run_.members.group().broadcast(&wait, sizeof wait, run_.members.recorder_index());
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    idle_seconds = wait;
  }
  if (run_.members.evicted[run_.members.me] && run_.members.alive[run_.members.me]) {
    // An evicted straggler measures itself while the others compute their forward and backward
    // (it would wait for them in the step's first collective anyway).
    PhaseScope idle(run_.trainer->clock(), Phase::Idle);
    run_.stragglers.probe(*run_.trainer);
  }
  const StepResult r = run_.trainer->step();  // with no active replica: advances nothing
  run_.progress(s, "the barrier and the report after the update");
  // The step has committed (or the idle slot passed): a failure from here on does not undo it.
  run_.finished = {s, r, t_start, run_.now(), recovery_seconds, idle_seconds};
  if (run_.root()) run_.record->clear_rank_rows();  // the row's per-rank parts, filled by the metrics gather (report)
  {
    // Ranks that trained less (or not at all) wait here for the rest: idle time, and every
    // rank's phases of this row then end at the same moment.
    PhaseScope idle(run_.trainer->clock(), Phase::Idle);
    run_.members.group().barrier();
  }
  return r;
}

// The metrics channel: every rank's phases and loss to the root, which records the row.
void TrainingRun::report(int s, const StepResult& r, double t_start, double recovery_seconds, double idle_seconds) {
  Report mine;
  // The row ends where every rank's phases end (just past the barrier), not after the gather: a
  // slow gather then falls in the next row on every rank alike, and phases never outgrow the row.
  const auto waited = run_.trainer->clock().take();
  const double t_end = run_.now();
  for (int k = 0; k < kPhaseCount; ++k) mine.phases[k] = r.phase_seconds[k] + waited[k];
  mine.trained = r.trained, mine.loss = r.loss, mine.grad_norm = r.grad_norm, mine.overruns = r.overruns;
  mine.overrun_ratio = r.overrun_ratio, mine.link_overruns = r.link_overruns;
  mine.overrun_seconds = r.overrun_seconds, mine.link_overrun_seconds = r.link_overrun_seconds;
  mine.host_seconds = r.host_seconds;
  mine.moe_kept = double(r.moe_kept), mine.moe_dropped = double(r.moe_dropped), mine.moe_load_max = r.moe_load_max;
  mine.slowed = run_.trainer->pacer().slowdown() != 1.0 ? 1 : 0;
  const ProcessUsage usage = process_usage();
  mine.rss_bytes = double(usage.rss_bytes), mine.open_fds = double(usage.open_fds);
  if (run_.members.evicted[run_.members.me]) mine.probe_ratio = run_.stragglers.probe_ratio();
  // The control plane since the last report, that report's gather included (this one's counts in
  // the next).
  const CommTally& control = run_.members.control();
  mine.control_calls = double(control.calls - reported_.calls), mine.control_bytes = control.bytes - reported_.bytes;
  reported_ = control;
  const auto usage_of = [](const Report& rep) {
    return RankUsage{static_cast<std::int64_t>(rep.rss_bytes), static_cast<std::int32_t>(rep.open_fds),
                     static_cast<float>(rep.probe_ratio)};
  };
  if (run_.stragglers.enabled())
    run_.stragglers.watch(s, mine.phases, r, *run_.trainer, run_.members, run_.root() ? run_.record.get() : nullptr,
                          run_.now());
  // Its own part first: a row written after a failed gather holds what the root knows.
  if (run_.root()) run_.record->set_rank_row(run_.members.me, mine.phases, usage_of(mine));
  const int experts = run_.o.model.experts;
  const std::vector<double> sent = report_values(mine, r, experts);
  const std::size_t stride = sent.size();
  std::vector<double> gathered(run_.root() ? std::size_t(run_.members.group().size()) * stride : 0);
  run_.members.group().gather(sent.data(), stride, gathered.data(), run_.members.recorder_index());
  if (!run_.root()) return;
  Report agg;
  bool slowed = false;
  double link_overruns = 0, overrun_seconds = 0, link_overrun_seconds = 0, host_seconds = 0;
  CommTally control_plane;
  double moe_kept = 0, moe_dropped = 0, moe_load_max = 0;
  std::vector<std::int64_t> expert_tokens(std::size_t(experts), 0);
  for (int k = 0; k < run_.members.group().size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * stride]);
    for (int e = 0; e < experts; ++e) expert_tokens[e] += std::int64_t(gathered[std::size_t(k) * stride + kReportSize + e]);
    run_.record->set_rank_row(run_.members.in_group[k], rep->phases, usage_of(*rep));
    if (rep->trained && !agg.trained) agg = *rep;
    control_plane.calls += static_cast<long long>(rep->control_calls), control_plane.bytes += rep->control_bytes;
    moe_kept += rep->moe_kept, moe_dropped += rep->moe_dropped, moe_load_max = std::max(moe_load_max, rep->moe_load_max);
    link_overruns += rep->link_overruns;
    overrun_seconds += rep->overrun_seconds, link_overrun_seconds += rep->link_overrun_seconds;
    host_seconds += rep->host_seconds;
    slowed = slowed || rep->slowed > 0;
    run_.record->note_overrun(rep->overrun_ratio);
  }
  // Paced timing's verdict on this step: its worst rank's real time past emulated time (compute
  // over, transfers late where no peer was expected late, the host's own time outside the paced
  // calls), against the step's time. One late rank delays its whole replica: not an average.
  std::vector<RankLateness> late;
  for (int k = 0; k < run_.members.group().size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * stride]);
    late.push_back({rep->overrun_seconds, rep->link_overrun_seconds, rep->host_seconds});
  }
  const double worst = worst_rank_lateness(late, peers_uneven(run_.trainer->configuration(), slowed));
  StepResult row = r;
  row.loss = agg.loss, row.grad_norm = agg.grad_norm;
  row.overruns = run_.o.pacing.enabled && step_overran(worst, t_end - t_start) ? 1 : 0;
  row.link_overruns = static_cast<int>(link_overruns);
  row.overrun_seconds = overrun_seconds, row.link_overrun_seconds = link_overrun_seconds;
  row.host_seconds = host_seconds, row.worst_rank_seconds = worst;
  row.moe_kept = static_cast<long long>(moe_kept), row.moe_dropped = static_cast<long long>(moe_dropped);
  row.moe_load_max = moe_load_max;
  row.moe_tokens_per_expert = std::move(expert_tokens);
  run_.record->record_step({s, row, t_start, t_end, recovery_seconds, idle_seconds, slowed, control_plane},
                           run_.members.group().size());
}

void TrainingRun::maybe_checkpoint(int s, bool trained) {
  if (run_.o.checkpoint_every <= 0 || !trained || run_.trainer->steps_taken() % run_.o.checkpoint_every != 0) return;
  const std::string path = checkpoint_path(run_.o, run_.trainer->steps_taken());
  run_.progress(s, "a checkpoint");
  const double tc = run_.now();
  if (run_.trainer->save_checkpoint(path)) {
    release_free_memory();
    if (run_.root()) run_.record->record_checkpoint(s, tc, run_.now() - tc, path);
  }
  run_.members.group().barrier();
}

// The final checkpoint (for --replay and resuming), /summary, and the closing line. The run's
// verdict (0; 3, no way forward; 4, not finite), which every live rank reaches alike, is the exit
// status of the recorder alone, the others' 0: Open MPI's launcher can hang when every process
// exits non-zero (finish_mpi).
int TrainingRun::train(int first, double recovery_before_first) {
  const int code = train_steps(first, recovery_before_first);
  run_.liveness->disarm();
  recovery_.release_spares();
  return run_.root() ? code : 0;
}

int TrainingRun::train_steps(int first, double recovery_before_first) {
  try {
    for (int s = first; s <= run_.o.steps; ++s) {
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
    const std::string final_path = checkpoint_path(run_.o, run_.trainer->steps_taken());
    if (!run_.o.final_checkpoint || run_.trainer->last_checkpoint() == final_path) return;
    run_.progress(run_.o.steps, "the final checkpoint");
    const double t_start = run_.now();
    try {
      run_.trainer->save_checkpoint(final_path);
      run_.members.group().barrier();
      if (run_.root()) run_.record->note_final_checkpoint(t_start, run_.now() - t_start);
      if (run_.trainer->configuration().active_replicas() == 0 && run_.root())
        run_.record->note_no_final_checkpoint();
      return;
    } catch (const PeerFailure& e) {
      if (!run_.signal()) throw;
      recovery_.repair(run_.o.steps, e, t_start);
    }
  }
}

int TrainingRun::finish() {
  // Every rank knows whether the last step was non-finite (the trainer reduced the flag).
  const int code = run_.finished.r.nonfinite ? 4 : 0;
  run_.progress(run_.o.steps, "the end of the run");
  const GroupBarrierOnExit last{run_.members.group()};
  if (!run_.root()) return code;
  run_.record->finish(run_.now(), run_.trainer->last_checkpoint(), skipped_steps_, code);
  if (recovery_.spare_pool()) run_.record->spares_left(static_cast<int>(recovery_.spare_pool()->live_spares().size()));
  return code;
}

void TrainingRun::abandon(const NoProgress& e) {
  run_.progress(step_, "the end of the run");
  const GroupBarrierOnExit last{run_.members.group()};
  if (!run_.root()) return;
  if (!run_.record) recovery_.take_over_recorder({});
  run_.record->abandon(run_.now(), e.what());
}

}  // namespace ntp
