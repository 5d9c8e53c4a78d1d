#pragma once
// A decoder-only model on one rank of a tensor-parallel group: what every family shares (the
// parameter and gradient arenas laid out by ParamLayout, the TP group, the token buffers, the
// clocks) and the step interface the trainer drives. GptModel and LlamaModel implement the
// forward and backward; make_model (make_model.hpp) picks one by ModelConfig::family.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "arena.hpp"
#include "backend.hpp"
#include "backward_observer.hpp"
#include "comm.hpp"
#include "pacer.hpp"
#include "param_layout.hpp"
#include "phase_clock.hpp"
#include "tp_layers.hpp"

namespace ntp {

class Model {
 public:
  virtual ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ParamLayout& layout() const { return layout_; }
  const ModelConfig& config() const { return m_; }
  Backend& backend() { return be_; }
  float* params() { return mem_.params.data(); }
  float* grads() { return mem_.grads.data(); }
  float* param(int tensor) { return mem_.params.data() + layout_.slot(tensor).offset; }
  float* grad(int tensor) { return mem_.grads.data() + layout_.slot(tensor).offset; }
  std::size_t param_count() const { return layout_.total(); }
  int seq() const { return T_; }
  int max_batch() const { return max_batch_; }
  const StageRange& stage() const { return layout_.stage(); }

  // Pipeline parallelism. Up to in_flight micro-batches are between their forward and their
  // backward at once (1F1B); each has its own activations. use_micro_batch(k) selects slot k for
  // the next forward, or for the backward of the micro-batch whose forward ran in slot k.
  int in_flight() const { return slots_.in_flight; }
  void use_micro_batch(int slot);
  // A stage after the first: the forward's input (B*T*d floats of the residual stream), written by
  // the receive before forward().
  float* stage_input() { return encoded_; }
  // A stage before the last: the forward's output, to send after forward().
  virtual const float* stage_output() const = 0;
  // The gradient at the stage's boundary: before backward() on a stage before the last, that of
  // stage_output() (received); after backward() on a stage after the first, that of stage_input()
  // (to send).
  float* boundary_grad() { return dres_; }

  // Layout-independent initial weights (see init_tensor_units).
  void init_params(unsigned long long seed);
  void zero_grads() { mem_.grads.zero(); }

  // Forward over B sequences of T tokens (host arrays, B*T each; the first stage reads the tokens,
  // the last the targets). Returns the sum of the B*T token losses on the last stage (every rank
  // of the TP group returns the same value), 0 on the others.
  virtual double forward(const int* tokens, const int* targets, int B) = 0;
  // Backward of the last forward, each token's loss weighted by dloss (1 / tokens of the global
  // batch). Accumulates into grads(); `observer`, when given, hears as each layer's are final.
  virtual void backward(float dloss, BackwardObserver* observer = nullptr) = 0;
  // FLOPs of this rank's share of one forward pass over B sequences (backward: twice this).
  virtual double local_forward_flops(int B) const = 0;
  // A mixture of experts' routing over the forward passes since the last call, summed over this
  // stage's layers: the load-balancing loss weighted by router_aux_coef (in the gradient, not in
  // the value forward returns), the assignments kept and dropped by capacity, each expert's kept
  // ones, and the busiest expert of any one layer's pass against an even share of that pass's
  // assignments (1: balanced).
  struct RouterStats {
    double aux_loss = 0;
    long kept = 0, dropped = 0;
    std::vector<long> tokens_per_expert;
    double load_max = 0;
    // Every slot's choice (its expert, and whether capacity kept it), hashed in order: two passes
    // routed alike have the same digest, where counts alone miss a capacity cut that kept another
    // token, or two tokens that swapped experts.
    std::uint64_t choices = 0;
  };
  RouterStats take_router_stats() { return std::exchange(routed_, RouterStats{}); }

  void set_clock(PhaseClock* clock) { timing_.clock = clock; }
  void set_pacer(Pacer* pacer) { timing_.pacer = pacer; }
  // The TP group (rebuilt at every membership change); its size must stay the layout's degree.
  void set_tp_comm(Comm& tp);

 protected:
  // tp: the replica's TP group (size == layout degree); max_batch, seq: the largest B and the T;
  // stage: the layers this rank holds; in_flight: micro-batches whose activations are kept at once.
  Model(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm, int max_batch,
        int seq, const StageRange& stage, int in_flight);

  // Activation views: request(&p, n) for each one a micro-batch keeps until its backward (one copy
  // per slot), request_scratch(&p, n) for working memory (one copy), then carve() allocates one
  // arena and points them in (at slot 0).
  void request(float*& p, std::size_t n) { want_.push_back({&p, (n + 15) / 16 * 16, true}); }
  void request_scratch(float*& p, std::size_t n) { want_.push_back({&p, (n + 15) / 16 * 16, false}); }
  void carve();
  // The stage's input activations (encoded_: the embedding's output on the first stage, received
  // elsewhere), its output (the last layer's residual stream), and the residual-stream gradient.
  float *encoded_ = nullptr, *dres_ = nullptr;
  // Checks B, uploads the tokens and targets; returns the TP context of the step's phase.
  TpContext begin_forward(const int* tokens, const int* targets, int B);
  TpContext begin_backward();
  int current_slot() const { return slots_.current; }
  RouterStats routed_;  // take_router_stats's, added to by each forward of a mixture of experts
  // Sum of the B*T token losses in `losses` (backend memory).
  double sum_losses(const float* losses, int BT);
  // Paced timing: the compute of `phase` since its clock read `since` is charged `flops`.
  void pace_compute(Phase phase, double since, double flops) {
    if (timing_.pacer) timing_.pacer->pace_compute(timing_.clock->elapsed(phase) - since, flops);
  }

  Backend& be_;
  ModelConfig m_;
  ParamLayout layout_;
  Comm* tp_;
  int max_batch_, T_;
  // The parameters, their gradients, and the activations (carve()), in backend memory.
  struct Memory {
    Arena params, grads, activations;
  } mem_;
  // The selected micro-batch's token ids and targets, and the vocabulary's global->local row
  // table, in backend memory.
  struct Ids {
    int *tokens = nullptr, *targets = nullptr, *vocab_rows = nullptr;
  } ids_;
  int B_ = 0;  // batch of the selected micro-batch's forward
  // Where phases are timed (set_clock; the model's own clock if none) and paced (set_pacer).
  struct Timing {
    PhaseClock* clock = nullptr;
    PhaseClock own_clock;
    Pacer* pacer = nullptr;
  } timing_;

 private:
  struct View {
    float** p;
    std::size_t n;
    bool per_slot;
  };
  std::vector<View> want_;
  // The micro-batches in flight (1F1B keeps up to `in_flight` between their forward and backward):
  // each has its own copy of the per-slot activations (one `stride` of the arena after the scratch)
  // and of the token ids and targets; use_micro_batch points the views at the one `current`.
  struct Slots {
    std::vector<std::pair<float**, std::size_t>> views;  // per-slot views: offset in slot 0
    std::size_t stride = 0;
    int in_flight = 1, current = 0;
    int *tokens = nullptr, *targets = nullptr;  // in_flight x max_batch x T each
    std::vector<int> batch;                     // each slot's micro-batch size (B_ while selected)
  } slots_;
  std::vector<float> host_losses_;
};

}  // namespace ntp
