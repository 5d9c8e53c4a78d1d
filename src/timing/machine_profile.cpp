#include "machine_profile.hpp"

#include <stdexcept>

#include <yaml-cpp/yaml.h>

namespace ntp {

double MachineProfile::tflops(EmulatedPrecision precision) const {
  switch (precision) {
    case EmulatedPrecision::Bf16: return bf16_tflops;
    case EmulatedPrecision::Tf32: return tf32_tflops;
    case EmulatedPrecision::Fp32: return fp32_tflops;
  }
  throw std::invalid_argument("an unknown emulated precision");
}

namespace {

YAML::Node field(const YAML::Node& n, const char* key, const std::string& what) {
  const YAML::Node v = n[key];
  if (!v) throw std::invalid_argument(what + ": no '" + key + "'");
  return v;
}

double positive(const YAML::Node& n, const char* key, const std::string& what) {
  const double v = field(n, key, what).as<double>();
  if (!(v > 0)) throw std::invalid_argument(what + ": '" + key + "' must be above 0");
  return v;
}

Sourced sourced(const YAML::Node& n, const char* key, const std::string& what) {
  const YAML::Node f = field(n, key, what);
  const std::string where = what + ": recovery." + key;
  Sourced s{f["value"] ? f["value"].as<double>() : -1, f["source"] ? f["source"].as<std::string>() : ""};
  if (!(s.value >= 0)) throw std::invalid_argument(where + " needs a value of 0 or more");
  if (s.source.empty()) throw std::invalid_argument(where + " needs a source");
  return s;
}

}  // namespace

MachineProfile parse_machine_profile(const std::string& yaml, const std::string& what) {
  try {
    const YAML::Node n = YAML::Load(yaml);
    MachineProfile p;
    p.name = field(n, "name", what).as<std::string>();
    p.source = field(n, "source", what).as<std::string>();
    p.bf16_tflops = positive(n, "bf16_tflops", what);
    p.tf32_tflops = positive(n, "tf32_tflops", what);
    p.fp32_tflops = positive(n, "fp32_tflops", what);
    p.memory_gbps = positive(n, "memory_gbps", what);
    p.scale_up_gbps = positive(n, "scale_up_gbps", what);
    p.scale_out_gbps = positive(n, "scale_out_gbps", what);
    p.latency_us = field(n, "latency_us", what).as<double>();
    p.gpus_per_domain = field(n, "gpus_per_domain", what).as<int>();
    const YAML::Node r = field(n, "recovery", what);
    RecoveryCosts& c = p.recovery;
    for (const RecoveryPart& part : recovery_parts()) c.*part.cost = sourced(r, part.name, what);
    if (!(c.checkpoint_gbps.value > 0)) throw std::invalid_argument(what + ": recovery.checkpoint_gbps must be above 0");
    return p;
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(what + ": " + e.what());
  }
}

const std::vector<MachineProfile>& machine_profiles() {
  static const std::vector<MachineProfile> profiles = [] {
    std::vector<MachineProfile> out;
    for (const auto& [file, text] : machine_files()) out.push_back(parse_machine_profile(text, "jobs/machines/" + file));
    return out;
  }();
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

const std::vector<RecoveryPart>& recovery_parts() {
  static const std::vector<RecoveryPart> parts = {
      {"detect", &RecoveryCosts::detect, &RecoveryOverrides::detect, "--detect-s", "s",
       "seconds to notice a dead rank (charged once per death)"},
      {"repair", &RecoveryCosts::repair, &RecoveryOverrides::repair, "--repair-s", "s",
       "seconds to repair the communicators after a death (revoke + shrink; give the profile's "
       "reinit figure to charge abort + re-initialise instead)"},
      {"reinit", &RecoveryCosts::reinit, &RecoveryOverrides::reinit, "--reinit-s", "s",
       "seconds to abort every communicator and initialise new ones (recorded beside repair, not charged)"},
      {"reconfigure", &RecoveryCosts::reconfigure, &RecoveryOverrides::reconfigure, "--reconfigure-s", "s",
       "seconds to set up a new layout's communicators (each reconfiguration)"},
      {"replace", &RecoveryCosts::replace, &RecoveryOverrides::replace, "--replace-s", "s",
       "seconds to bring in a replacement process (a revival without a spare)"},
      {"takeover", &RecoveryCosts::takeover, &RecoveryOverrides::takeover, "--takeover-s", "s",
       "seconds for a warm spare to join (the first of a recovery)"},
      {"restart", &RecoveryCosts::restart, &RecoveryOverrides::restart, "--restart-s", "s",
       "seconds to restart the job under --policy restart (requeue, start, init; the checkpoint load apart)"},
      {"checkpoint_gbps", &RecoveryCosts::checkpoint_gbps, &RecoveryOverrides::checkpoint_gbps, "--checkpoint-gbps",
       "GB/s", "GB/s of one GPU's share of checkpoint storage (writes and loads)"},
  };
  return parts;
}

const RecoveryCosts& recovery_costs(const std::string& machine) {
  return machine_profile(machine == "custom" ? kCustomRecoveryMachine : machine).recovery;
}

RecoveryCosts recovery_costs(const std::string& machine, const RecoveryOverrides& given) {
  RecoveryCosts c = recovery_costs(machine);
  for (const RecoveryPart& part : recovery_parts())
    if (const std::optional<double>& v = given.*part.given)
      c.*part.cost = {*v, std::string("given: ") + part.flag};
  return c;
}

}  // namespace ntp
