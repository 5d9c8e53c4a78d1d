#pragma once
// Gradient synchronisation across replicas that may run at different TP degrees (the paper's
// NTP sync). With every active replica at the same degree it is one all-reduce per TP slot over
// the whole gradient arena (Megatron's DP all-reduce). Otherwise, for sync degree N2 (the
// smallest live degree), inside each replica the extra ranks send their gradient slices to the
// core rank that owns the chunk (reshard, all-to-all in the TP group); core rank i of every
// replica all-reduce chunk i (one DP all-reduce per sync slot); the reverse reshard returns the
// extras' slices. Replicated tensors ride along in every slot; the reverse exchange also carries
// one copy of them from core rank 0 to every other rank.
//
// With pipeline stages everything above is per stage: the TP group and the sync slots are the
// stage's, and tensors the stage does not hold (ParamLayout) take no space and no bucket.
//
// Chunk mode works in buckets, one per transformer layer plus one for the rest (embeddings and
// the final LayerNorm, whose gradients are final only at the end of the backward). A layer's
// regroup starts as soon as the backward has finished that layer (layer_gradients_ready) and runs
// while the layers below compute. After the backward, bucket by bucket: wait for its regroup,
// all-reduce it, start its reverse exchange, which then runs under the next bucket's all-reduce.
// The embedding bucket is all-reduced second, so its regroup overlaps the first all-reduce and its
// reverse the rest. Exposed cost: what of the regroups the backward could not hide, the
// all-reduces, and the last bucket's reverse.
//
// Core rank i's chunk buffer is laid out as the gradient arena of rank i at TP N2 with the even
// split (tensors in arena order, chunk units ascending). A replica that already runs at N2 with
// that split (the degraded one, typically) therefore all-reduces its arena in place: no regroup,
// and its reverse carries only the replicated copies.
//
// The global gradient norm is assembled so that every rank of every replica gets bitwise the same
// value (one partial per sync slot, summed in slot order), which keeps parameters identical.
#include <memory>
#include <utility>
#include <vector>

#include "arena.hpp"
#include "backend.hpp"
#include "backward_observer.hpp"
#include "comm.hpp"
#include "configuration.hpp"
#include "pacer.hpp"
#include "param_layout.hpp"
#include "phase_clock.hpp"
#include "reshard.hpp"

namespace ntp {

class GradSync final : public BackwardObserver {
 public:
  // tp: this rank's replica group; slot: core ranks with this rank's TP index in every active
  // replica (null on extra ranks).
  GradSync(const Configuration& cfg, int replica, int tp_index, Comm& tp, Comm* slot, const ParamLayout& layout,
           Backend& be, PhaseClock& clock, Pacer& pacer);
  ~GradSync() override;

  // Overlapped use: begin() before the backward that fills `grads` (this rank's arena), pass this
  // object to the backward as its observer, finish() after it. The sum over every active replica
  // is then in `grads`.
  void begin(float* grads);
  void layer_gradients_ready(int layer) override;
  void finish();
  // Tests the exchanges in flight (MPI progresses nonblocking exchanges only inside MPI calls).
  void progress();
  // Without overlap: begin + finish.
  void sync(float* grads);

  // The global L2 norm of the summed gradients (call after finish), and its square: with pipeline
  // stages, the square of this stage's share (a tensor held at both ends counted on the first).
  double global_norm(const float* grads);
  double squared_norm(const float* grads);
  // Whether this replica all-reduces its gradient arena in place (see above).
  bool chunks_in_place() const { return chunks_.aligned; }
  // Bytes this rank sent in the last sync (all-reduce counted as a ring's 2(n-1)/n).
  double bytes_sent() const { return sent_.total; }
  // Of those, the all-reduces', the regroup's (the reshard to chunks, overlapped with the
  // backward), and, under paced timing, the emulated end of the regroup's last exchange on the TP
  // link (the epoch if there was none).
  double allreduce_bytes() const { return sent_.allreduce; }
  double regroup_bytes() const { return sent_.regroup; }
  PaceClock::time_point regroup_end() const;

 private:
  struct Bucket {
    std::vector<int> tensors;  // arena tensors, ascending
    // Its ranges of the chunk buffer (offset, floats): consecutive tensors merged, so a layer is one
    // range and the embedding bucket two (wte and wpe, then the final LayerNorm).
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
  };
  struct InFlight {
    std::unique_ptr<ReshardExchange> exchange;
    LinkTicket link;  // paced: its time on the emulated TP link, from its post
  };
  InFlight post(const ReshardPlan& plan, int b, bool to_chunks);
  void post_regroup(int b);
  void complete(InFlight& f);
  std::vector<ReshardTensor> tensors(int b, bool to_chunks);
  void pack_replicated(int b);
  float* chunk() { return chunks_.aligned ? grads_ : chunks_.buffer.data(); }

  const ParamLayout& layout_;
  Backend& be_;
  PhaseClock& clock_;
  Pacer& pacer_;
  Comm& tp_;
  Comm* slot_;
  int tp_index_, n2_;
  bool uniform_;
  float* grads_ = nullptr;
  // Bytes this rank sent in the last sync: in all, in the all-reduces, in the regroup.
  struct Sent {
    double total = 0, allreduce = 0, regroup = 0;
  } sent_;
  // Chunk mode only.
  struct Chunks {
    std::unique_ptr<ReshardPlan> to, from;  // segments: heads, mlp, vocab (+ replicated copies)
    std::vector<int> units;                 // per sharded dimension, this rank's chunk units
    std::vector<Bucket> buckets;            // in the order the backward finishes them
    std::vector<std::size_t> offset;        // per tensor, within the chunk buffer
    // The replica already holds chunk i on rank i (its degree is N2 with the even split): the chunk
    // buffer is the gradient arena itself, and there is no regroup and no copying back.
    bool aligned = false;
    Arena buffer;  // core ranks of other replicas: chunk i of every tensor, in arena order (backend memory)
    std::vector<InFlight> regroup, reverse;  // per bucket
  } chunks_;
};

}  // namespace ntp
