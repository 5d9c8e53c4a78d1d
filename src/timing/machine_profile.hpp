#pragma once
// The emulated machines of paced timing (--machine): one place for their rates and for what a
// recovery costs on them. Each profile gives one GPU's dense FLOP/s per precision, its memory
// bandwidth, its scale-up and scale-out bandwidth (GB/s each way), the latency of one message and
// the size of its scale-up domain, and the seconds each part of a recovery takes there. Paced timing
// slows every rate of a profile by one factor (--time-scale), so every ratio between compute and
// links is the machine's; a recovery's parts are charged on the emulated clock at the profile's
// seconds, never slept. The figures live in jobs/machines/*.yaml (embedded at build time), which
// analysis/simulate reads too.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ntp {

// One figure and where it comes from.
struct Sourced {
  double value = 0;
  std::string source;
};

// What each part of a recovery costs on the machine, in its seconds (jobs/machines/README.md).
// `reinit` (abort every communicator and initialise new ones) is not charged by a run: it is the
// alternative to `repair` (revoke + shrink) that --repair-s or the simulator's --repair-mechanism
// can put in its place.
struct RecoveryCosts {
  Sourced detect, repair, reinit, reconfigure, replace, takeover, restart;
  Sourced checkpoint_gbps;  // one GPU's share of checkpoint storage, GB/s
};

// A run's own figure for some parts (--detect-s, ..., or the same keys in a --config TOML): each
// given one replaces the profile's, with a source that says so.
struct RecoveryOverrides {
  std::optional<double> detect, repair, reinit, reconfigure, replace, takeover, restart, checkpoint_gbps;
  bool operator==(const RecoveryOverrides&) const = default;
};

// One part of a recovery: its name in the profiles' files and the results file, its figure, the
// run's override of it, and the flag that gives one. Listed once (recovery_parts()), in order.
struct RecoveryPart {
  const char* name;
  Sourced RecoveryCosts::*cost;
  std::optional<double> RecoveryOverrides::*given;
  const char* flag;
  const char* unit;  // "s", or "GB/s" for the storage
  const char* help;  // what the figure is, with its unit, for --help
};
const std::vector<RecoveryPart>& recovery_parts();

// Which of a machine's dense FLOP/s the emulated device runs at (--emulated-precision).
enum class EmulatedPrecision { Bf16, Tf32, Fp32 };

struct MachineProfile {
  std::string name;
  double bf16_tflops = 0, tf32_tflops = 0, fp32_tflops = 0;  // per GPU, dense
  double memory_gbps = 0;     // per GPU, its HBM (what a memory-bound pass such as AdamW runs at)
  double scale_up_gbps = 0;   // per GPU, each way (NVLink)
  double scale_out_gbps = 0;  // per GPU (its NIC)
  double latency_us = 0;      // per message, either link
  int gpus_per_domain = 0;    // GPUs in one scale-up domain (a node, or a rack for NVL72)
  std::string source;         // where the rates come from
  RecoveryCosts recovery;
  double tflops(EmulatedPrecision precision) const;
};

// The profiles' files as built in: (file name, YAML text), generated from jobs/machines/*.yaml.
const std::vector<std::pair<std::string, std::string>>& machine_files();
// One profile from a YAML text (`what` names it in errors); throws std::invalid_argument naming a
// missing or malformed field.
MachineProfile parse_machine_profile(const std::string& yaml, const std::string& what);
// Every built-in profile, by name.
const std::vector<MachineProfile>& machine_profiles();
std::vector<std::string> machine_names();  // the profiles' names, then "custom"
// The named profile; throws std::invalid_argument naming the known ones.
const MachineProfile& machine_profile(const std::string& name);
// The recovery costs a run charges: its machine's, or, for custom, dgx-a100's; with `given`, each
// figure given in its place (its source: "given: --repair-s").
const RecoveryCosts& recovery_costs(const std::string& machine);
RecoveryCosts recovery_costs(const std::string& machine, const RecoveryOverrides& given);
inline constexpr const char* kCustomRecoveryMachine = "dgx-a100";

}  // namespace ntp
