#include "gpt_model.hpp"

#include <stdexcept>

namespace ntp {

GptModel::GptModel(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm,
                   int max_batch, int seq, const StageRange& stage, int in_flight)
    : Model(backend, m, tp, tp_rank, tp_comm, max_batch, seq, stage, in_flight) {
  local_heads_ = layout_.local(ShardDim::Heads);
  local_mlp_ = layout_.local(ShardDim::Mlp);
  local_vocab_ = layout_.local(ShardDim::Vocab);

  const std::size_t BT = std::size_t(max_batch) * seq, d = m.hidden, hs = m.head_size();
  const std::size_t dl = local_heads_ * hs, fl = local_mlp_, Vl = local_vocab_;
  const std::size_t att = std::size_t(max_batch) * local_heads_ * seq * seq;
  auto add = [&](float*& p, std::size_t n) { request(p, n); };
  auto scratch = [&](float*& p, std::size_t n) { request_scratch(p, n); };
  const std::size_t head = stage.last_stage ? 1 : 0;  // the final norm, head and loss: last stage only
  add(encoded_, BT * d);
  acts_.resize(stage.end - stage.first);
  for (auto& a : acts_) {
    add(a.ln1, BT * d), add(a.ln1_mean, BT), add(a.ln1_rstd, BT), add(a.qkv, BT * 3 * dl), add(a.atty, BT * dl);
    add(a.att, att), add(a.attproj, BT * d), add(a.res2, BT * d), add(a.ln2, BT * d), add(a.ln2_mean, BT);
    add(a.ln2_rstd, BT), add(a.fch, BT * fl), add(a.fch_gelu, BT * fl), add(a.fcproj, BT * d), add(a.res3, BT * d);
  }
  add(lnf_, head * BT * d), add(lnf_mean_, head * BT), add(lnf_rstd_, head * BT), add(logits_, head * BT * Vl);
  add(ce_max_, head * BT), add(ce_sums_, head * 2 * BT), add(losses_, head * BT);
  scratch(dres_, BT * d), scratch(dln_, BT * d), scratch(dqkv_, BT * 3 * dl), scratch(datty_, BT * dl);
  scratch(dfch_, BT * fl), scratch(dfch_gelu_, BT * fl), scratch(att_scratch_, att);
  carve();
}

double GptModel::local_forward_flops(int B) const {
  const double BT = double(B) * T_, d = m_.hidden, hs = m_.head_size();
  const double dl = local_heads_ * hs, fl = local_mlp_, Vl = local_vocab_;
  const double per_layer = 2 * BT * (d * 3 * dl + dl * d + d * fl + fl * d) + 4.0 * B * local_heads_ * double(T_) * T_ * hs;
  return double(stage().end - stage().first) * per_layer + (stage().last_stage ? 2 * BT * d * Vl : 0.0);
}

double GptModel::forward(const int* tokens, const int* targets, int B) {
  const TpContext tp = begin_forward(tokens, targets, B);
  PhaseScope phase(*timing_.clock, Phase::Forward);
  const double compute0 = timing_.clock->elapsed(Phase::Forward);
  const int T = T_, BT = B * T, d = m_.hidden, hs = m_.head_size(), Hl = local_heads_;
  const int dl = Hl * hs, fl = local_mlp_, Vl = local_vocab_;

  const StageRange& st = stage();
  if (st.first_stage)
    vocab_parallel_embedding_forward(tp, encoded_, ids_.tokens, param(kWte), ids_.vocab_rows, param(kWpe), B, T, d);
  for (int l = st.first; l < st.end; ++l) {
    auto& a = acts_[l - st.first];
    auto P = [&](LayerTensor t) { return param(layer_tensor(l, t)); };
    const float* x = layer_input(l);
    be_.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, P(kLn1W), P(kLn1B), BT, d);
    column_parallel_forward(tp, a.qkv, a.ln1, P(kQkvW), P(kQkvB), BT, d, 3 * dl);
    be_.attention_forward(a.atty, a.att, a.qkv, B, T, Hl, hs);
    row_parallel_forward(tp, a.attproj, a.atty, P(kAttnProjW), P(kAttnProjB), BT, dl, d);
    be_.residual_forward(a.res2, x, a.attproj, long(BT) * d);
    be_.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, P(kLn2W), P(kLn2B), BT, d);
    column_parallel_forward(tp, a.fch, a.ln2, P(kFcW), P(kFcB), BT, d, fl);
    be_.gelu_forward(a.fch_gelu, a.fch, long(BT) * fl);
    row_parallel_forward(tp, a.fcproj, a.fch_gelu, P(kFcProjW), P(kFcProjB), BT, fl, d);
    be_.residual_forward(a.res3, a.res2, a.fcproj, long(BT) * d);
  }
  if (!st.last_stage) {
    pace_compute(Phase::Forward, compute0, local_forward_flops(B));
    return 0.0;
  }
  const float* top = layer_input(m_.layers);
  be_.layernorm_forward(lnf_, lnf_mean_, lnf_rstd_, top, param(lnf_weight(m_)), param(lnf_bias(m_)), BT, d);
  // The LM head is tied to the embedding: column-parallel over the vocabulary.
  column_parallel_forward(tp, logits_, lnf_, param(kWte), nullptr, BT, d, Vl);
  vocab_parallel_cross_entropy_forward(tp, losses_, ce_max_, ce_sums_, logits_, ids_.targets, ids_.vocab_rows, BT, Vl);

  const double sum = sum_losses(losses_, BT);
  pace_compute(Phase::Forward, compute0, local_forward_flops(B));
  return sum;
}

void GptModel::backward(float dloss, BackwardObserver* observer) {
  const TpContext tp = begin_backward();
  PhaseScope phase(*timing_.clock, Phase::Backward);
  const double compute0 = timing_.clock->elapsed(Phase::Backward);
  const int B = B_, T = T_, BT = B * T, d = m_.hidden, hs = m_.head_size(), Hl = local_heads_;
  const int dl = Hl * hs, fl = local_mlp_, Vl = local_vocab_;

  const StageRange& st = stage();
  if (st.last_stage) {
    vocab_parallel_cross_entropy_backward(tp, logits_, ce_max_, ce_sums_, ids_.targets, ids_.vocab_rows, dloss, BT, Vl);
    column_parallel_backward(tp, dln_, grad(kWte), nullptr, logits_, lnf_, param(kWte), BT, d, Vl);
    be_.zero(dres_, std::size_t(BT) * d);
    be_.layernorm_backward(dres_, grad(lnf_weight(m_)), grad(lnf_bias(m_)), dln_, layer_input(m_.layers),
                           param(lnf_weight(m_)), lnf_mean_, lnf_rstd_, BT, d);
  }  // else dres_ holds the received gradient of the stage's output

  // dres_ carries the residual-stream gradient down the layers; LayerNorm backward adds into it.
  for (int l = st.end - 1; l >= st.first; --l) {
    auto& a = acts_[l - st.first];
    auto P = [&](LayerTensor t) { return param(layer_tensor(l, t)); };
    auto G = [&](LayerTensor t) { return grad(layer_tensor(l, t)); };
    const float* x = layer_input(l);
    row_parallel_backward(tp, dfch_gelu_, G(kFcProjW), G(kFcProjB), dres_, a.fch_gelu, P(kFcProjW), BT, fl, d);
    be_.zero(dfch_, std::size_t(BT) * fl);
    be_.gelu_backward(dfch_, a.fch, dfch_gelu_, long(BT) * fl);
    column_parallel_backward(tp, dln_, G(kFcW), G(kFcB), dfch_, a.ln2, P(kFcW), BT, d, fl);
    be_.layernorm_backward(dres_, G(kLn2W), G(kLn2B), dln_, a.res2, P(kLn2W), a.ln2_mean, a.ln2_rstd, BT, d);
    row_parallel_backward(tp, datty_, G(kAttnProjW), G(kAttnProjB), dres_, a.atty, P(kAttnProjW), BT, dl, d);
    be_.zero(dqkv_, std::size_t(BT) * 3 * dl);
    be_.attention_backward(dqkv_, att_scratch_, datty_, a.qkv, a.att, B, T, Hl, hs);
    column_parallel_backward(tp, dln_, G(kQkvW), G(kQkvB), dqkv_, a.ln1, P(kQkvW), BT, d, 3 * dl);
    be_.layernorm_backward(dres_, G(kLn1W), G(kLn1B), dln_, x, P(kLn1W), a.ln1_mean, a.ln1_rstd, BT, d);
    if (observer) observer->layer_gradients_ready(l);
  }
  if (st.first_stage)
    vocab_parallel_embedding_backward(tp, grad(kWte), grad(kWpe), dres_, ids_.tokens, ids_.vocab_rows, B, T, d);
  pace_compute(Phase::Backward, compute0, 2 * local_forward_flops(B));
}

double GptModel::tp_bytes_per_step(const ModelConfig& m, int B, int T) {
  const double act = double(B) * T * m.hidden * sizeof(float);
  // forward: embedding + 2 per layer; backward: LM head + 2 per layer; plus the CE statistics.
  return act * (2.0 + 4.0 * m.layers) + double(B) * T * 3 * sizeof(float);
}

}  // namespace ntp
