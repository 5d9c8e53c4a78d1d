#pragma once
// Gradient synchronisation across replicas that may run at different TP degrees (the paper's
// NTP sync). With every active replica at the same degree it is one all-reduce per TP slot over
// the whole gradient arena (Megatron's DP all-reduce). Otherwise, for sync degree N2 (the
// smallest live degree), inside each replica the extra ranks send their gradient slices to the
// core rank that owns the chunk (reshard, all-to-all in the TP group); core rank i of every
// replica all-reduce chunk i (one DP all-reduce per sync slot); the reverse reshard returns the
// extras' slices. Replicated tensors ride along in every slot; the reverse exchange also carries
// one copy of them from core rank 0 to every other rank. One exchange per direction: the
// dimensions' plans are combined into one.
//
// The global gradient norm is assembled so that every rank of every replica gets bitwise the same
// value (one partial per sync slot, summed in slot order), which keeps parameters identical.
#include <memory>
#include <vector>

#include "backend.hpp"
#include "comm.hpp"
#include "configuration.hpp"
#include "pacer.hpp"
#include "param_layout.hpp"
#include "phase_clock.hpp"
#include "reshard.hpp"

namespace ntp {

class GradSync {
 public:
  // tp: this rank's replica group; slot: core ranks with this rank's TP index in every active
  // replica (null on extra ranks).
  GradSync(const Configuration& cfg, int replica, int tp_index, Comm& tp, Comm* slot, const ParamLayout& layout,
           Backend& be, PhaseClock& clock, Pacer& pacer);

  // Sums `grads` (this rank's arena) over every active replica.
  void sync(float* grads);
  // The global L2 norm of the summed gradients (call after sync).
  double global_norm(const float* grads);
  // Bytes this rank sent in the last sync (all-reduce counted as a ring's 2(n-1)/n).
  double bytes_sent() const { return bytes_; }

 private:
  void pack_replicated(const float* grads, float* out) const;
  void unpack_replicated(const float* in, float* grads) const;
  std::vector<ReshardTensor> tensors(float* grads, bool to_chunks);

  const ParamLayout& layout_;
  Backend& be_;
  PhaseClock& clock_;
  Pacer& pacer_;
  Comm& tp_;
  Comm* slot_;
  int tp_index_, n2_;
  bool uniform_;
  // Chunk mode only.
  std::unique_ptr<ReshardPlan> to_chunks_, from_chunks_;  // segments: heads, mlp, vocab (+ replicated copies)
  std::vector<int> chunk_units_;                          // per sharded dimension, this rank's chunk units
  std::vector<float> chunk_;                         // core ranks: chunk i of every tensor, then replicated
  std::vector<std::size_t> chunk_offset_;            // per tensor
  std::vector<float> replicated_;                    // packed replicated gradients
  double bytes_ = 0;
};

}  // namespace ntp
