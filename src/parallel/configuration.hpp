#pragma once
// Who trains, at which TP degree, with which batch: the configuration of the job for one
// membership (set of live ranks) under a recovery policy. Every rank computes the same
// configuration from the same schedule, so no negotiation is needed.
#include <string>
#include <vector>

#include "model_config.hpp"
#include "tp_layout.hpp"

namespace ntp {

// World rank r = (replica * stages + stage) * tp + slot: TP ranks adjacent, then the pipeline
// stages of a replica, so a replica is a contiguous block of stages * tp ranks (Megatron's order
// with TP fastest).
struct Topology {
  int world_size, world_rank, tp, stages, replicas, replica, stage, slot;
  Topology(int world_size, int world_rank, int tp, int stages = 1);
  std::vector<int> replica_ranks(int replica) const;  // stage-major
  int ranks_per_replica() const { return tp * stages; }
  int replica_of_rank(int rank) const { return rank / ranks_per_replica(); }  // whose block holds rank
};

enum class Policy { DpDrop, Ntp, NtpPw, Restart };

enum class ReplicaState : signed char { Healthy = 0, Degraded = 1, Down = 2 };

// Every stage of a replica runs at the same TP degree (the paper's rule for NTP with pipelines:
// per-stage degrees would make the stage-to-stage exchange many-to-many).
struct ReplicaPlan {
  std::vector<int> ranks;  // training world ranks, stage-major, TP order within a stage (empty when down)
  TpLayout layout;         // of every stage's TP group (unused when down)
  int stages = 1;          // pipeline stages
  int batch = 0;           // sequences this replica takes per step
  int micro_batches = 1;   // the batch in this many equal micro-batches (1F1B with stages > 1)
  ReplicaState state = ReplicaState::Down;
  double speed = 1.0;      // compute speed multiplier (ntp-pw boost)
  bool active() const { return state != ReplicaState::Down; }
  int degree() const { return static_cast<int>(ranks.size()) / stages; }  // TP degree of each stage
  // Stage s's TP group.
  std::vector<int> stage_ranks(int s) const {
    return {ranks.begin() + std::ptrdiff_t(s) * degree(), ranks.begin() + std::ptrdiff_t(s + 1) * degree()};
  }
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
  // Every active replica at degree n2 with the even split: plain per-slot all-reduce, no core/extra
  // regrouping (a replica rebalanced by speed, rebalance.hpp, has another split at the same degree).
  bool uniform() const;
  // Which replica (stage, TP index) a world rank trains in, or -1.
  int replica_of(int world_rank) const;
  int tp_index_of(int world_rank) const;
  int stage_of(int world_rank) const;
};

// The configuration for live ranks `alive` (per world rank) under `policy`, each replica taking
// B sequences per step in M micro-batches (B / M each):
//   dp-drop  a replica trains only with all its ranks (Megatron's layout at TP t);
//   ntp      a replica whose least-staffed stage has n of t ranks trains every stage at TP n (the
//            first n live ranks of each stage; the others sit out) with batch max(1, floor(B n / t))
//            in one micro-batch, or, with M > 1, max(1, floor(M n / t)) micro-batches of B / M;
//   ntp-pw   like ntp with the full batch B, its ranks sped up by `boost`;
//   restart  everyone trains only when every rank is alive.
// Under ntp/ntp-pw replicas take the core/extra layout for the smallest live degree (ntp_layout.hpp).
Configuration plan_configuration(Policy policy, const Topology& topo, const ModelConfig& m, int B, double boost,
                                 const std::vector<char>& alive, int micro_batches = 1);

// Replicas over consecutive ranks 0.., replica k at degrees[k] with the NTP layout for the
// smallest degree: a configuration made by hand (tests and benchmarks of the sync).
Configuration configuration_for_degrees(const ModelConfig& m, const std::vector<int>& degrees);

std::string format_degrees(const std::vector<int>& degrees);  // "[3, 4]"

}  // namespace ntp
