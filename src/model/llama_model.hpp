#pragma once
// Llama forward and backward on one rank of a tensor-parallel group (Megatron's split, as GPT-2):
//   column-parallel q_proj, k_proj, v_proj by KV group (a KV head and its query heads stay on one
//   rank), and gate_proj, up_proj by FFN column: one all-reduce of the input gradient per group of
//   projections in the backward;
//   row-parallel o_proj and down_proj: one all-reduce each in the forward, no biases;
//   RMSNorm, rotary positions applied to q and k on each rank's own heads, grouped-query attention
//   through the multi-head kernel (gqa_pack), SwiGLU;
//   vocabulary-parallel embedding (no position table), untied vocabulary-parallel LM head and
//   cross-entropy;
//   with experts (llama_moe.cpp), each layer's MLP is Mixtral's sparse block, its experts spread
//   whole over the TP group (expert parallelism in the TP group).
#include <vector>

#include "model.hpp"
#include "moe_routing.hpp"

namespace ntp {

class LlamaModel final : public Model {
 public:
  LlamaModel(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm, int max_batch,
             int seq, const StageRange& stage, int in_flight);

  double forward(const int* tokens, const int* targets, int B) override;
  void backward(float dloss, BackwardObserver* observer = nullptr) override;
  double local_forward_flops(int B) const override;
  const float* stage_output() const override { return layer_input(stage().end); }

 private:
  // What the backward needs of each layer.
  struct LayerActs {
    float *ln1, *rstd1, *qkv, *atty, *att, *res2, *ln2, *rstd2, *gate, *up, *h, *res3;
    float *logits, *xs, *ys;  // MoE: the router's logits, this rank's experts' input and output rows
  };
  // Layer l's input (l in [first, end] of the stage; acts_ holds the stage's layers only).
  const float* layer_input(int l) const { return l == stage().first ? encoded_ : acts_[l - 1 - stage().first].res3; }
  LayerActs& acts(int l) { return acts_[l - stage().first]; }
  void attention_forward(const TpContext& tp, int l, int B);
  void mlp_forward(const TpContext& tp, int l, int B);
  void mlp_backward(const TpContext& tp, int l, int B);
  void attention_backward(const TpContext& tp, int l, int B);
  // The sparse MLP (llama_moe.cpp): the same contract as mlp_forward / mlp_backward.
  void moe_forward(const TpContext& tp, int l, int B);
  void moe_backward(const TpContext& tp, int l, int B);
  void note_routing(const MoeRouting& r, long BT);  // into routed_
  // Calls f(i, e, first_row, rows) for this rank's experts, i its local index, e its global id,
  // in the routing's row order.
  template <class F>
  void for_local_experts(const MoeRouting& r, F&& f) const;

  int local_groups_, local_heads_, local_mlp_, local_vocab_;
  float *lnf_, *rstdf_, *logits_, *ce_max_, *ce_sums_, *losses_;
  std::vector<LayerActs> acts_;
  // Scratch shared by the layers: the projections before packing (forward) or after unpacking
  // (backward), a row-parallel output, and the backward's gradients.
  float *q_, *k_, *v_, *proj_, *dln_, *dqkv_, *datty_, *dh_, *dgate_, *dup_, *att_scratch_;
  // MoE: each in-flight micro-batch's routing of each layer (host memory, [slot][layer - first]),
  // the experts this rank holds (global ids, ascending), the backward's scratch (the rows' and the
  // router's gradients; `reduce`: the input gradient and the routing weights' gradient, summed
  // over the TP group in one all-reduce), and the backward's loss weight.
  std::vector<std::vector<MoeRouting>> routing_;
  std::vector<int> experts_;
  float *dys_ = nullptr, *dxs_ = nullptr, *dlogits_ = nullptr, *moe_reduce_ = nullptr;
  float dloss_ = 0;
};

}  // namespace ntp
