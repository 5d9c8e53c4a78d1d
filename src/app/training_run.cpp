// The training loop of one rank: start-up records, the schedule's events, each step's attempt,
// report and row, checkpoints and the end of the run.
#include "training_run.hpp"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

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

// What every rank reports to rank 0 after a step (the metrics channel), its process's memory and
// descriptors included (a soak checks they stay flat).
struct Report {
  std::array<double, kPhaseCount> phases{};
  double trained = 0, loss = 0, grad_norm = 0, overruns = 0;
  double rss_bytes = -1, open_fds = -1;
};

constexpr int kReportSize = sizeof(Report) / sizeof(double);

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Where a rank's scheduled death strikes, as the trainer names it.
StepPoint step_point(KillAt at) {
  switch (at) {
    case KillAt::Forward: return StepPoint::Forward;
    case KillAt::Backward: return StepPoint::Backward;
    case KillAt::Sync: return StepPoint::Sync;
    default: return StepPoint::Optimizer;
  }
}

const char* step_point_name(StepPoint p) {
  switch (p) {
    case StepPoint::Forward: return "forward";
    case StepPoint::Backward: return "backward";
    case StepPoint::Sync: return "gradient sync";
    default: return "optimizer";
  }
}

// A scheduled kill in signal mode: the process ends here, as a crashed GPU's host process would.
[[noreturn]] void die() {
  std::fflush(nullptr);
  raise(SIGKILL);
  std::abort();  // not reached
}

}  // namespace

Peak find_peak(const Options& o, Comm& world, int threads) {
  const bool root = world.rank() == 0;
  if (o.peak_gflops > 0) return {o.peak_gflops, "--peak-gflops"};
  if (o.pacing.enabled) return {o.pacing.device_gflops, "--device-gflops (paced timing)"};
  if (o.backend != "cpu") {
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
  hang_limit_ = o_.hang_timeout > 0 ? std::max(o_.hang_timeout, 20 * predicted) : 0;
  if (signal()) trainer_->set_commit_agreement(true);
  trainer_->set_step_hook([this](StepPoint p) {
    progress(step_, step_point_name(p));
    if (doom_ && *doom_ != KillAt::Start && step_point(*doom_) == p) die();
  });
}

void TrainingRun::progress(int s, const char* what) {
  if (hang_limit_ <= 0) return;
  watchdog_.arm(hang_limit_,
                fmt::format("rank {} made no progress for {:.0f} s in step {} ({}): a peer has stopped without "
                            "dying, or the MPI library hangs; this process ends so that the job does (exit code 5; "
                            "--hang-timeout sets the limit){}",
                            me_, hang_limit_, s, what, root() ? "; the results file holds the steps before it" : ""));
}

void TrainingRun::open_results() {
  progress(0, "the start of the run");
  if (root()) {
    rec_ = std::make_unique<Recorder>(o_.out, o_.overwrite, group_->size(), trainer_->topology().replicas);
    const nlohmann::json env = environment_record();
    for (auto& [k, v] : env.items()) rec_->set_attr(k, v.get<std::string>());
    rec_->set_attr("config", to_json(o_).dump());
    rec_->set_attr("ranks", static_cast<long long>(group_->size()));
    rec_->set_attr("tp", static_cast<long long>(o_.tp));
    rec_->set_attr("pp", static_cast<long long>(o_.pp));
    rec_->set_attr("micro_batches", static_cast<long long>(o_.micro_batches));
    std::vector<int> stages;
    for (int r = 0; r < group_->size(); ++r) stages.push_back(Topology(group_->size(), r, o_.tp, o_.pp).stage);
    rec_->set_rank_stages(stages);
    rec_->set_attr("replicas", static_cast<long long>(trainer_->topology().replicas));
    rec_->set_attr("timing", o_.timing);
    rec_->set_attr("policy", o_.schedule.empty() ? std::string("none") : o_.policy);
    rec_->set_attr("threads_per_rank", static_cast<long long>(threads_));
    rec_->set_attr("peak_gflops_per_rank", peak_.gflops);
    rec_->set_attr("peak_gflops_source", peak_.source);
    rec_->set_attr("data", trainer_->data().describe());
    rec_->set_attr("tokens_per_sample", static_cast<long long>(o_.seq));
  }
  if (root()) rec_->set_attr("hosts", nlohmann::json(hosts_).dump());
  if (root() && spares_) {  // spares are numbered in job order; a takeover names the spare
    nlohmann::json spares = nlohmann::json::array();
    for (std::size_t k = 0; k < spare_processes_.size(); ++k) {
      const auto space = spare_processes_[k].find(' ');
      spares.push_back({{"spare", k}, {"pid", std::stoll(spare_processes_[k].substr(0, space))},
                        {"host", spare_processes_[k].substr(space + 1)}});
    }
    rec_->set_attr("spares", spares.dump());
  }
  record_processes({});
}

// /ranks/incarnations: which process holds each logical rank (the group's members not in
// `only`, unless it is empty, are left as they are). Collective over the group.
void TrainingRun::record_processes(const std::vector<int>& only) {
  const auto who =
      group_->gather(fmt::format("{} {}", static_cast<long long>(getpid()), host_name()), root_index());
  if (!root()) return;
  for (std::size_t k = 0; k < who.size(); ++k) {
    const int r = members_[k];
    if (!only.empty() && std::find(only.begin(), only.end(), r) == only.end()) continue;
    const auto space = who[k].find(' ');
    rec_->incarnation_start(r, std::stoll(who[k].substr(0, space)), who[k].substr(space + 1), only.empty() ? 0.0 : now());
  }
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
  fmt::print("ntpbench: {} ranks = {} replicas{} x TP {} | model {} ({}, {:.2f}M params) | "
             "{}, T={} | {} thread(s)/rank | timing {}{}\n",
             group_->size(), trainer_->topology().replicas, pp, o_.tp, o_.preset, shape, parameter_count(m) / 1e6,
             batch, o_.seq, threads_, o_.timing,
             o_.schedule.empty() ? "" : fmt::format(" | policy {} | schedule {}", o_.policy, o_.schedule));
  fmt::print("data: {}\nresults: {}\n", trainer_->data().describe(), o_.out);
  if (o_.backend != "cpu") fmt::print("communication: {}\n", trainer_->communication());
  std::fflush(stdout);
}

void TrainingRun::start_clock() {
  group_->barrier();  // everyone starts the clock together
  t0_ = std::chrono::steady_clock::now();
  trainer_->clock().take();  // phase accounting starts with the first step
}

double TrainingRun::apply_events(int s) {
  const StepEvents& ev = schedule_.at(s);
  if (ev.kill.empty() && ev.revive.empty()) return 0;
  if (!signal()) return reconfigure(s, ev);
  // Signal mode: a victim dies at its phase of this step and the others find out from MPI; ranks
  // to revive are new processes. A kill of a rank already dead (an unscheduled death) is moot, as
  // is a revival of one that lives.
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    if (ev.kill[i] == me_) doom_ = ev.kill_at[i];
  std::vector<int> back;
  for (int r : ev.revive)
    if (!alive_[r]) back.push_back(r);
  return back.empty() ? 0 : revive(s, back);
}

// Fence mode: every rank applies the schedule's membership at once.
double TrainingRun::reconfigure(int s, const StepEvents& ev) {
  progress(s, "a reconfiguration");
  const double t_event = now();
  for (int r : ev.kill) alive_[r] = 0;
  for (int r : ev.revive) alive_[r] = 1;
  const int before = trainer_->steps_taken();
  const Recovery rc = trainer_->reconfigure(alive_);
  release_free_memory();
  // The recovery's figures: slowest rank for times, all ranks for bytes.
  double worst[3] = {rc.detect, rc.reconfigure, rc.heal};
  group_->allreduce_max(worst, 3);
  double bytes = rc.heal_bytes;
  group_->allreduce_sum(&bytes, 1);
  if (root()) record_recovery(s, ev, rc, t_event, worst, bytes, before);
  return worst[0] + worst[1] + worst[2];
}

// Rank 0: the recovery's events and its line on the console.
void TrainingRun::record_recovery(int s, const StepEvents& ev, const Recovery& rc, double t_event,
                                  const double worst[3], double bytes, int steps_before,
                                  const std::vector<std::string>* kill_details, double t_kill) {
  for (std::size_t i = 0; i < ev.kill.size(); ++i)
    rec_->event(make_event(t_kill >= 0 ? t_kill : t_event, s, "kill", ev.kill[i],
                           trainer_->topology().replica_of_rank(ev.kill[i]), 0, 0,
                           kill_details ? (*kill_details)[i] : ""));
  for (int r : ev.revive)
    rec_->event(make_event(t_event, s, "revive", r, trainer_->topology().replica_of_rank(r), 0, 0, ""));
  // A whole node's failure or return (kill_node / revive_node): one event naming its ranks.
  const auto node_event = [&](const std::string& host, const char* kind, double t) {
    std::vector<int> on;
    for (int r = 0; r < int(hosts_.size()); ++r)
      if (hosts_[r] == host) on.push_back(r);
    rec_->event(make_event(t, s, kind, -1, -1, 0, 0, fmt::format("{}: ranks {}", host, on)));
  };
  for (const auto& h : ev.nodes_killed) node_event(h, "node_down", t_kill >= 0 ? t_kill : t_event);
  for (const auto& h : ev.nodes_revived) node_event(h, "node_up", t_event);
  const std::string change = fmt::format("TP {} -> {}", rc.before, rc.after);
  rec_->event(make_event(t_event, s, "detect", -1, -1, 0, worst[0], ""));
  rec_->event(make_event(t_event + worst[0], s, "reconfigure", -1, -1, 0, worst[1], change));
  std::string what = fmt::format("step {:5d}: {}{}| detect {:.2f} ms | reconfigure {:.2f} ms | ", s,
                                 ev.kill.empty() ? "" : fmt::format("kill {} ", ev.kill),
                                 ev.revive.empty() ? "" : fmt::format("revive {} ", ev.revive), worst[0] * 1e3,
                                 worst[1] * 1e3);
  const double t_heal = t_event + worst[0] + worst[1];
  if (rc.restored) {
    rec_->event(make_event(t_heal, s, "restore", -1, -1, bytes, worst[2],
                           fmt::format("from {} (optimizer step {})", rc.restored_from, rc.restored_step)));
    const auto [lost_rows, lost_seconds] = rec_->roll_back_after(rc.restored_step);
    rec_->event(make_event(t_event, s, "rollback", -1, -1, 0, 0,
                           fmt::format("{} steps rolled back (optimizer step {} -> {})", lost_rows, steps_before,
                                       rc.restored_step)));
    rec_->event(make_event(t_event, s, "recompute", -1, -1, 0, lost_seconds, fmt::format("{} steps to redo", lost_rows)));
    what += fmt::format("no live replica holds every shard: restored {} (optimizer step {}), {} steps rolled "
                        "back ({:.2f} s to recompute) | {}",
                        rc.restored_from, rc.restored_step, lost_rows, lost_seconds, change);
  } else if (trainer_->configuration().active_replicas() == 0) {
    what += fmt::format("every replica is down: idle until a revival | {}", change);
  } else {
    rec_->event(make_event(t_heal, s, "heal", -1, -1, bytes, worst[2], change));
    what += fmt::format("heal {:.2f} MB in {:.2f} ms | {}", bytes / 1e6, worst[2] * 1e3, change);
  }
  fmt::print("{}\n", what);
  std::fflush(stdout);
}

void TrainingRun::run_step(int s, double recovery_seconds) {
  step_ = s;
  for (;;) {
    const double t_start = now();
    double idle_seconds = 0;
    progress(s, "its start");
    try {
      if (doom_ == KillAt::Start) die();
      const StepResult r = attempt(s, t_start, recovery_seconds, idle_seconds);
      // A long step (a large model, a slow device) raises the limit: 10x the longest so far.
      if (hang_limit_ > 0) hang_limit_ = std::max(hang_limit_, 10 * (now() - t_start));
      report(s, r, t_start, recovery_seconds, idle_seconds);
      if (r.nonfinite) {
        // Every rank knows (the trainer reduced the flag): the same decision everywhere.
        if (o_.on_nonfinite == "stop")
          throw NoProgress(fmt::format("step {}: the loss or the gradient norm is not finite; no parameter was "
                                       "updated (--on-nonfinite skip would skip such steps)",
                                       s),
                           4);
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
        write_missing_row();
        return;
      }
      restored_ = false;
      recovery_seconds += recover(s, e, t_start);
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
    double wait = root() ? (healthy_step_seconds_.empty() ? last_step_seconds_ : median(healthy_step_seconds_)) : 0;
    group_->broadcast(&wait, sizeof wait, root_index());
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    idle_seconds = wait;
  }
  const StepResult r = trainer_->step();  // with no active replica: advances nothing
  progress(s, "the barrier and the report after the update");
  // The step has committed (or the idle slot passed): a failure from here on does not undo it.
  last_ = r;
  finished_ = {s, r, t_start, now(), recovery_seconds, idle_seconds};
  if (root()) {  // the row's per-rank parts, filled by the metrics gather (report)
    std::fill(phase_rows_.begin(), phase_rows_.end(), std::array<double, kPhaseCount>{});
    std::fill(usage_rows_.begin(), usage_rows_.end(), RankUsage{});
  }
  {
    // Ranks that trained less (or not at all) wait here for the rest: idle time, and every
    // rank's phases of this row then end at the same moment.
    PhaseScope idle(trainer_->clock(), Phase::Idle);
    group_->barrier();
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
  const ProcessUsage usage = process_usage();
  mine.rss_bytes = double(usage.rss_bytes), mine.open_fds = double(usage.open_fds);
  if (root()) {  // its own part first: a row written after a failed gather holds what the root knows
    phase_rows_[me_] = mine.phases;
    usage_rows_[me_] = {static_cast<std::int64_t>(mine.rss_bytes), static_cast<std::int32_t>(mine.open_fds)};
  }
  std::vector<double> gathered(root() ? std::size_t(group_->size()) * kReportSize : 0);
  group_->gather(reinterpret_cast<const double*>(&mine), kReportSize, gathered.data(), root_index());
  if (!root()) return;
  Report agg;
  bool overrun = false;
  for (int k = 0; k < group_->size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * kReportSize]);
    phase_rows_[members_[k]] = rep->phases;
    usage_rows_[members_[k]] = {static_cast<std::int64_t>(rep->rss_bytes), static_cast<std::int32_t>(rep->open_fds)};
    if (rep->trained && !agg.trained) agg = *rep;
    overrun = overrun || rep->overruns > 0;
  }
  StepResult row = r;
  row.loss = agg.loss, row.grad_norm = agg.grad_norm, row.overruns = overrun ? 1 : 0;
  record_step(s, row, t_start, t_end, recovery_seconds, idle_seconds);
}

// Rank 0: the step's row (with every rank's phases from the metrics channel) and its line.
void TrainingRun::record_step(int s, const StepResult& r, double t_start, double t_end, double recovery_seconds,
                              double idle_seconds) {
  const Configuration& cfg = trainer_->configuration();
  const bool overrun = r.overruns > 0;
  const StepResult& agg = r;
  const double secs = t_end - t_start;
  const long long tokens = r.samples * o_.seq;
  const double flops = training_flops(o_.model, r.samples, o_.seq);
  const double peak = peak_.gflops;
  const double mfu = secs > 0 && peak > 0 ? flops / (secs * group_->size() * peak * 1e9) : std::nan("");
  const double nan = std::nan("");
  // A non-finite step updated nothing: its tokens are processed, not committed.
  const StepRow row{.step = s,
                    .optimizer_step = trainer_->steps_taken(),
                    .t_start = t_start,
                    .t_end = t_end,
                    .sample_begin = r.sample_begin,
                    .samples = r.samples,
                    .tokens = tokens,
                    .tokens_committed = r.nonfinite ? 0 : tokens,
                    .loss = r.samples ? agg.loss : nan,
                    .grad_norm = r.samples ? agg.grad_norm : nan,
                    .lr = r.lr,
                    .flops = flops,
                    .mfu = mfu,
                    .live_ranks = cfg.live_ranks(),
                    .active_replicas = cfg.active_replicas(),
                    .recovery_seconds = recovery_seconds,
                    .idle_seconds = idle_seconds,
                    .paced_overrun = static_cast<std::int8_t>(overrun)};
  ReplicaRow rr;
  for (const auto& rp : cfg.replicas) {
    rr.tp_degree.push_back(rp.active() ? rp.degree() : 0);
    rr.batch.push_back(rp.batch);
    rr.state.push_back(static_cast<signed char>(rp.state));
  }
  const auto tr = std::chrono::steady_clock::now();
  if (r.nonfinite)
    rec_->event(make_event(t_end, s, "nonfinite", -1, -1, 0, 0,
                           fmt::format("loss {} grad norm {}: no update ({})", r.loss, r.grad_norm,
                                       o_.on_nonfinite == "skip" ? "skipped" : "the run stops")));
  rec_->append(row, rr, phase_rows_, usage_rows_);
  recorder_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
  if (r.samples > 0) {
    last_step_seconds_ = secs;
    if (cfg.active_replicas() == trainer_->topology().replicas && cfg.live_ranks() == int(alive_.size()))
      healthy_step_seconds_.push_back(secs);
  }
  if (o_.quiet) return;
  if (r.samples > 0)
    fmt::print("step {:5d}/{} | loss {:.4f} | norm {:.4f} | {:8.1f} ms | {:9.0f} tok/s | MFU {:5.1f}% | TP {}{}\n", s,
               o_.steps, agg.loss, agg.grad_norm, secs * 1e3, tokens / secs, 100 * mfu, cfg.degrees(),
               overrun ? " | paced overrun" : "");
  else
    fmt::print("step {:5d}/{} | idle: every replica is down | {:8.1f} ms\n", s, o_.steps, secs * 1e3);
  std::fflush(stdout);
}

// The recorder: the last finished step's row, if a failure kept it out of the file. It holds the
// phases the recorder knows (its own when the metrics gather failed, none when it inherited the file).
void TrainingRun::write_missing_row() {
  const Attempt& a = finished_;
  if (!root() || a.step == 0 || static_cast<int>(rec_->rows().size()) >= a.step) return;
  if (static_cast<int>(rec_->rows().size()) < a.step - 1)
    throw std::logic_error(fmt::format("the results file lacks rows before step {}", a.step));
  record_step(a.step, a.r, a.t_start, a.t_end, a.recovery_seconds, a.idle_seconds);
}

void TrainingRun::maybe_checkpoint(int s, bool trained) {
  if (o_.checkpoint_every <= 0 || !trained || trainer_->steps_taken() % o_.checkpoint_every != 0) return;
  const std::string path = checkpoint_path(o_, trainer_->steps_taken());
  progress(s, "a checkpoint");
  const double tc = now();
  if (trainer_->save_checkpoint(path)) {
    last_ckpt_ = path;
    release_free_memory();
    if (root()) {
      rec_->event(make_event(tc, s, "checkpoint", -1, -1, 3.0 * parameter_count(o_.model) * sizeof(float), now() - tc,
                             path));
      if (!o_.quiet) fmt::print("checkpoint: {}\n", path);
    }
  }
  group_->barrier();
}

// The final checkpoint (for --replay and resuming), /summary, and the closing line. The run's
// verdict (0; 3, no way forward; 4, not finite), which every live rank reaches alike, is the exit
// status of the recorder alone, the others' 0: Open MPI's launcher can hang when every process
// exits non-zero (finish_mpi).
int TrainingRun::train(int first, double recovery_before_first) {
  const int code = train_steps(first, recovery_before_first);
  watchdog_.disarm();
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
    if (!o_.final_checkpoint || last_ckpt_ == final_path) return;
    progress(o_.steps, "the final checkpoint");
    const double t_start = now();
    try {
      if (trainer_->save_checkpoint(final_path)) last_ckpt_ = final_path;
      group_->barrier();
      if (trainer_->configuration().active_replicas() == 0 && root())
        fmt::print("no replica is active at the end: no final checkpoint\n");
      return;
    } catch (const PeerFailure& e) {
      if (!signal()) throw;
      recover(o_.steps, e, t_start);
    }
  }
}

int TrainingRun::finish() {
  // Every rank knows whether the last step was non-finite (the trainer reduced the flag).
  const int code = last_.nonfinite ? 4 : 0;
  progress(o_.steps, "the end of the run");
  const GroupBarrierOnExit last{*group_};
  if (!root()) return code;
  const double wall = now();
  if (!last_ckpt_.empty()) rec_->set_attr("final_checkpoint", std::filesystem::absolute(last_ckpt_).string());
  rec_->write_summary(wall, static_cast<int>(alive_.size()), peak_.gflops);
  rec_->set_summary("recorder_seconds", recorder_seconds_);
  rec_->set_summary("skipped_steps", static_cast<double>(skipped_steps_));
  if (spares_) rec_->set_summary("spares_left", static_cast<double>(spares_->live_spares().size()));
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
  fmt::print("done: {} steps, {:.0f} tokens ({:.0f} committed) in {:.2f} s | throughput {:.0f} tok/s | goodput "
             "{:.0f} tok/s | {}\nwrote {}{}\n",
             o_.steps, tokens, committed, wall, step_s > 0 ? tokens / step_s : 0.0, committed / wall, final_loss,
             o_.out, last_ckpt_.empty() ? "" : " and checkpoint " + last_ckpt_);
  if (code != 0)
    std::fprintf(stderr, "ntpbench: error: the last step's loss is not finite (%d step(s) skipped by --on-nonfinite "
                 "skip); the training diverged\n", skipped_steps_);
  std::fflush(stdout);
  return code;
}

void TrainingRun::abandon(const NoProgress& e) {
  progress(step_, "the end of the run");
  const GroupBarrierOnExit last{*group_};
  if (!root()) return;
  if (!rec_) take_over_recorder({});
  rec_->write_summary(now(), static_cast<int>(alive_.size()), peak_.gflops);
  rec_->set_summary("recorder_seconds", recorder_seconds_);
  std::fprintf(stderr, "ntpbench: error: %s; the results file holds every step so far: %s\n", e.what(), o_.out.c_str());
}

}  // namespace ntp
