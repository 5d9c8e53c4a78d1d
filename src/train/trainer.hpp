#pragma once
// One training job's state on this rank and the two things that change it: a step (replicas of
// a TP group take their batches from one global data cursor, run forward and backward, sync
// gradients across replicas, clip on the global norm and step AdamW) and a reconfiguration
// (ranks die or come back: communicators are rebuilt, every replica takes its layout for the new
// membership, and shards move with the one reshard primitive from whichever live replica holds
// them; when a shard is held by no live replica, everyone falls back to the last checkpoint).
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "comm.hpp"
#include "configuration.hpp"
#include "data.hpp"
#include "gpt_model.hpp"
#include "grad_sync.hpp"
#include "optimizer.hpp"
#include "options.hpp"
#include "pacer.hpp"
#include "phase_clock.hpp"

namespace ntp {

struct StepResult {
  bool trained = false;      // this rank took part
  double loss = 0;           // mean token loss over the global batch (valid where trained)
  double grad_norm = 0;      // before clipping
  double lr = 0;
  long long sample_begin = 0;
  long long samples = 0;     // sequences in the global batch
  int overruns = 0;          // paced compute phases that ran over
  // This rank's time per phase since the previous step ended (so a step's recovery and idle
  // waiting before it are included).
  std::array<double, kPhaseCount> phase_seconds{};
};

struct Recovery {
  bool changed = false;          // the configuration changed
  double detect = 0;             // agreeing on the new membership
  double reconfigure = 0;        // communicators, layouts, plans
  double heal = 0;               // moving shards (or reading the checkpoint)
  double heal_bytes = 0;         // sent by this rank (read, for a restore)
  bool restored = false;         // fell back to a checkpoint
  int restored_step = 0;         // optimizer step of the state restored
  std::string restored_from;     // checkpoint path, or "initial state"
  std::vector<int> before, after;  // TP degree per replica
};

class Trainer {
 public:
  // Every rank of `world` takes part. max_batch: the largest per-replica batch any step uses.
  Trainer(const Options& o, Comm& world, int max_batch);
  ~Trainer();

  // Collective over the world: applies a new membership (live flag per world rank).
  Recovery reconfigure(const std::vector<char>& alive);
  // One optimizer step with the configuration's batches (or `batch`, one per replica).
  // Every rank calls it; ranks that do not train only advance their counters.
  StepResult step();
  StepResult step(const std::vector<int>& batch);

  const Topology& topology() const { return topo_; }
  const Configuration& configuration() const { return cfg_; }
  bool training() const { return model_ != nullptr; }
  long long cursor() const { return cursor_; }
  int steps_taken() const { return steps_; }
  GptModel& model() { return *model_; }
  AdamW& optimizer() { return *opt_; }
  const DataSource& data() const { return *data_; }
  PhaseClock& clock() { return clock_; }
  // How ranks exchange data: MPI (cpu backend); NCCL (cuda, a GPU per rank: the world comm is
  // NCCL's, see main.cpp); MPI with host staging (cuda, --allow-gpu-sharing).
  std::string communication() const;
  Pacer& pacer() { return pacer_; }

  // Collective over the live ranks (others return at once): the first active replica gathers to
  // its first rank, which writes. Returns false when no replica is active.
  bool save_checkpoint(const std::string& path);
  // Loads weights (and optimizer state, step and cursor unless weights_only) on training ranks.
  void load_checkpoint(const std::string& path, bool weights_only);
  // Where restores come from (set after each checkpoint written); empty: the initial state.
  void set_restore_point(const std::string& path) { restore_path_ = path; }

 private:
  void build_comms();
  std::unique_ptr<GptModel> make_model(const ReplicaPlan& rp, int tp_index);
  void restore(Recovery& rec);
  bool current_state_survives(const Configuration& old_cfg, const std::vector<char>& old_valid,
                              const std::vector<char>& alive) const;
  void heal(const Configuration& old_cfg, const std::vector<char>& old_valid, Recovery& rec);

  Options o_;
  Comm& world_;
  Topology topo_;
  Policy policy_;
  int max_batch_;
  Pacer pacer_;
  PhaseClock clock_;
  std::unique_ptr<Backend> backend_;
  bool stage_device_buffers_ = false;
  std::unique_ptr<DataSource> data_;
  Configuration cfg_;
  std::vector<char> valid_;  // per replica: its state is current (it trained the last step)
  std::unique_ptr<Comm> live_, tp_, train_, slot_;  // live ranks, my replica, all trainers, my sync slot
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<GradSync> sync_;
  long long cursor_ = 0;
  int steps_ = 0;
  long long initial_cursor_ = 0;
  int initial_steps_ = 0;
  std::string restore_path_;
  std::vector<int> tokens_, targets_;
};

}  // namespace ntp
