#pragma once
// Everything a run is configured by, parsed from the command line (and --config TOML) and
// recorded as JSON in the results file so a run can be replayed. Each option is declared once, in
// option_table.cpp (flag, JSON key, help, checks); a new field here needs its row there.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "choices.hpp"
#include "machine_profile.hpp"
#include "model_config.hpp"
#include "optimizer.hpp"
#include "pacer.hpp"

namespace ntp {

struct Options {
  std::string preset = "small";
  ModelConfig model = ntp::preset("small");
  int seq = 128;          // T, training sequence length
  int tp = 1;             // TP degree
  int pp = 1;             // pipeline stages; DP = ranks / (tp * pp)
  int micro_batch = 4;    // sequences per micro-batch
  int micro_batches = 1;  // micro-batches per replica per step (a replica's batch: micro_batch * micro_batches)
  int steps = 20;
  std::uint64_t seed = 1234;
  std::string data = "synthetic";
  OptimizerConfig opt;
  std::string out;        // results HDF5 ("" = results/ntpbench-<time>.h5)
  bool overwrite = false;
  int checkpoint_every = 0;
  std::string checkpoint_dir;  // "" = beside --out
  bool final_checkpoint = true;
  std::string init_from;
  bool init_weights_only = false;
  std::string replay;
  double replay_tol = 1e-5;
  int threads = 0;        // per rank; 0 = cores on the node / ranks on the node
  double peak_gflops = 0; // per rank, for MFU; 0 = measure sgemm at start-up
  bool quiet = false;
  std::string schedule;          // failure schedule (YAML); "" = no failures
  Policy policy = Policy::Ntp;
  // signal: a killed rank's process dies (SIGKILL) and the survivors repair with ULFM; fence: it
  // leaves the communicators and idles. Empty until start-up picks: signal where ULFM is on.
  std::optional<KillMode> kill_mode;
  // A non-finite loss or gradient norm: stop (the run ends, exit 4) or skip the update.
  OnNonfinite on_nonfinite = OnNonfinite::Stop;
  // A rank that makes no progress (no phase of a step, repair, revival or checkpoint ends) for
  // this long, or 10x its longest step so far if that is more, ends the job (exit code 5): the way
  // out of a hang no error ends. 0: never.
  double hang_timeout = 600;
  double failure_timeout = 10;  // a hung rank's heartbeat stops this long (hang_watch.hpp)
  double straggler_threshold = 0;  // compute over its peers' median (e.g. 1.2); 0: no detection (straggler.hpp)
  int straggler_window = 5;          // ... for this many consecutive steps
  StragglerPolicy straggler_policy = StragglerPolicy::Tolerate;  // what a verdict does (training_run.cpp)
  // Spare processes (recovery/spare_pool.hpp): the last K processes of every host, and every process of
  // the last H hosts, hold no training state and replace dead ranks: at their revival (revive) or
  // in the repair of the death itself (takeover).
  int spares_per_host = 0;
  int spare_hosts = 0;
  SpareUse spare_use = SpareUse::Revive;
  // The takeover rule, named once: spares take a dead rank over in the repair of its death.
  bool spares_take_over_deaths() const {
    return spare_use == SpareUse::Takeover && (spares_per_host > 0 || spare_hosts > 0);
  }
  Timing timing = Timing::Wall;
  // Paced timing's emulated machine (timing/machine_profile.hpp; custom: the rates in `pacing` as
  // given), the factor every rate is slowed by (0 for auto until calibrated at start-up, then the
  // number; the option's text is "auto" or the number), the headroom auto leaves, the precision of
  // the profile's FLOP/s, and the preset whose costs are charged (--emulate-shape; "none": the
  // model's own).
  std::string machine = "custom";
  double time_scale = 0;
  double headroom = 2.0;
  EmulatedPrecision emulated_precision = EmulatedPrecision::Bf16;
  std::string emulate_shape = "none";
  // The values above that are words, not names of a profile or numbers (or a factor still to find):
  // each spelled here.
  bool custom_machine() const { return machine == "custom"; }
  bool auto_time_scale() const { return time_scale == 0; }
  bool emulates_shape() const { return emulate_shape != "none"; }
  PacingConfig pacing;  // enabled, boost, and custom's rates (the flags); paced_rates() for the rates run
  RecoveryOverrides recovery_given;  // --detect-s, ...: recovery figures in place of the machine's
  bool check = false;            // validate configuration and schedule, then exit
  BackendKind backend = BackendKind::Cpu;  // kernels and memory (src/backend/backend.hpp)
  Precision precision = Precision::Fp32;  // of the GEMMs (bf16: cuda only; src/backend/backend.hpp)
  bool allow_gpu_sharing = false;  // cuda: let several ranks share one GPU

  // Field by field (the option round-trip test compares a run's options with their JSON record).
  bool operator==(const Options&) const = default;
};

// Sequences one replica takes per step at full strength.
inline int replica_batch(const Options& o) { return o.micro_batch * o.micro_batches; }


// The rates each paced rank emulates: --machine's profile (or --machine custom's flags) divided by
// the time scale `scale`, with --emulate-shape's charge (pacer.hpp ShapeCharge).
PacingConfig paced_rates(const Options& o, double scale);
// ... at the options' own time scale (1 while it is "auto": not yet calibrated).
PacingConfig paced_rates(const Options& o);
// The time scale as a number; 0 for "auto".
double time_scale_value(const Options& o);

// Directory for checkpoints of a run writing `out`.
std::string checkpoint_dir_for(const Options& o);

}  // namespace ntp
