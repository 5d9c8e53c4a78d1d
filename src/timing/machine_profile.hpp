#pragma once
// The emulated machines of paced timing (--machine): one place for their rates and for what a
// recovery costs on them. Each profile gives one GPU's dense FLOP/s per precision, its memory
// bandwidth, its scale-up and scale-out bandwidth (GB/s each way), the latency of one message and
// the size of its scale-up domain, and the seconds each part of a recovery takes there. Paced timing
// slows every rate of a profile by one factor (--time-scale), so every ratio between compute and
// links is the machine's; a recovery's parts are charged on the emulated clock at the profile's
// seconds, never slept. The figures live in jobs/machines/*.yaml (embedded at build time), which
// analysis/simulate reads too.
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
struct RecoveryCosts {
  Sourced detect, repair, reconfigure, replace, takeover, restart;
  Sourced checkpoint_gbps;  // one GPU's share of checkpoint storage, GB/s
};

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
  double tflops(const std::string& precision) const;
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
// The recovery costs a run charges: its machine's, or, for custom, dgx-a100's.
const RecoveryCosts& recovery_costs(const std::string& machine);
inline constexpr const char* kCustomRecoveryMachine = "dgx-a100";

}  // namespace ntp
