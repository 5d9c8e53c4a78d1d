#pragma once
// GPT-2 forward and backward on one rank of a tensor-parallel group (Megatron):
//   column-parallel c_attn (by head) and c_fc (by column): f = identity forward, all-reduce backward;
//   row-parallel attn.c_proj and mlp.c_proj: g = all-reduce forward, identity backward, bias added
//   once after the reduction; vocabulary-parallel embedding, tied LM head and cross-entropy.
// Two all-reduces per layer forward and two backward. At TP 1 this is the plain model.
#include <vector>

#include "model.hpp"

namespace ntp {

class GptModel final : public Model {
 public:
  GptModel(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm, int max_batch,
           int seq, const StageRange& stage, int in_flight);

  double forward(const int* tokens, const int* targets, int B) override;
  void backward(float dloss, BackwardObserver* observer = nullptr) override;
  double local_forward_flops(int B) const override;
  const float* stage_output() const override { return layer_input(stage().end); }
  // Bytes one rank all-reduces over its TP group in one step of B sequences.
  static double tp_bytes_per_step(const ModelConfig& m, int B, int T);

 private:
  struct LayerActs {
    float *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *attproj, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu,
        *fcproj, *res3;
  };
  // Layer l's input (l in [first, end] of the stage; acts_ holds the stage's layers only).
  const float* layer_input(int l) const { return l == stage().first ? encoded_ : acts_[l - 1 - stage().first].res3; }

  int local_heads_, local_mlp_, local_vocab_;
  // Activations (views into the activation arena).
  float *lnf_, *lnf_mean_, *lnf_rstd_, *logits_, *ce_max_, *ce_sums_, *losses_;
  std::vector<LayerActs> acts_;
  // Backward scratch.
  float *dln_, *dqkv_, *datty_, *dfch_, *dfch_gelu_, *att_scratch_;
};

}  // namespace ntp
