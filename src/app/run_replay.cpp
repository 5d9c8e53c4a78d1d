// Replay verification: re-run a recorded run's exact per-step sample counts on one rank (TP 1,
// DP 1) from the same initial state and compare the parameters with the run's final checkpoint.
// Agreement shows the sharded run computed the same training as the unsharded model.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "h5.hpp"
#include "machine.hpp"
#include "param_compare.hpp"
#include "recorder.hpp"
#include "run.hpp"
#include "trainer.hpp"

namespace ntp {

int run_replay(const Options& cli, Comm& world) {
  if (world.size() != 1)
    throw UsageError(fmt::format("--replay runs on one rank; this job has {}", world.size()));
  std::vector<std::int64_t> steps, begins, samples;
  std::string ckpt;
  Options o;
  // A file that is not a results file (another HDF5 file, one damaged) is the user's mistake:
  // refused with its name on every rank (exit 2), not an internal error.
  try {
    h5::File f(cli.replay, h5::Mode::ReadOnly);
    o = options_from_json(nlohmann::json::parse(h5::get_attr_string(f.id(), "/", "config")));
    steps = read_steps_column(f.id(), "step");
    begins = read_steps_column(f.id(), "sample_begin");
    samples = read_steps_column(f.id(), "samples");
    // Only committed steps shaped the final state: skip idle slots and steps a restore undid.
    const auto committed = read_steps_column(f.id(), "tokens_committed");
    std::vector<std::int64_t> s2, b2, n2;
    for (std::size_t i = 0; i < steps.size(); ++i)
      if (committed[i] > 0) s2.push_back(steps[i]), b2.push_back(begins[i]), n2.push_back(samples[i]);
    steps.swap(s2), begins.swap(b2), samples.swap(n2);
    if (!h5::has_attr(f.id(), "/", "final_checkpoint"))
      throw UsageError(cli.replay + " has no final checkpoint (was it run with --no-final-checkpoint, cut short, "
                       "or did it end with every replica down?): nothing to replay against");
    ckpt = h5::get_attr_string(f.id(), "/", "final_checkpoint");
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    throw UsageError(fmt::format("--replay {}: not a readable ntpbench results file ({})", cli.replay, e.what()));
  }
  if (steps.empty()) throw UsageError(cli.replay + " records no steps");
  validate_data_file(o, world);
  check_backend(o, world);
  o.tp = 1;
  o.pp = 1;  // each recorded step's whole global batch as one micro-batch
  o.micro_batches = 1;
  o.threads = cli.threads;
  o.timing = Timing::Wall;
  o.pacing.enabled = false;
  o.schedule.clear();
  configure_threads(o.threads, world);
  const int max_batch = static_cast<int>(*std::max_element(samples.begin(), samples.end()));
  Trainer trainer(o, world, max_batch);
  if (!o.init_from.empty()) trainer.load_checkpoint(o.init_from, o.init_weights_only);
  fmt::print("replay: {} steps of {} on one rank, against {}\n", steps.size(), cli.replay, ckpt);

  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (trainer.cursor() != begins[i])
      throw std::runtime_error(fmt::format("replay: step {} starts at sample {}, the run recorded {}", steps[i],
                                           trainer.cursor(), begins[i]));
    const StepResult r = trainer.step({static_cast<int>(samples[i])});
    if (!cli.quiet) fmt::print("replay step {:5d} | {} samples | loss {:.6f}\n", steps[i], samples[i], r.loss);
  }

  const auto reference = read_checkpoint_params(ckpt, o.model);
  Model& m = trainer.model();
  std::vector<std::vector<float>> mine;
  for (int t = 0; t < m.layout().tensor_count(); ++t)
    mine.emplace_back(m.param(t), m.param(t) + m.layout().slot(t).elems);
  const ParamDiff diff =
      compare_params(o.model, mine, reference, key_bias_bound(o.opt.lr, static_cast<int>(steps.size())));
  const bool ok = diff.within(cli.replay_tol);
  fmt::print("replay: {}\nreplay: {} (tolerance {:.1e} over all parameters, {:.1e} per tensor; see param_compare.hpp)\n",
             diff.describe(), ok ? "AGREES" : "DISAGREES", cli.replay_tol, kTensorTolerance);
  return ok ? 0 : 1;
}

}  // namespace ntp
