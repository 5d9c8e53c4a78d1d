#pragma once
// One training job's state on this rank and the step that advances it: replicas of a TP group
// each take their batch from one global data cursor, run forward and backward, all-reduce
// gradients across replicas, clip on the global norm and step AdamW.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "comm.hpp"
#include "data.hpp"
#include "gpt_model.hpp"
#include "optimizer.hpp"
#include "options.hpp"
#include "phase_clock.hpp"

namespace ntp {

// World rank r belongs to replica r / tp at TP slot r % tp (TP ranks adjacent).
struct Topology {
  int world_size, world_rank, tp, replicas, replica, slot;
  Topology(int world_size, int world_rank, int tp);
  std::vector<int> replica_ranks(int replica) const;
};

struct StepResult {
  double loss = 0;           // mean token loss over the global batch
  double grad_norm = 0;      // before clipping
  double lr = 0;
  long long sample_begin = 0;
  long long samples = 0;     // sequences in the global batch
  std::array<double, kPhaseCount> phase_seconds{};  // this rank's
};

class Trainer {
 public:
  // max_batch: the largest per-replica batch any step will use.
  Trainer(const Options& o, Comm& world, int max_batch);

  // One optimizer step; batch[r] sequences for replica r, taken from the cursor in replica order.
  StepResult step(const std::vector<int>& batch);

  const Topology& topology() const { return topo_; }
  long long cursor() const { return cursor_; }
  void set_cursor(long long c) { cursor_ = c; }
  int steps_taken() const { return opt_->steps_taken(); }
  GptModel& model() { return *model_; }
  AdamW& optimizer() { return *opt_; }
  const DataSource& data() const { return *data_; }
  PhaseClock& clock() { return clock_; }

  // Collective: replica 0 gathers to world rank 0, which writes.
  void save_checkpoint(const std::string& path);
  // Loads weights (and optimizer state, step and cursor unless weights_only).
  void load_checkpoint(const std::string& path, bool weights_only);

 private:
  Options o_;
  Comm& world_;
  Topology topo_;
  std::unique_ptr<Comm> tp_comm_, dp_comm_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<GptModel> model_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<DataSource> data_;
  long long cursor_ = 0;
  std::vector<int> tokens_, targets_;
  PhaseClock clock_;
};

// Sets BLAS and OpenMP threads for this rank (0 = cores on the node / ranks on the node). Returns the count.
int configure_threads(int requested);
// Single-rank sgemm rate (GFLOP/s) measured now, for MFU when no peak is given.
double measure_sgemm_gflops();

}  // namespace ntp
