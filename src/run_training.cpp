// The training driver: builds the job, runs the steps, prints a line per step on rank 0, records
// every step to HDF5 and writes checkpoints.
#include <chrono>
#include <ctime>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "recorder.hpp"
#include "run.hpp"
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
}  // namespace

int run_training(Options o, Comm& world) {
  const bool root = world.rank() == 0;
  if (world.size() % o.tp != 0)
    throw UsageError(fmt::format("--tp {} does not divide the {} ranks of this job", o.tp, world.size()));
  if (o.out.empty()) {
    // Only rank 0 writes, but every rank needs the same name for the checkpoint directory.
    std::string name = root ? default_out() : std::string(64, '\0');
    name.resize(64, '\0');
    world.broadcast(name.data(), name.size(), 0);
    o.out = name.c_str();
  }
  if (root && std::filesystem::exists(o.out) && !o.overwrite)
    throw std::runtime_error("results file '" + o.out + "' exists; choose another --out or pass --overwrite");

  const int threads = configure_threads(o.threads);
  Trainer trainer(o, world, o.micro_batch);
  const Topology& topo = trainer.topology();
  if (!o.init_from.empty()) trainer.load_checkpoint(o.init_from, o.init_weights_only);
  const int first_step = trainer.steps_taken() + 1, last_step = first_step + o.steps - 1;
  o.opt.total_steps = last_step;

  double peak = o.peak_gflops;
  std::string peak_source = "--peak-gflops";
  if (peak <= 0) {
    world.barrier();  // measure with every rank busy at once, as in the steps
    peak = measure_sgemm_gflops();
    world.allreduce_max(&peak, 1);
    peak_source = fmt::format("cblas_sgemm 384^3 measured at start-up, {} thread(s) per rank, fastest rank", threads);
  }

  std::unique_ptr<Recorder> rec;
  nlohmann::json config = to_json(o);
  if (root) {
    rec = std::make_unique<Recorder>(o.out, o.overwrite, world.size());
    auto env = environment_record();
    for (auto& [k, v] : env.items()) rec->set_attr(k, v.get<std::string>());
    rec->set_attr("config", config.dump());
    rec->set_attr("ranks", static_cast<long long>(world.size()));
    rec->set_attr("tp", static_cast<long long>(o.tp));
    rec->set_attr("replicas", static_cast<long long>(topo.replicas));
    rec->set_attr("timing", std::string("wall"));
    rec->set_attr("policy", std::string("none"));
    rec->set_attr("threads_per_rank", static_cast<long long>(threads));
    rec->set_attr("peak_gflops_per_rank", peak);
    rec->set_attr("peak_gflops_source", peak_source);
    rec->set_attr("data", trainer.data().describe());
  }
  const auto hosts = world.gather(host_name(), 0);
  if (root) rec->set_attr("hosts", nlohmann::json(hosts).dump());

  if (root && !o.quiet) {
    fmt::print("ntpbench: {} ranks = {} replicas x TP {} | model {} (L={} H={} d={} V={}, {:.2f}M params) | "
               "B={} per replica, T={} | {} thread(s)/rank\n",
               world.size(), topo.replicas, o.tp, o.preset, o.model.layers, o.model.heads, o.model.hidden,
               o.model.vocab, parameter_count(o.model) / 1e6, o.micro_batch, o.seq, threads);
    fmt::print("data: {}\nresults: {}\n", trainer.data().describe(), o.out);
    std::fflush(stdout);
  }

  const std::vector<int> batch(topo.replicas, o.micro_batch);
  const std::vector<int> tp_degrees(topo.replicas, o.tp);
  std::vector<double> all_phases(root ? std::size_t(world.size()) * kPhaseCount : 0);
  std::vector<std::array<double, kPhaseCount>> phase_rows(world.size());
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  long long tokens_total = 0;
  double step_seconds_total = 0, last_loss = 0;
  std::string last_ckpt;

  for (int s = first_step; s <= last_step; ++s) {
    const double t_start = since();
    StepResult r = trainer.step(batch);
    world.gather(r.phase_seconds.data(), kPhaseCount, all_phases.data(), 0);
    const double t_end = since();
    if (root) {
      const double secs = t_end - t_start;
      const long long tokens = r.samples * o.seq;
      const double flops = training_flops(o.model, r.samples, o.seq);
      const double mfu = flops / (secs * world.size() * peak * 1e9);
      tokens_total += tokens;
      step_seconds_total += secs;
      last_loss = r.loss;
      for (int k = 0; k < world.size(); ++k)
        std::copy_n(&all_phases[std::size_t(k) * kPhaseCount], kPhaseCount, phase_rows[k].begin());
      StepRow row{s, t_start, t_end, r.sample_begin, r.samples, tokens, tokens, r.loss, r.grad_norm, r.lr, flops, mfu};
      rec->append(row, tp_degrees, phase_rows);
      if (!o.quiet) {
        fmt::print("step {:5d}/{} | loss {:.4f} | norm {:.4f} | {:8.1f} ms | {:9.0f} tok/s | MFU {:5.1f}% | TP {}\n",
                   s, last_step, r.loss, r.grad_norm, secs * 1e3, tokens / secs, 100 * mfu, tp_degrees);
        std::fflush(stdout);
      }
    }
    if (o.checkpoint_every > 0 && s % o.checkpoint_every == 0) {
      last_ckpt = checkpoint_path(o, s);
      trainer.save_checkpoint(last_ckpt);
      if (root && !o.quiet) fmt::print("checkpoint: {}\n", last_ckpt);
    }
  }
  if (o.final_checkpoint && last_ckpt != checkpoint_path(o, last_step)) {
    last_ckpt = checkpoint_path(o, last_step);
    trainer.save_checkpoint(last_ckpt);
  }
  if (root) {
    const double wall = since();
    if (!last_ckpt.empty()) rec->set_attr("final_checkpoint", std::filesystem::absolute(last_ckpt).string());
    rec->set_summary("steps", double(o.steps));
    rec->set_summary("tokens", double(tokens_total));
    rec->set_summary("tokens_committed", double(tokens_total));
    rec->set_summary("wall_seconds", wall);
    rec->set_summary("step_seconds", step_seconds_total);
    rec->set_summary("throughput_tokens_per_s", tokens_total / step_seconds_total);
    rec->set_summary("goodput_tokens_per_s", tokens_total / wall);
    rec->set_summary("final_loss", last_loss);
    rec->flush();
    fmt::print("done: {} steps, {} tokens in {:.2f} s ({:.0f} tok/s in steps), final loss {:.4f}\nwrote {}{}\n",
               o.steps, tokens_total, wall, tokens_total / step_seconds_total, last_loss, o.out,
               last_ckpt.empty() ? "" : " and checkpoint " + last_ckpt);
  }
  return 0;
}

}  // namespace ntp
