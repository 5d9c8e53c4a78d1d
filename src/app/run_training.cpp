// The training driver: validates the job, runs the schedule's steps (killing and reviving ranks
// as it says), prints a line per step and every recovery on rank 0, records every step to HDF5
// and writes checkpoints.
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
  const Schedule schedule = validate_schedule(o, world.size());
  if (o.check) {
    if (root)
      fmt::print("ntpbench --check: OK: {} ranks = {} replicas x TP {}, model {} ({:.2f}M params), {} steps, policy "
                 "{}, schedule {} ({} kills, {} revivals), timing {}\n",
                 world.size(), world.size() / o.tp, o.tp, o.preset, parameter_count(o.model) / 1e6, o.steps, o.policy,
                 o.schedule.empty() ? "none" : o.schedule, schedule.kills(), schedule.revives(), o.timing);
    return 0;
  }
  if (o.out.empty()) {
    // Only rank 0 writes, but every rank needs the same name for the checkpoint directory.
    std::string name = root ? default_out() : std::string();
    name.resize(128, '\0');
    world.broadcast(name.data(), name.size(), 0);
    o.out = name.c_str();
  }
  if (root && std::filesystem::exists(o.out) && !o.overwrite)
    throw std::runtime_error("results file '" + o.out + "' exists; choose another --out or pass --overwrite");
  if (root && o.policy == "restart" && o.checkpoint_every == 0 && !schedule.empty())
    fmt::print("note: --policy restart without --checkpoint-every: a failure rolls back to the initial state\n");

  const int threads = configure_threads(o.threads);
  Trainer trainer(o, world, o.micro_batch);
  const Topology& topo = trainer.topology();
  if (!o.init_from.empty()) trainer.load_checkpoint(o.init_from, o.init_weights_only);
  o.opt.total_steps = trainer.steps_taken() + o.steps;

  double peak = o.peak_gflops;
  std::string peak_source = "--peak-gflops";
  if (peak <= 0 && o.pacing.enabled) {
    peak = o.pacing.device_gflops;
    peak_source = "--device-gflops (paced timing)";
  } else if (peak <= 0 && o.backend != "cpu") {
    peak_source = "unknown: pass --peak-gflops (the device's peak) for MFU";
    if (root) fmt::print("note: --backend {} without --peak-gflops: MFU is not reported\n", o.backend);
  } else if (peak <= 0) {
    world.barrier();  // measure with every rank busy at once, as in the steps
    peak = measure_sgemm_gflops();
    world.allreduce_max(&peak, 1);
    peak_source = fmt::format("cblas_sgemm 1024^3 measured at start-up, {} thread(s) per rank, fastest rank", threads);
  }

  std::unique_ptr<Recorder> rec;
  if (root) {
    rec = std::make_unique<Recorder>(o.out, o.overwrite, world.size(), topo.replicas);
    const nlohmann::json env = environment_record();
    for (auto& [k, v] : env.items()) rec->set_attr(k, v.get<std::string>());
    rec->set_attr("config", to_json(o).dump());
    rec->set_attr("ranks", static_cast<long long>(world.size()));
    rec->set_attr("tp", static_cast<long long>(o.tp));
    rec->set_attr("replicas", static_cast<long long>(topo.replicas));
    rec->set_attr("timing", o.timing);
    rec->set_attr("policy", o.schedule.empty() ? std::string("none") : o.policy);
    rec->set_attr("threads_per_rank", static_cast<long long>(threads));
    rec->set_attr("peak_gflops_per_rank", peak);
    rec->set_attr("peak_gflops_source", peak_source);
    rec->set_attr("data", trainer.data().describe());
    rec->set_attr("tokens_per_sample", static_cast<long long>(o.seq));
  }
  const auto hosts = world.gather(host_name(), 0);
  if (root) rec->set_attr("hosts", nlohmann::json(hosts).dump());

  if (root && !o.quiet) {
    fmt::print("ntpbench: {} ranks = {} replicas x TP {} | model {} (L={} H={} d={} V={}, {:.2f}M params) | "
               "B={} per replica, T={} | {} thread(s)/rank | timing {}{}\n",
               world.size(), topo.replicas, o.tp, o.preset, o.model.layers, o.model.heads, o.model.hidden,
               o.model.vocab, parameter_count(o.model) / 1e6, o.micro_batch, o.seq, threads, o.timing,
               o.schedule.empty() ? "" : fmt::format(" | policy {} | schedule {}", o.policy, o.schedule));
    fmt::print("data: {}\nresults: {}\n", trainer.data().describe(), o.out);
    if (o.backend != "cpu") fmt::print("communication: {}\n", trainer.communication());
    std::fflush(stdout);
  }

  std::vector<double> gathered(root ? std::size_t(world.size()) * kReportSize : 0);
  std::vector<std::array<double, kPhaseCount>> phase_rows(world.size());
  auto t0 = std::chrono::steady_clock::now();
  auto now = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::vector<double> healthy_step_seconds;
  std::vector<char> alive(world.size(), 1);
  std::string last_ckpt;
  double last_step_seconds = 0;
  double recorder_seconds = 0;  // rank 0's time appending and flushing rows

  world.barrier();  // everyone starts the clock together
  t0 = std::chrono::steady_clock::now();
  trainer.clock().take();  // phase accounting starts with the first step
  for (int s = 1; s <= o.steps; ++s) {
    Report mine;
    double recovery_seconds = 0;
    const StepEvents& ev = schedule.at(s);
    if (!ev.kill.empty() || !ev.revive.empty()) {
      const double t_event = now();
      for (int r : ev.kill) alive[r] = 0;
      for (int r : ev.revive) alive[r] = 1;
      const int before = trainer.steps_taken();
      const Recovery rc = trainer.reconfigure(alive);
      // The recovery's figures: slowest rank for times, all ranks for bytes.
      double worst[3] = {rc.detect, rc.reconfigure, rc.heal};
      world.allreduce_max(worst, 3);
      double bytes = rc.heal_bytes;
      world.allreduce_sum(&bytes, 1);
      recovery_seconds = worst[0] + worst[1] + worst[2];
      if (root) {
        for (int r : ev.kill) rec->event(make_event(t_event, s, "kill", r, r / o.tp, 0, 0, ""));
        for (int r : ev.revive) rec->event(make_event(t_event, s, "revive", r, r / o.tp, 0, 0, ""));
        const std::string change = fmt::format("TP {} -> {}", rc.before, rc.after);
        rec->event(make_event(t_event, s, "detect", -1, -1, 0, worst[0], ""));
        rec->event(make_event(t_event + worst[0], s, "reconfigure", -1, -1, 0, worst[1], change));
        std::string what = fmt::format("step {:5d}: {}{}| detect {:.2f} ms | reconfigure {:.2f} ms | ", s,
                                       ev.kill.empty() ? "" : fmt::format("kill {} ", ev.kill),
                                       ev.revive.empty() ? "" : fmt::format("revive {} ", ev.revive), worst[0] * 1e3,
                                       worst[1] * 1e3);
        if (rc.restored) {
          rec->event(make_event(t_event + worst[0] + worst[1], s, "restore", -1, -1, bytes, worst[2],
                                fmt::format("from {} (optimizer step {})", rc.restored_from, rc.restored_step)));
          const auto [lost_rows, lost_seconds] = rec->roll_back_after(rc.restored_step);
          rec->event(make_event(t_event, s, "rollback", -1, -1, 0, 0,
                                fmt::format("{} steps rolled back (optimizer step {} -> {})", lost_rows, before,
                                            rc.restored_step)));
          rec->event(make_event(t_event, s, "recompute", -1, -1, 0, lost_seconds,
                                fmt::format("{} steps to redo", lost_rows)));
          what += fmt::format("no live replica holds every shard: restored {} (optimizer step {}), {} steps rolled "
                              "back ({:.2f} s to recompute) | {}",
                              rc.restored_from, rc.restored_step, lost_rows, lost_seconds, change);
        } else if (trainer.configuration().active_replicas() == 0) {
          what += fmt::format("every replica is down: idle until a revival | {}", change);
        } else {
          rec->event(make_event(t_event + worst[0] + worst[1], s, "heal", -1, -1, bytes, worst[2], change));
          what += fmt::format("heal {:.2f} MB in {:.2f} ms | {}", bytes / 1e6, worst[2] * 1e3, change);
        }
        fmt::print("{}\n", what);
        std::fflush(stdout);
      }
    }

    const Configuration& cfg = trainer.configuration();
    const double t_start = now();
    double idle_seconds = 0;
    StepResult r;
    if (cfg.active_replicas() == 0) {
      // Nobody can train: the slot lasts as long as a healthy step would (the repair is measured
      // in steps), and it counts against goodput.
      PhaseScope idle(trainer.clock(), Phase::Idle);
      double wait = root ? (healthy_step_seconds.empty() ? last_step_seconds : median(healthy_step_seconds)) : 0;
      world.broadcast(&wait, sizeof wait, 0);
      std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      idle_seconds = wait;
      r = trainer.step();  // advances nothing: no replica is active
    } else {
      r = trainer.step();
    }
    {
      // Ranks that trained less (or not at all) wait here for the rest: idle time, and every
      // rank's phases of this row then end at the same moment.
      PhaseScope idle(trainer.clock(), Phase::Idle);
      world.barrier();
    }
    const auto waited = trainer.clock().take();
    for (int k = 0; k < kPhaseCount; ++k) mine.phases[k] = r.phase_seconds[k] + waited[k];
    mine.trained = r.trained, mine.loss = r.loss, mine.grad_norm = r.grad_norm, mine.overruns = r.overruns;
    world.gather(reinterpret_cast<const double*>(&mine), kReportSize, gathered.data(), 0);
    const double t_end = now();

    if (root) {
      Report agg;
      bool overrun = false;
      for (int k = 0; k < world.size(); ++k) {
        const auto* rep = reinterpret_cast<const Report*>(&gathered[std::size_t(k) * kReportSize]);
        phase_rows[k] = rep->phases;
        if (rep->trained && !agg.trained) agg = *rep;
        overrun = overrun || rep->overruns > 0;
      }
      const double secs = t_end - t_start;
      const long long tokens = r.samples * o.seq;
      const double flops = training_flops(o.model, r.samples, o.seq);
      const double mfu = secs > 0 && peak > 0 ? flops / (secs * world.size() * peak * 1e9) : std::nan("");
      const double nan = std::nan("");
      StepRow row{s, trainer.steps_taken(), t_start, t_end, r.sample_begin, r.samples, tokens, tokens,
                  r.samples ? agg.loss : nan, r.samples ? agg.grad_norm : nan, r.lr, flops, mfu, cfg.live_ranks(),
                  cfg.active_replicas(), recovery_seconds, idle_seconds, static_cast<std::int8_t>(overrun)};
      ReplicaRow rr;
      for (const auto& rp : cfg.replicas) {
        rr.tp_degree.push_back(rp.active() ? rp.degree() : 0);
        rr.batch.push_back(rp.batch);
        rr.state.push_back(static_cast<signed char>(rp.state));
      }
      const auto tr = std::chrono::steady_clock::now();
      rec->append(row, rr, phase_rows);
      recorder_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - tr).count();
      if (r.samples > 0) {
        last_step_seconds = secs;
        if (cfg.active_replicas() == topo.replicas && cfg.live_ranks() == world.size())
          healthy_step_seconds.push_back(secs);
      }
      if (!o.quiet) {
        if (r.samples > 0)
          fmt::print("step {:5d}/{} | loss {:.4f} | norm {:.4f} | {:8.1f} ms | {:9.0f} tok/s | MFU {:5.1f}% | TP {}{}\n",
                     s, o.steps, agg.loss, agg.grad_norm, secs * 1e3, tokens / secs, 100 * mfu, cfg.degrees(),
                     overrun ? " | paced overrun" : "");
        else
          fmt::print("step {:5d}/{} | idle: every replica is down | {:8.1f} ms\n", s, o.steps, secs * 1e3);
        std::fflush(stdout);
      }
    }
    if (o.checkpoint_every > 0 && r.samples > 0 && trainer.steps_taken() % o.checkpoint_every == 0) {
      const std::string path = checkpoint_path(o, trainer.steps_taken());
      const double tc = now();
      if (trainer.save_checkpoint(path)) {
        trainer.set_restore_point(path);
        last_ckpt = path;
        if (root) {
          rec->event(make_event(tc, s, "checkpoint", -1, -1, 3.0 * parameter_count(o.model) * sizeof(float),
                                now() - tc, path));
          if (!o.quiet) fmt::print("checkpoint: {}\n", path);
        }
      }
      world.barrier();
    }
  }

  if (o.final_checkpoint && last_ckpt != checkpoint_path(o, trainer.steps_taken())) {
    const std::string path = checkpoint_path(o, trainer.steps_taken());
    if (trainer.save_checkpoint(path)) last_ckpt = path;
    world.barrier();
    if (trainer.configuration().active_replicas() == 0 && root)
      fmt::print("no replica is active at the end: no final checkpoint\n");
  }
  if (root) {
    const double wall = now();
    if (!last_ckpt.empty()) rec->set_attr("final_checkpoint", std::filesystem::absolute(last_ckpt).string());
    rec->write_summary(wall, world.size(), peak);
    rec->set_summary("recorder_seconds", recorder_seconds);
    double tokens = 0, committed = 0, step_s = 0;
    for (const auto& row : rec->rows()) tokens += row.tokens, committed += row.tokens_committed, step_s += row.t_end - row.t_start;
    fmt::print("done: {} steps, {:.0f} tokens ({:.0f} committed) in {:.2f} s | throughput {:.0f} tok/s | goodput "
               "{:.0f} tok/s | final loss {:.4f}\nwrote {}{}\n",
               o.steps, tokens, committed, wall, step_s > 0 ? tokens / step_s : 0.0, committed / wall,
               rec->rows().empty() ? 0.0 : rec->rows().back().loss, o.out,
               last_ckpt.empty() ? "" : " and checkpoint " + last_ckpt);
  }
  return 0;
}

}  // namespace ntp
