#pragma once
// GPT-2 forward and backward on one rank of a tensor-parallel group (Megatron):
//   column-parallel c_attn (by head) and c_fc (by column): f = identity forward, all-reduce backward;
//   row-parallel attn.c_proj and mlp.c_proj: g = all-reduce forward, identity backward, bias added
//   once after the reduction; vocabulary-parallel embedding, tied LM head and cross-entropy.
// Two all-reduces per layer forward and two backward. At TP 1 this is the plain model.
#include <cstddef>
#include <vector>

#include "arena.hpp"
#include "backend.hpp"
#include "backward_observer.hpp"
#include "comm.hpp"
#include "param_layout.hpp"
#include "pacer.hpp"
#include "phase_clock.hpp"

namespace ntp {

class GptModel {
 public:
  // tp: the replica's TP group (size == layout degree); max_batch, seq: the largest B and the T.
  GptModel(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm, int max_batch,
           int seq);

  const ParamLayout& layout() const { return layout_; }
  Backend& backend() { return be_; }
  float* params() { return params_.data(); }
  float* grads() { return grads_.data(); }
  float* param(int tensor) { return params_.data() + layout_.slot(tensor).offset; }
  float* grad(int tensor) { return grads_.data() + layout_.slot(tensor).offset; }
  std::size_t param_count() const { return layout_.total(); }
  int seq() const { return T_; }
  int max_batch() const { return max_batch_; }

  // Layout-independent initial weights (see init_tensor_units).
  void init_params(unsigned long long seed);
  void zero_grads() { grads_.zero(); }

  // Forward over B sequences of T tokens (host arrays, B*T each). Returns the sum of the B*T
  // token losses; every rank of the TP group returns the same value.
  double forward(const int* tokens, const int* targets, int B);
  // Backward of the last forward, each token's loss weighted by dloss (1 / tokens of the global
  // batch). Accumulates into grads(); `observer`, when given, hears as each layer's are final.
  void backward(float dloss, BackwardObserver* observer = nullptr);

  void set_clock(PhaseClock* clock) { clock_ = clock; }
  void set_pacer(Pacer* pacer) { pacer_ = pacer; }
  // The TP group (rebuilt at every membership change); its size must stay the layout's degree.
  void set_tp_comm(Comm& tp);
  // FLOPs of this rank's share of one forward pass over B sequences (backward: twice this).
  double local_forward_flops(int B) const;
  // Bytes one rank all-reduces over its TP group in one step of B sequences.
  static double tp_bytes_per_step(const ModelConfig& m, int B, int T);

 private:
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu,
        *fcproj, *res3;
  };
  const float* layer_input(int l) const { return l == 0 ? encoded_ : acts_[l - 1].res3; }

  Backend& be_;
  ModelConfig m_;
  ParamLayout layout_;
  Comm* tp_;
  int max_batch_, T_;
  int local_heads_, local_mlp_, local_vocab_;
  Arena params_, grads_, act_arena_;
  // Activations (views into act_arena_).
  float *encoded_, *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *ce_max_, *ce_sums_, *losses_;
  std::vector<LayerActs> acts_;
  // Backward scratch.
  float *dres_, *dln_, *dqkv_, *datty_, *dfch_, *dfch_gelu_, *att_scratch_;
  // Token ids and the vocabulary's global->local row table, in backend memory.
  int *tokens_ = nullptr, *targets_ = nullptr, *vocab_rows_ = nullptr;
  int B_ = 0;  // batch of the last forward
  std::vector<float> host_losses_;
  PhaseClock* clock_ = nullptr;
  PhaseClock own_clock_;
  Pacer* pacer_ = nullptr;

 public:
  ~GptModel();
  GptModel(const GptModel&) = delete;
  GptModel& operator=(const GptModel&) = delete;
};

}  // namespace ntp
