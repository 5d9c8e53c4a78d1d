// Replay verification: re-run a recorded run's exact per-step sample counts on one rank (TP 1,
// DP 1) from the same initial state and compare the parameters with the run's final checkpoint.
// Agreement shows the sharded run computed the same training as the unsharded model.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "exit_codes.hpp"
#include "h5.hpp"
#include "machine.hpp"
#include "option_table.hpp"
#include "param_compare.hpp"
#include "recorder.hpp"
#include "run.hpp"
#include "trainer.hpp"

namespace ntp {

namespace {

// What a results file says of its run: its options, the committed steps (number, first sample,
// samples) and the final checkpoint.
struct RecordedRun {
  Options options;
  std::vector<std::int64_t> steps, begins, samples;
  std::vector<std::vector<int>> replica_batches;  // per committed step, each replica's sequences
  std::string checkpoint;
};

// A file that is not a results file (another HDF5 file, one damaged) is the user's mistake:
// refused with its name on every rank (exit 2), not an internal error.
RecordedRun read_recorded_run(const std::string& path) {
  RecordedRun run;
  try {
    h5::File f(path, h5::Mode::ReadOnly);
    run.options = options_from_json(nlohmann::json::parse(h5::get_attr_string(f.id(), "/", "config")));
    const auto steps = read_steps_column(f.id(), "step");
    const auto begins = read_steps_column(f.id(), "sample_begin");
    const auto samples = read_steps_column(f.id(), "samples");
    // Only committed steps shaped the final state: skip idle slots and steps a restore undid.
    const auto committed = read_steps_column(f.id(), "tokens_committed");
    const std::vector<std::vector<int>> replicas = read_replica_batches(f.id());
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (committed[i] > 0) {
        run.steps.push_back(steps[i]), run.begins.push_back(begins[i]), run.samples.push_back(samples[i]);
        run.replica_batches.push_back(i < replicas.size() ? replicas[i] : std::vector<int>{});
      }
    if (!h5::has_attr(f.id(), "/", "final_checkpoint"))
      throw UsageError(path + " has no final checkpoint (was it run with --no-final-checkpoint, cut short, "
                       "or did it end with every replica down?): nothing to replay against");
    run.checkpoint = h5::get_attr_string(f.id(), "/", "final_checkpoint");
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("--replay {}: not a readable ntpbench results file ({})", path, e.what()));
  }
  if (run.steps.empty()) throw UsageError(path + " records no steps");
  return run;
}

// The recorded run's options, made one rank's: TP 1, one stage, each step's whole global batch as
// one micro-batch, wall time, no schedule.
Options on_one_rank(Options o, const Options& cli) {
  o.tp = 1;
  o.pp = 1;
  o.micro_batches = 1;
  o.threads = cli.threads;
  o.timing = Timing::Wall;
  o.pacing.enabled = false;
  o.schedule.clear();
  return o;
}

// A mixture of experts' step as the run took it: each replica's batch in its micro-batches (passes
// of --micro-batch sequences; with one micro-batch, the replica's whole batch, which a policy may
// have cut below it). Empty where the run's per-replica batches are not recorded.
std::vector<int> forward_passes(const Options& run, const std::vector<int>& replica_batches) {
  std::vector<int> passes;
  const int b = run.micro_batches > 1 ? run.micro_batch : 0;
  for (int B : replica_batches)
    for (int left = B; left > 0; left -= b > 0 ? b : B) passes.push_back(b > 0 ? std::min(b, left) : B);
  return passes;
}

}  // namespace

int run_replay(const Options& cli, Comm& world) {
  if (world.size() != 1)
    throw UsageError(fmt::format("--replay runs on one rank; this job has {}", world.size()));
  const RecordedRun run = read_recorded_run(cli.replay);
  validate_data_file(run.options, world);
  check_backend(run.options, world);
  const Options o = on_one_rank(run.options, cli);
  configure_threads(o.threads, world);
  const int max_batch = static_cast<int>(*std::max_element(run.samples.begin(), run.samples.end()));
  Trainer trainer(o, world, max_batch);
  if (!o.init_from.empty()) trainer.load_checkpoint(o.init_from, o.init_weights_only);
  fmt::print("replay: {} steps of {} on one rank, against {}\n", run.steps.size(), cli.replay, run.checkpoint);

  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    if (trainer.cursor() != run.begins[i]) {
      // The run's data order is not one rank's: a verdict, not an error.
      fmt::print("replay: DISAGREES: step {} starts at sample {} on one rank, the run recorded {}\n", run.steps[i],
                 trainer.cursor(), run.begins[i]);
      return code(ExitCode::Failed);
    }
    // A mixture of experts' balancing loss and capacity are per forward pass: the run's passes.
    const std::vector<int> passes =
        o.model.moe() ? forward_passes(run.options, run.replica_batches[i]) : std::vector<int>{};
    const StepResult r =
        passes.empty() ? trainer.step({static_cast<int>(run.samples[i])}) : trainer.step_in_passes(passes);
    if (!cli.quiet) fmt::print("replay step {:5d} | {} samples | loss {:.6f}\n", run.steps[i], run.samples[i], r.loss);
  }

  const auto reference = read_checkpoint_params(run.checkpoint, o.model);
  Model& m = trainer.model();
  std::vector<std::vector<float>> mine;
  for (int t = 0; t < m.layout().tensor_count(); ++t)
    mine.emplace_back(m.param(t), m.param(t) + m.layout().slot(t).elems);
  const ParamDiff diff =
      compare_params(o.model, mine, reference, key_bias_bound(o.opt.lr, static_cast<int>(run.steps.size())));
  const bool ok = diff.within(cli.replay_tol);
  fmt::print("replay: {}\nreplay: {} (tolerance {:.1e} over all parameters, {:.1e} per tensor; see param_compare.hpp)\n",
             diff.describe(), ok ? "AGREES" : "DISAGREES", cli.replay_tol, kTensorTolerance);
  return code(ok ? ExitCode::Ok : ExitCode::Failed);
}

}  // namespace ntp
