#pragma once
// One training job's state on this rank and the two things that change it: a step (replicas of
// a TP group take their batches from one global data cursor, run forward and backward, sync
// gradients across replicas, clip on the global norm and step AdamW) and a reconfiguration
// (ranks die or come back: communicators are rebuilt, every replica takes its layout for the new
// membership, and shards move with the one reshard primitive from whichever live replica holds
// them; when a shard is held by no live replica, everyone falls back to the last checkpoint).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "comm.hpp"
#include "configuration.hpp"
#include "data.hpp"
#include "fault.hpp"
#include "model.hpp"
#include "grad_sync.hpp"
#include "optimizer.hpp"
#include "options.hpp"
#include "pacer.hpp"
#include "phase_clock.hpp"
#include "step_point.hpp"

namespace ntp {

struct StepResult {
  bool trained = false;      // this rank took part
  double loss = 0;           // mean token loss over the global batch (valid where trained)
  double grad_norm = 0;      // before clipping
  double lr = 0;
  long long sample_begin = 0;
  long long samples = 0;     // sequences in the global batch
  int overruns = 0;          // paced compute phases that ran over
  double overrun_ratio = 0;  // paced: the worst real / emulated time of its compute phases
  int link_overruns = 0;     // paced transfers whose real end came after their emulated end
  double overrun_seconds = 0;       // paced: seconds compute phases ran over their emulated time
  double link_overrun_seconds = 0;  // paced: seconds transfers ended after their emulated end
  double host_seconds = 0;          // paced: real seconds of the step outside the paced calls (the commit's waits for peers aside)
  double worst_rank_seconds = 0;    // paced, the recorder's row: the worst rank's seconds past emulated time
  double compute_flops = 0;  // this rank's forward, backward and optimizer FLOPs (where trained)
  bool nonfinite = false;    // the loss or gradient norm was not finite: no parameter changed
  // A mixture of experts, this replica-stage's routing over the step's passes (its first TP rank
  // only; 0 elsewhere): assignments kept and dropped, the busiest expert (Model::RouterStats).
  long long moe_kept = 0, moe_dropped = 0;
  double moe_load_max = 0;
  // The assignments kept per expert (by expert id), on the same ranks; empty for a dense model.
  // The recorder's row: over every replica and stage (-1 each where the gather failed: empty).
  std::vector<std::int64_t> moe_tokens_per_expert;
  // This rank's time per phase since the previous step ended (so a step's recovery and idle
  // waiting before it are included).
  std::array<double, kPhaseCount> phase_seconds{};
};

// What one change of configuration did and cost on this rank (Trainer::reconfigure, forget).
struct Reconfiguration {
  bool changed = false;          // the configuration changed
  double detect = 0;             // agreeing on the new membership
  double reconfigure = 0;        // communicators, layouts, plans
  double heal = 0;               // moving shards (or reading the checkpoint)
  double heal_bytes = 0;         // sent by this rank (read, for a restore)
  double link_bytes = 0;         // the more of what this rank sent and received (read): what its link carried
  bool restored = false;         // fell back to a checkpoint
  int restored_step = 0;         // optimizer step of the state restored
  std::string restored_from;     // checkpoint path, or "initial state"
  std::vector<int> before, after;  // TP degree per replica
};

// A step attempt that did not commit: some rank failed (or saw a failure) before the agreement
// that precedes the optimizer. No parameter changed and no sample was consumed.
struct CommitRefused : PeerFailure {
  using PeerFailure::PeerFailure;
};

// What a process started to replace a dead rank needs to take its place (the survivors' view).
struct JoinState {
  int logical_rank = 0;
  std::vector<char> alive;  // per logical rank, the new process not yet counted
  std::vector<double> rank_speed;  // per logical rank (--straggler-policy rebalance; empty: all 1)
  std::vector<char> valid;  // per replica
  std::vector<char> lost;   // per logical rank (Trainer::forget; empty: none)
  long long cursor = 0, initial_cursor = 0;
  int steps = 0, initial_steps = 0;
  std::string restore_path;
};

// Who holds a Trainer's current state: per replica, whether it trained the last step; per logical
// rank, whether its process died since the configuration was planned (Trainer::forget: the
// configuration still names it, its state is gone).
struct Holders {
  std::vector<char> valid, lost;
  bool holds(int rank) const { return lost.empty() || !lost[rank]; }
};

// The configuration the job's options give for a membership (live flag per logical rank), with
// the TP shares of replicas holding slow ranks rebalanced by `rank_speed` (rebalance.hpp; per
// logical rank, empty: every rank at full speed).
Configuration plan_for(const Options& o, const Topology& topo, const std::vector<char>& alive,
                       const std::vector<double>& rank_speed = {});

// Ranks are *logical*: numbered as at job start, whatever process holds them now. The group a
// Trainer talks over holds the live ones (with --kill-mode fence, every one), in logical order.
class Trainer {
 public:
  // Every rank of `world` takes part. max_batch: the largest per-replica batch any step uses.
  // `o` is the run's options, held by reference (they must outlive the trainer): one copy per rank,
  // so what the run settles after it starts (the LR schedule's last step after a checkpoint's)
  // is what the trainer uses.
  Trainer(const Options& o, Comm& world, int max_batch);
  // A process started to replace a dead rank: empty memory, no communicators yet; it takes part
  // in the survivors' next reconfigure() over `group` (which already includes it), which heals it.
  Trainer(const Options& o, Comm& group, int max_batch, const JoinState& join);
  Trainer(Options&&, Comm&, int) = delete;
  Trainer(Options&&, Comm&, int, const JoinState&) = delete;
  ~Trainer();

  // Collective over the group: applies a new membership (live flag per logical rank).
  Reconfiguration reconfigure(const std::vector<char>& alive);
  // No collective: the ranks dead in `alive` lose their state, and the configuration stays as it is
  // until the next reconfigure(), which heals their successors from the live holders. For spares
  // that take the dead ranks over at once: one reconfiguration, not a shrink and then a regrowth.
  // No step may run in between. Returns the (unchanged) degrees.
  Reconfiguration forget(const std::vector<char>& alive);
  // Each logical rank's compute speed for the layouts of later reconfigurations (rebalance.hpp:
  // a replica with a rank below 1 shares its units by speed); empty: every rank at 1. Every rank
  // must set the same.
  void set_rank_speeds(std::vector<double> speed) { rank_speed_ = std::move(speed); }
  const std::vector<double>& rank_speeds() const { return rank_speed_; }
  // Whether a reconfiguration to `alive` would heal every shard from live ranks (no restore from a
  // checkpoint; see heal()).
  bool state_survives(const std::vector<char>& alive) const { return current_state_survives(cfg_, held_, alive); }
  // Seconds the emulated or real device of this rank takes for a fixed small matrix product, paced
  // like a compute phase (a straggler's slowdown included): a probe of this rank's speed that needs
  // no model and no peer (an evicted straggler runs it while the others train).
  double probe_seconds();

  // With real failures (--kill-mode signal): the group is replaced after a shrink or a spawn;
  // `group` must hold exactly the live ranks, in logical order. Then reconfigure().
  void set_group(Comm& group) { group_ = &group; }
  Comm& group() { return *group_; }
  // Revokes every communicator this rank holds, so that no survivor stays blocked in one.
  void revoke_all();
  // Called at each StepPoint of a step on this rank (a scheduled kill strikes there).
  void set_step_hook(std::function<void(StepPoint)> hook) { step_control_.hook = std::move(hook); }
  // Every step ends with an agreement over the group before the optimizer (fault.hpp); a step
  // that does not commit throws CommitRefused. On by default where failures are real.
  void set_commit_agreement(bool on) { step_control_.agree_commit = on; }
  JoinState join_state(int logical_rank) const;
  int logical_rank() const { return topo_.world_rank; }
  // One optimizer step with the configuration's batches (or `batch`, sequences per replica, each
  // split into the replica's micro-batches). Every rank calls it; ranks that do not train only
  // advance their counters.
  StepResult step();
  StepResult step(const std::vector<int>& batch);
  // One rank (one replica, one stage) replaying a run's step as that run's forward passes, their
  // sizes in sample order: a mixture of experts' balancing loss and capacity are per pass, so the
  // step is the run's only when its passes are.
  StepResult step_in_passes(const std::vector<int>& passes);
  // The forward, backward and gradient sync of a step on the configuration's batches, with no
  // update and no sample consumed (the next step computes its gradients afresh): what paced
  // timing's calibration times. Every rank of the group calls it.
  void dry_step();

  const Topology& topology() const { return topo_; }
  const Configuration& configuration() const { return cfg_; }
  bool training() const { return shard_.model != nullptr; }
  long long cursor() const { return progress_.cursor; }
  int steps_taken() const { return progress_.steps; }
  Model& model() { return *shard_.model; }
  AdamW& optimizer() { return *shard_.opt; }
  const DataSource& data() const { return *feed_.source; }
  PhaseClock& clock() { return clock_; }
  // How ranks exchange data: MPI (cpu backend); NCCL (cuda, a GPU per rank: the world comm is
  // NCCL's, see main.cpp); MPI with host staging (cuda, --allow-gpu-sharing).
  std::string communication() const;
  Pacer& pacer() { return pacer_; }

  // Collective over the live ranks (fenced dead ranks take no part): the first active replica
  // gathers to its first rank, which writes. Every rank of the group, dead ones included, then
  // restores from this file: a fenced rank revived later must restore from where its peers do.
  // Returns false when no replica is active (nothing written).
  bool save_checkpoint(const std::string& path);
  // The last checkpoint written (by this rank's group, or before it joined), empty if none.
  const std::string& last_checkpoint() const { return restart_point_.path; }
  // Loads weights (and optimizer state, step and cursor unless weights_only) on training ranks.
  void load_checkpoint(const std::string& path, bool weights_only);

 private:
  void build_comms();
  void route_links();
  void gradients(const std::vector<int>& batch, StepResult& r, const std::function<void(StepPoint)>& at);
  // The 1F1B pipeline over `micro` micro-batches of `b` sequences starting at sample `first`;
  // returns this rank's share of the loss sum (the last stage's).
  double pipeline(long long first, int micro, int b, float dloss, const std::function<void(StepPoint)>& at);
  std::vector<int> replay_passes_;  // step_in_passes's, for the step it runs
  // One pipeline transfer over groups_.pp (either side may be absent: -1), timed and paced.
  void pp_transfer(const float* send, int dest, float* recv, int src, std::size_t n);
  // GPT-2's tied embedding: the first and last stages sum their wte gradients (Megatron's
  // embedding group).
  void reduce_tied_embedding();
  std::unique_ptr<Model> make_model(const ReplicaPlan& rp, int tp_index, int stage);
  void restore(Reconfiguration& rec);
  bool current_state_survives(const Configuration& old_cfg, const Holders& old, const std::vector<char>& alive) const;
  void heal(const Configuration& old_cfg, const Holders& old, Reconfiguration& rec);

  const Options& o_;
  Comm* group_;
  Topology topo_;  // the job's shape, and this rank in it (world_rank: its logical rank)
  Pacer pacer_;
  PhaseClock clock_;
  // The device: its backend; whether device buffers go through host memory (see communication());
  // probe_seconds' operands (backend memory).
  struct Device {
    std::unique_ptr<Backend> backend;
    bool stage_buffers = false;
    Arena probe;
  } device_;
  // The data: its source, and a step's tokens and targets (room for max_batch sequences).
  struct Feed {
    std::unique_ptr<DataSource> source;
    int max_batch = 0;
    std::vector<int> tokens, targets;
  } feed_;
  Configuration cfg_;
  Holders held_;
  // This rank's groups under the configuration (build_comms): the live ranks; its replica's TP group
  // at its stage; the ranks of active replicas; its sync slot (its TP index and stage across the
  // replicas); with stages, its pipeline and the tied embedding's two ends. Null where it has none.
  struct Groups {
    std::unique_ptr<Comm> live, tp, train, slot, pp, embed;
  } groups_;
  // What this rank trains: its shard of the model, its AdamW state, the gradient sync over its
  // groups. Null where it trains no replica (dead, or in a replica that stopped).
  struct Shard {
    std::unique_ptr<Model> model;
    std::unique_ptr<AdamW> opt;
    std::unique_ptr<GradSync> sync;
  } shard_;
  // How far training has got: samples consumed (the data cursor) and optimizer steps taken.
  struct Progress {
    long long cursor = 0;
    int steps = 0;
  } progress_;
  // Where --policy restart goes back to: the last checkpoint written (path), else the state the
  // run started from.
  struct RestartPoint {
    std::string path;
    Progress initial;
  } restart_point_;
  // Called at each StepPoint of a step (set_step_hook), and whether every step agrees before its
  // update (set_commit_agreement).
  struct StepControl {
    std::function<void(StepPoint)> hook;
    bool agree_commit = false;
  } step_control_;
  std::vector<double> rank_speed_;  // set_rank_speeds
};

}  // namespace ntp
