#include "machine_profile.hpp"

#include <stdexcept>

namespace ntp {

double MachineProfile::tflops(const std::string& precision) const {
  if (precision == "bf16") return bf16_tflops;
  if (precision == "tf32") return tf32_tflops;
  if (precision == "fp32") return fp32_tflops;
  throw std::invalid_argument("unknown precision '" + precision + "' (bf16, tf32 or fp32)");
}

const std::vector<MachineProfile>& machine_profiles() {
  // Dense (no sparsity) tensor-core peaks and link rates from NVIDIA's datasheets. Each way: NVLink's
  // quoted bidirectional figure halved. The latency is a small NCCL message's order on either link,
  // the figure bench_resilience's paced rows always used.
  static const std::vector<MachineProfile> profiles = {
      {.name = "dgx-a100", .bf16_tflops = 312, .tf32_tflops = 156, .fp32_tflops = 19.5, .memory_gbps = 2039,
       .scale_up_gbps = 300, .scale_out_gbps = 25, .latency_us = 5, .gpus_per_domain = 8,
       .source = "NVIDIA DGX A100 datasheet: A100 SXM4 80GB (312 TFLOP/s bf16 dense, HBM2e 2,039 GB/s), NVLink 3 "
                 "(600 GB/s per GPU both ways), one ConnectX-6 HDR 200 Gb/s per GPU"},
      {.name = "dgx-h100", .bf16_tflops = 989, .tf32_tflops = 494.5, .fp32_tflops = 67, .memory_gbps = 3350,
       .scale_up_gbps = 450, .scale_out_gbps = 50, .latency_us = 5, .gpus_per_domain = 8,
       .source = "NVIDIA DGX H100 datasheet and H100 SXM5 specifications (989 TFLOP/s bf16 dense, HBM3 3.35 TB/s), "
                 "NVLink 4 (900 GB/s per GPU both ways), one ConnectX-7 NDR 400 Gb/s per GPU"},
      {.name = "gb200-nvl72", .bf16_tflops = 2500, .tf32_tflops = 1250, .fp32_tflops = 80, .memory_gbps = 8000,
       .scale_up_gbps = 900, .scale_out_gbps = 50, .latency_us = 5, .gpus_per_domain = 72,
       .source = "NVIDIA GB200 NVL72 specifications per GPU (180 PFLOP/s bf16 dense and 576 TB/s of HBM3e over 72 "
                 "GPUs), NVLink 5 (1.8 TB/s per GPU both ways) across the rack, one ConnectX-7 400 Gb/s per GPU"},
  };
  return profiles;
}

std::vector<std::string> machine_names() {
  std::vector<std::string> names;
  for (const auto& p : machine_profiles()) names.push_back(p.name);
  names.push_back("custom");
  return names;
}

const MachineProfile& machine_profile(const std::string& name) {
  for (const auto& p : machine_profiles())
    if (p.name == name) return p;
  std::string known;
  for (const auto& p : machine_profiles()) known += (known.empty() ? "" : ", ") + p.name;
  throw std::invalid_argument("unknown machine '" + name + "' (" + known + ", or custom)");
}

}  // namespace ntp
