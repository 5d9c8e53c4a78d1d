// The training driver: validates the job, runs the schedule's steps (killing and reviving ranks
// as it says), prints a line per step and every recovery on rank 0, records every step to HDF5
// and writes checkpoints. run_training() reads top to bottom: start-up, the step loop, the end.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "machine.hpp"
#include "recorder.hpp"
#include "run.hpp"
#include "schedule.hpp"
#include "trainer.hpp"

namespace ntp {

namespace {

std::string default_out() {
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof buf, "results/ntpbench-%Y%m%d-%H%M%S.h5", std::localtime(&now));
  return buf;
}

std::string checkpoint_path(const Options& o, int step) {
  return (std::filesystem::path(checkpoint_dir_for(o)) / fmt::format("step_{:06d}.h5", step)).string();
}

// What every rank reports to rank 0 after a step (the metrics channel).
struct Report {
  std::array<double, kPhaseCount> phases{};
  double trained = 0, loss = 0, grad_norm = 0, overruns = 0;
};
constexpr int kReportSize = sizeof(Report) / sizeof(double);

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The peak MFU is measured against, and where it came from.
struct Peak {
  double gflops = 0;
  std::string source;
};

Peak find_peak(const Options& o, Comm& world, int threads) {
  const bool root = world.rank() == 0;
  if (o.peak_gflops > 0) return {o.peak_gflops, "--peak-gflops"};
  if (o.pacing.enabled) return {o.pacing.device_gflops, "--device-gflops (paced timing)"};
  if (o.backend != "cpu") {
    if (root) fmt::print("note: --backend {} without --peak-gflops: MFU is not reported\n", o.backend);
    return {0, "unknown: pass --peak-gflops (the device's peak) for MFU"};
  }
  world.barrier();  // measure with every rank busy at once, as in the steps
  double peak = measure_sgemm_gflops();
  world.allreduce_max(&peak, 1);
  return {peak, fmt::format("cblas_sgemm 1024^3 measured at start-up, {} thread(s) per rank, fastest rank", threads)};
}

// One run of the training loop on this rank. Rank 0 (the root) also owns the recorder and prints.
class TrainingRun {
 public:
  TrainingRun(Options o, Comm& world, Schedule schedule)
      : o_(std::move(o)), world_(world), root_(world.rank() == 0), schedule_(std::move(schedule)),
        threads_(configure_threads(o_.threads)), trainer_(o_, world, o_.micro_batch),
        alive_(world.size(), 1), phase_rows_(world.size()),
        gathered_(root_ ? std::size_t(world.size()) * kReportSize : 0) {
    if (!o_.init_from.empty()) trainer_.load_checkpoint(o_.init_from, o_.init_weights_only);
    o_.opt.total_steps = trainer_.steps_taken() + o_.steps;
    peak_ = find_peak(o_, world_, threads_);
  }

  void open_results();
  void print_banner() const;
  void start_clock();
  // Applies step s's kills and revivals; returns the recovery's seconds (0 when nothing happens).
  double apply_events(int s);
  void run_step(int s, double recovery_seconds);
  void maybe_checkpoint(int s, bool trained);
  void finish();

 private:
  double now() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  void record_recovery(int s, const StepEvents& ev, const Recovery& rc, double t_event, const double worst[3],
                       double bytes, int steps_before);
  void record_step(int s, const StepResult& r, double t_start, double t_end, double recovery_seconds,
                   double idle_seconds);

  Options o_;
  Comm& world_;
  const bool root_;
  const Schedule schedule_;
  const int threads_;
  Trainer trainer_;
  Peak peak_;
  std::unique_ptr<Recorder> rec_;  // root only
  std::vector<char> alive_;
  std::vector<std::array<double, kPhaseCount>> phase_rows_;
  std::vector<double> gathered_;
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  std::vector<double> healthy_step_seconds_;
  std::string last_ckpt_;
  double last_step_seconds_ = 0;
  double recorder_seconds_ = 0;  // rank 0's time appending and flushing rows
};

void TrainingRun::open_results() {
  if (root_) {
    rec_ = std::make_unique<Recorder>(o_.out, o_.overwrite, world_.size(), trainer_.topology().replicas);
    const nlohmann::json env = environment_record();
    for (auto& [k, v] : env.items()) rec_->set_attr(k, v.get<std::string>());
    rec_->set_attr("config", to_json(o_).dump());
    rec_->set_attr("ranks", static_cast<long long>(world_.size()));
    rec_->set_attr("tp", static_cast<long long>(o_.tp));
    rec_->set_attr("replicas", static_cast<long long>(trainer_.topology().replicas));
    rec_->set_attr("timing", o_.timing);
    rec_->set_attr("policy", o_.schedule.empty() ? std::string("none") : o_.policy);
    rec_->set_attr("threads_per_rank", static_cast<long long>(threads_));
    rec_->set_attr("peak_gflops_per_rank", peak_.gflops);
    rec_->set_attr("peak_gflops_source", peak_.source);
    rec_->set_attr("data", trainer_.data().describe());
    rec_->set_attr("tokens_per_sample", static_cast<long long>(o_.seq));
  }
  const auto hosts = world_.gather(host_name(), 0);
  if (root_) rec_->set_attr("hosts", nlohmann::json(hosts).dump());
}

void TrainingRun::print_banner() const {
  if (!root_ || o_.quiet) return;
  const ModelConfig& m = o_.model;
  fmt::print("ntpbench: {} ranks = {} replicas x TP {} | model {} (L={} H={} d={} V={}, {:.2f}M params) | "
             "B={} per replica, T={} | {} thread(s)/rank | timing {}{}\n",
             world_.size(), trainer_.topology().replicas, o_.tp, o_.preset, m.layers, m.heads, m.hidden, m.vocab,
             parameter_count(m) / 1e6, o_.micro_batch, o_.seq, threads_, o_.timing,
             o_.schedule.empty() ? "" : fmt::format(" | policy {} | schedule {}", o_.policy, o_.schedule));
  fmt::print("data: {}\nresults: {}\n", trainer_.data().describe(), o_.out);
  if (o_.backend != "cpu") fmt::print("communication: {}\n", trainer_.communication());
  std::fflush(stdout);
}

void TrainingRun::start_clock() {
  world_.barrier();  // everyone starts the clock together
  t0_ = std::chrono::steady_clock::now();
  trainer_.clock().take();  // phase accounting starts with the first step
}

double TrainingRun::apply_events(int s) {
  const StepEvents& ev = schedule_.at(s);
  if (ev.kill.empty() && ev.revive.empty()) return 0;
  const double t_event = now();
  for (int r : ev.kill) alive_[r] = 0;
  for (int r : ev.revive) alive_[r] = 1;
  const int before = trainer_.steps_taken();
  const Recovery rc = trainer_.reconfigure(alive_);
  // The recovery's figures: slowest rank for times, all ranks for bytes.
  double worst[3] = {rc.detect, rc.reconfigure, rc.heal};
  world_.allreduce_max(worst, 3);
  double bytes = rc.heal_bytes;
  world_.allreduce_sum(&bytes, 1);
  if (root_) record_recovery(s, ev, rc, t_event, worst, bytes, before);
  return worst[0] + worst[1] + worst[2];
}

// Rank 0: the recovery's events and its line on the console.
void TrainingRun::record_recovery(int s, const StepEvents& ev, const Recovery& rc, double t_event,
                                  const double worst[3], double bytes, int steps_before) {
  for (int r : ev.kill) rec_->event(make_event(t_event, s, "kill", r, r / o_.tp, 0, 0, ""));
  for (int r : ev.revive) rec_->event(make_event(t_event, s, "revive", r, r / o_.tp, 0, 0, ""));
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
  } else if (trainer_.configuration().active_replicas() == 0) {
    what += fmt::format("every replica is down: idle until a revival | {}", change);
  } else {
    rec_->event(make_event(t_heal, s, "heal", -1, -1, bytes, worst[2], change));
    what += fmt::format("heal {:.2f} MB in {:.2f} ms | {}", bytes / 1e6, worst[2] * 1e3, change);
  }
  fmt::print("{}\n", what);
  std::fflush(stdout);
}

void TrainingRun::run_step(int s, double recovery_seconds) {
  const double t_start = now();
  double idle_seconds = 0;
  if (trainer_.configuration().active_replicas() == 0) {
    // Nobody can train: the slot lasts as long as a healthy step would (the repair is measured
    // in steps), and it counts against goodput.
    PhaseScope idle(trainer_.clock(), Phase::Idle);
    double wait = root_ ? (healthy_step_seconds_.empty() ? last_step_seconds_ : median(healthy_step_seconds_)) : 0;
    world_.broadcast(&wait, sizeof wait, 0);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    idle_seconds = wait;
  }
  const StepResult r = trainer_.step();  // with no active replica: advances nothing
  {
    // Ranks that trained less (or not at all) wait here for the rest: idle time, and every
    // rank's phases of this row then end at the same moment.
    PhaseScope idle(trainer_.clock(), Phase::Idle);
    world_.barrier();
  }
  Report mine;
  const auto waited = trainer_.clock().take();
  for (int k = 0; k < kPhaseCount; ++k) mine.phases[k] = r.phase_seconds[k] + waited[k];
  mine.trained = r.trained, mine.loss = r.loss, mine.grad_norm = r.grad_norm, mine.overruns = r.overruns;
  world_.gather(reinterpret_cast<const double*>(&mine), kReportSize, gathered_.data(), 0);
  if (root_) record_step(s, r, t_start, now(), recovery_seconds, idle_seconds);
  maybe_checkpoint(s, r.samples > 0);
}

// Rank 0: the step's row (with every rank's phases from the metrics channel) and its line.
void TrainingRun::record_step(int s, const StepResult& r, double t_start, double t_end, double recovery_seconds,
                              double idle_seconds) {
  const Configuration& cfg = trainer_.configuration();
  Report agg;
  bool overrun = false;
  for (int k = 0; k < world_.size(); ++k) {
    const auto* rep = reinterpret_cast<const Report*>(&gathered_[std::size_t(k) * kReportSize]);
    phase_rows_[k] = rep->phases;
    if (rep->trained && !agg.trained) agg = *rep;
    overrun = overrun || rep->overruns > 0;
  }
  const double secs = t_end - t_start;
  const long long tokens = r.samples * o_.seq;
  const double flops = training_flops(o_.model, r.samples, o_.seq);
  const double peak = peak_.gflops;
  const double mfu = secs > 0 && peak > 0 ? flops / (secs * world_.size() * peak * 1e9) : std::nan("");
  const double nan = std::nan("");
  StepRow row{s, trainer_.steps_taken(), t_start, t_end, r.sample_begin, r.samples, tokens, tokens,
              r.samples ? agg.loss : nan, r.samples ? agg.grad_norm : nan, r.lr, flops, mfu, cfg.live_ranks(),
              cfg.active_replicas(), recovery_seconds, idle_seconds, static_cast<std::int8_t>(overrun)};
  ReplicaRow rr;
  for (const auto& rp : cfg.replicas) {
    rr.tp_degree.push_back(rp.active() ? rp.degree() : 0);
    rr.batch.push_back(rp.batch);
    rr.state.push_back(static_cast<signed char>(rp.state));
  }
  const auto tr = std::chrono::steady_clock::now();
  rec_->append(row, rr, phase_rows_);
  recorder_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
  if (r.samples > 0) {
    last_step_seconds_ = secs;
    if (cfg.active_replicas() == trainer_.topology().replicas && cfg.live_ranks() == world_.size())
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

void TrainingRun::maybe_checkpoint(int s, bool trained) {
  if (o_.checkpoint_every <= 0 || !trained || trainer_.steps_taken() % o_.checkpoint_every != 0) return;
  const std::string path = checkpoint_path(o_, trainer_.steps_taken());
  const double tc = now();
  if (trainer_.save_checkpoint(path)) {
    trainer_.set_restore_point(path);
    last_ckpt_ = path;
    if (root_) {
      rec_->event(make_event(tc, s, "checkpoint", -1, -1, 3.0 * parameter_count(o_.model) * sizeof(float), now() - tc,
                             path));
      if (!o_.quiet) fmt::print("checkpoint: {}\n", path);
    }
  }
  world_.barrier();
}

// The final checkpoint (for --replay and resuming), /summary, and the closing line.
void TrainingRun::finish() {
  const std::string final_path = checkpoint_path(o_, trainer_.steps_taken());
  if (o_.final_checkpoint && last_ckpt_ != final_path) {
    if (trainer_.save_checkpoint(final_path)) last_ckpt_ = final_path;
    world_.barrier();
    if (trainer_.configuration().active_replicas() == 0 && root_)
      fmt::print("no replica is active at the end: no final checkpoint\n");
  }
  if (!root_) return;
  const double wall = now();
  if (!last_ckpt_.empty()) rec_->set_attr("final_checkpoint", std::filesystem::absolute(last_ckpt_).string());
  rec_->write_summary(wall, world_.size(), peak_.gflops);
  rec_->set_summary("recorder_seconds", recorder_seconds_);
  double tokens = 0, committed = 0, step_s = 0;
  for (const auto& row : rec_->rows())
    tokens += row.tokens, committed += row.tokens_committed, step_s += row.t_end - row.t_start;
  fmt::print("done: {} steps, {:.0f} tokens ({:.0f} committed) in {:.2f} s | throughput {:.0f} tok/s | goodput "
             "{:.0f} tok/s | final loss {:.4f}\nwrote {}{}\n",
             o_.steps, tokens, committed, wall, step_s > 0 ? tokens / step_s : 0.0, committed / wall,
             rec_->rows().empty() ? 0.0 : rec_->rows().back().loss, o_.out,
             last_ckpt_.empty() ? "" : " and checkpoint " + last_ckpt_);
}

// The results file's name: --out, or a dated default that every rank agrees on (only rank 0
// writes, but every rank needs it for the checkpoint directory).
void settle_out_path(Options& o, Comm& world) {
  const bool root = world.rank() == 0;
  if (o.out.empty()) {
    std::string name = root ? default_out() : std::string();
    name.resize(128, '\0');
    world.broadcast(name.data(), name.size(), 0);
    o.out = name.c_str();
  }
  if (root && std::filesystem::exists(o.out) && !o.overwrite)
    throw std::runtime_error("results file '" + o.out + "' exists; choose another --out or pass --overwrite");
}

}  // namespace

// Walks the schedule through the policy: every membership the run will see must leave a way
// forward. Throws UsageError naming the step.
Schedule validate_schedule(const Options& o, int world_size) {
  if (o.schedule.empty()) return {};
  Schedule s;
  try {
    s = Schedule::load(o.schedule, world_size, o.steps);
  } catch (const ScheduleError& e) {
    throw UsageError(e.what());
  }
  const Policy policy = parse_policy(o.policy);
  const Topology topo(world_size, 0, o.tp);
  std::vector<char> alive(world_size, 1);
  for (int step = 1; step <= o.steps; ++step) {
    const auto& ev = s.at(step);
    for (int r : ev.kill) alive[r] = 0;
    for (int r : ev.revive) alive[r] = 1;
    const auto cfg = plan_configuration(policy, topo, o.model, o.micro_batch, o.pacing.boost, alive);
    if (cfg.active_replicas() == 0 && !s.revival_after(step))
      throw UsageError(fmt::format(
          "{}: from step {} every replica is down under --policy {} and no revival is scheduled; the run could "
          "never finish",
          o.schedule, step, o.policy));
  }
  return s;
}

int run_training(Options o, Comm& world) {
  const bool root = world.rank() == 0;
  if (world.size() % o.tp != 0)
    throw UsageError(fmt::format("--tp {} does not divide the {} ranks of this job", o.tp, world.size()));
  Schedule schedule = validate_schedule(o, world.size());
  if (o.check) {
    if (root)
      fmt::print("ntpbench --check: OK: {} ranks = {} replicas x TP {}, model {} ({:.2f}M params), {} steps, policy "
                 "{}, schedule {} ({} kills, {} revivals), timing {}\n",
                 world.size(), world.size() / o.tp, o.tp, o.preset, parameter_count(o.model) / 1e6, o.steps, o.policy,
                 o.schedule.empty() ? "none" : o.schedule, schedule.kills(), schedule.revives(), o.timing);
    return 0;
  }
  settle_out_path(o, world);
  if (root && o.policy == "restart" && o.checkpoint_every == 0 && !schedule.empty())
    fmt::print("note: --policy restart without --checkpoint-every: a failure rolls back to the initial state\n");

  TrainingRun run(o, world, std::move(schedule));
  run.open_results();
  run.print_banner();
  run.start_clock();
  for (int s = 1; s <= o.steps; ++s) {
    const double recovery_seconds = run.apply_events(s);
    run.run_step(s, recovery_seconds);
  }
  run.finish();
  return 0;
}

}  // namespace ntp
