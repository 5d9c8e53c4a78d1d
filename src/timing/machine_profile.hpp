#pragma once
// The emulated machines of paced timing (--machine): one place for their rates. Each profile gives
// one GPU's dense FLOP/s per precision, its memory bandwidth, its scale-up and scale-out bandwidth
// (GB/s each way), the latency of one message and the size of its scale-up domain. Paced timing
// slows every rate of a profile by one factor (--time-scale), so every ratio between compute and
// links is the machine's.
#include <string>
#include <vector>

namespace ntp {

struct MachineProfile {
  std::string name;
  double bf16_tflops = 0, tf32_tflops = 0, fp32_tflops = 0;  // per GPU, dense
  double memory_gbps = 0;     // per GPU, its HBM (what a memory-bound pass such as AdamW runs at)
  double scale_up_gbps = 0;   // per GPU, each way (NVLink)
  double scale_out_gbps = 0;  // per GPU (its NIC)
  double latency_us = 0;      // per message, either link
  int gpus_per_domain = 0;    // GPUs in one scale-up domain (a node, or a rack for NVL72)
  std::string source;         // where the figures come from
  double tflops(const std::string& precision) const;
};

// dgx-a100, dgx-h100, gb200-nvl72.
const std::vector<MachineProfile>& machine_profiles();
std::vector<std::string> machine_names();  // the profiles' names, then "custom"
// The named profile; throws std::invalid_argument naming the known ones.
const MachineProfile& machine_profile(const std::string& name);

}  // namespace ntp
