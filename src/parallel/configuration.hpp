#pragma once
// Who trains, at which TP degree, with which batch: the configuration of the job for one
// membership (set of live ranks) under a recovery policy. Every rank computes the same
// configuration from the same schedule, so no negotiation is needed.
#include <string>
#include <vector>

#include "model_config.hpp"
#include "tp_layout.hpp"

namespace ntp {

// World rank r belongs to replica r / tp at TP slot r % tp (TP ranks adjacent).
struct Topology {
  int world_size, world_rank, tp, replicas, replica, slot;
  Topology(int world_size, int world_rank, int tp);
  std::vector<int> replica_ranks(int replica) const;
};

enum class Policy { DpDrop, Ntp, NtpPw, Restart };
Policy parse_policy(const std::string& name);  // throws std::invalid_argument
std::string policy_name(Policy p);

enum class ReplicaState : signed char { Healthy = 0, Degraded = 1, Down = 2 };

struct ReplicaPlan {
  std::vector<int> ranks;  // live world ranks in TP order (empty when down)
  TpLayout layout;         // over ranks (unused when down)
  int batch = 0;           // sequences this replica takes per step
  ReplicaState state = ReplicaState::Down;
  double speed = 1.0;      // compute speed multiplier (ntp-pw boost)
  bool active() const { return state != ReplicaState::Down; }
  int degree() const { return static_cast<int>(ranks.size()); }
};

struct Configuration {
  std::vector<ReplicaPlan> replicas;
  std::vector<char> alive;  // per world rank
  int n2 = 0;               // smallest live TP degree among active replicas (0: none active)

  int active_replicas() const;
  int live_ranks() const;
  long long samples() const;         // global batch in sequences
  std::vector<int> batches() const;  // per replica
  std::vector<int> degrees() const;  // per replica, 0 when down
  // Every active replica at degree n2: plain per-slot all-reduce, no core/extra regrouping.
  bool uniform() const;
  // Which replica (and TP index) a world rank trains in, or -1.
  int replica_of(int world_rank) const;
  int tp_index_of(int world_rank) const;
};

// The configuration for live ranks `alive` (per world rank) under `policy`:
//   dp-drop  a replica trains only with all its ranks (Megatron's layout at TP t);
//   ntp      a replica with n of t ranks trains at TP n with batch max(1, floor(B n / t));
//   ntp-pw   like ntp with the full batch B, its ranks sped up by `boost`;
//   restart  everyone trains only when every rank is alive.
// Under ntp/ntp-pw replicas take the core/extra layout for the smallest live degree (ntp_layout.hpp).
Configuration plan_configuration(Policy policy, const Topology& topo, const ModelConfig& m, int B, double boost,
                                 const std::vector<char>& alive);

// Replicas over consecutive ranks 0.., replica k at degrees[k] with the NTP layout for the
// smallest degree: a configuration made by hand (tests and benchmarks of the sync).
Configuration configuration_for_degrees(const ModelConfig& m, const std::vector<int>& degrees);

std::string format_degrees(const std::vector<int>& degrees);  // "[3, 4]"

}  // namespace ntp
