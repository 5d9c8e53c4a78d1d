#include "llama_model.hpp"

namespace ntp {

LlamaModel::LlamaModel(Backend& backend, const ModelConfig& m, const TpLayout& tp, int tp_rank, Comm& tp_comm,
                       int max_batch, int seq, const StageRange& stage, int in_flight)
    : Model(backend, m, tp, tp_rank, tp_comm, max_batch, seq, stage, in_flight) {
  local_groups_ = layout_.local(ShardDim::Heads);
  local_heads_ = local_groups_ * m.q_per_kv();
  local_mlp_ = layout_.local(ShardDim::Mlp);
  local_vocab_ = layout_.local(ShardDim::Vocab);

  const std::size_t BT = std::size_t(max_batch) * seq, d = m.hidden, hs = m.head_size();
  const std::size_t ql = local_heads_ * hs, kvl = local_groups_ * hs, Vl = local_vocab_;
  // The MLP's hidden rows: this rank's columns of every token, or with experts at most every
  // token's k slots (when this rank's experts take them all).
  const std::size_t moe = m.moe() ? 1 : 0, E = m.experts, slots = BT * m.top_k * moe;
  const std::size_t fl = m.moe() ? std::size_t(m.top_k) * m.mlp() : local_mlp_;
  if (m.moe()) {
    experts_ = layout_.tp().map(ShardDim::Experts).units_of(tp_rank);
    routing_.assign(in_flight, std::vector<MoeRouting>(stage.end - stage.first));
  }
  const std::size_t att = std::size_t(max_batch) * local_heads_ * seq * seq;
  const std::size_t head = stage.last_stage ? 1 : 0;  // the final norm, head and loss: last stage only
  request(encoded_, BT * d);
  acts_.resize(stage.end - stage.first);
  for (auto& a : acts_) {
    request(a.ln1, BT * d), request(a.rstd1, BT), request(a.qkv, BT * 3 * ql), request(a.atty, BT * ql);
    request(a.att, att), request(a.res2, BT * d), request(a.ln2, BT * d), request(a.rstd2, BT);
    request(a.gate, BT * fl), request(a.up, BT * fl), request(a.h, BT * fl), request(a.res3, BT * d);
    request(a.logits, BT * E * moe), request(a.xs, slots * d), request(a.ys, slots * d);
  }
  request(lnf_, head * BT * d), request(rstdf_, head * BT), request(logits_, head * BT * Vl);
  request(ce_max_, head * BT), request(ce_sums_, head * 2 * BT), request(losses_, head * BT);
  request_scratch(q_, BT * ql), request_scratch(k_, BT * kvl), request_scratch(v_, BT * kvl);
  request_scratch(proj_, BT * d), request_scratch(dres_, BT * d), request_scratch(dln_, BT * d);
  request_scratch(dqkv_, BT * 3 * ql), request_scratch(datty_, BT * ql), request_scratch(dh_, BT * fl);
  request_scratch(dgate_, BT * fl), request_scratch(dup_, BT * fl), request_scratch(att_scratch_, att);
  request_scratch(dys_, slots * d), request_scratch(dxs_, slots * d), request_scratch(dlogits_, BT * E * moe);
  request_scratch(moe_reduce_, (BT * d + BT * m.top_k) * moe);
  carve();
}

double LlamaModel::local_forward_flops(int B) const {
  const double BT = double(B) * T_, d = m_.hidden, hs = m_.head_size();
  const double ql = local_heads_ * hs, kvl = local_groups_ * hs, fl = local_mlp_, Vl = local_vocab_;
  // A MoE layer: the router on every rank, and this rank's experts' share of the k slots of each
  // token at an even routing (the expected share; the step's actual rows vary with the router).
  const double mlp = m_.moe() ? d * m_.experts + double(m_.top_k) * experts_.size() / m_.experts * 3 * d * m_.mlp()
                              : 3 * d * fl;
  const double per_layer =
      2 * BT * (d * ql + 2 * d * kvl + ql * d + mlp) + 4.0 * B * local_heads_ * double(T_) * T_ * hs;
  return double(stage().end - stage().first) * per_layer + (stage().last_stage ? 2 * BT * d * Vl : 0.0);
}

void LlamaModel::attention_forward(const TpContext& tp, int l, int B) {
  auto& a = acts(l);
  auto P = [&](LlamaTensor t) { return param(llama_tensor(m_, l, t)); };
  const int T = T_, BT = B * T, d = m_.hidden, hs = m_.head_size(), Hl = local_heads_, Gl = local_groups_;
  be_.rmsnorm_forward(a.ln1, a.rstd1, layer_input(l), P(kAttnNorm), BT, d);
  column_parallel_forward(tp, q_, a.ln1, P(kQ), nullptr, BT, d, Hl * hs);
  column_parallel_forward(tp, k_, a.ln1, P(kK), nullptr, BT, d, Gl * hs);
  column_parallel_forward(tp, v_, a.ln1, P(kV), nullptr, BT, d, Gl * hs);
  be_.rope_forward(q_, B, T, Hl, hs, m_.rope_theta);
  be_.rope_forward(k_, B, T, Gl, hs, m_.rope_theta);
  be_.gqa_pack_forward(a.qkv, q_, k_, v_, BT, Hl, Gl, hs);
  be_.attention_forward(a.atty, a.att, a.qkv, B, T, Hl, hs);
  row_parallel_forward(tp, proj_, a.atty, P(kO), nullptr, BT, Hl * hs, d);
  be_.residual_forward(a.res2, layer_input(l), proj_, long(BT) * d);
}

void LlamaModel::mlp_forward(const TpContext& tp, int l, int B) {
  auto& a = acts(l);
  auto P = [&](LlamaTensor t) { return param(llama_tensor(m_, l, t)); };
  const int BT = B * T_, d = m_.hidden, fl = local_mlp_;
  be_.rmsnorm_forward(a.ln2, a.rstd2, a.res2, P(kMlpNorm), BT, d);
  column_parallel_forward(tp, a.gate, a.ln2, P(kGate), nullptr, BT, d, fl);
  column_parallel_forward(tp, a.up, a.ln2, P(kUp), nullptr, BT, d, fl);
  be_.swiglu_forward(a.h, a.gate, a.up, long(BT) * fl);
  row_parallel_forward(tp, proj_, a.h, P(kDown), nullptr, BT, fl, d);
  be_.residual_forward(a.res3, a.res2, proj_, long(BT) * d);
}

double LlamaModel::forward(const int* tokens, const int* targets, int B) {
  const TpContext tp = begin_forward(tokens, targets, B);
  PhaseScope phase(*timing_.clock, Phase::Forward);
  const double compute0 = timing_.clock->elapsed(Phase::Forward);
  const int BT = B * T_, d = m_.hidden;
  const StageRange& st = stage();
  if (st.first_stage)
    vocab_parallel_embedding_forward(tp, encoded_, ids_.tokens, param(kEmbedTokens), ids_.vocab_rows, nullptr, B, T_, d);
  for (int l = st.first; l < st.end; ++l) {
    attention_forward(tp, l, B);
    if (m_.moe())
      moe_forward(tp, l, B);
    else
      mlp_forward(tp, l, B);
  }
  if (!st.last_stage) {
    pace_compute(Phase::Forward, compute0, local_forward_flops(B));
    return 0.0;
  }
  be_.rmsnorm_forward(lnf_, rstdf_, layer_input(m_.layers), param(llama_norm(m_)), BT, d);
  column_parallel_forward(tp, logits_, lnf_, param(llama_lm_head(m_)), nullptr, BT, d, local_vocab_);
  vocab_parallel_cross_entropy_forward(tp, losses_, ce_max_, ce_sums_, logits_, ids_.targets, ids_.vocab_rows, BT,
                                       local_vocab_);
  const double sum = sum_losses(losses_, BT);
  pace_compute(Phase::Forward, compute0, local_forward_flops(B));
  return sum;
}

// dres_ holds the gradient of res3 on entry and of res2 on exit (RMSNorm's backward adds into it).
void LlamaModel::mlp_backward(const TpContext& tp, int l, int B) {
  auto& a = acts(l);
  auto P = [&](LlamaTensor t) { return param(llama_tensor(m_, l, t)); };
  auto G = [&](LlamaTensor t) { return grad(llama_tensor(m_, l, t)); };
  const int BT = B * T_, d = m_.hidden, fl = local_mlp_;
  row_parallel_backward(tp, dh_, G(kDown), nullptr, dres_, a.h, P(kDown), BT, fl, d);
  be_.zero(dgate_, std::size_t(BT) * fl);
  be_.zero(dup_, std::size_t(BT) * fl);
  be_.swiglu_backward(dgate_, dup_, a.gate, a.up, dh_, long(BT) * fl);
  column_parallel_backward(tp, dln_, a.ln2, BT, d,
                           {{dgate_, P(kGate), G(kGate), fl}, {dup_, P(kUp), G(kUp), fl}});
  be_.rmsnorm_backward(dres_, G(kMlpNorm), dln_, a.res2, P(kMlpNorm), a.rstd2, BT, d);
}

// dres_: the gradient of res2 on entry, of the layer's input on exit.
void LlamaModel::attention_backward(const TpContext& tp, int l, int B) {
  auto& a = acts(l);
  auto P = [&](LlamaTensor t) { return param(llama_tensor(m_, l, t)); };
  auto G = [&](LlamaTensor t) { return grad(llama_tensor(m_, l, t)); };
  const int T = T_, BT = B * T, d = m_.hidden, hs = m_.head_size(), Hl = local_heads_, Gl = local_groups_;
  row_parallel_backward(tp, datty_, G(kO), nullptr, dres_, a.atty, P(kO), BT, Hl * hs, d);
  be_.zero(dqkv_, std::size_t(BT) * 3 * Hl * hs);
  be_.attention_backward(dqkv_, att_scratch_, datty_, a.qkv, a.att, B, T, Hl, hs);
  be_.zero(q_, std::size_t(BT) * Hl * hs);
  be_.zero(k_, std::size_t(BT) * Gl * hs);
  be_.zero(v_, std::size_t(BT) * Gl * hs);
  be_.gqa_pack_backward(q_, k_, v_, dqkv_, BT, Hl, Gl, hs);
  be_.rope_backward(q_, B, T, Hl, hs, m_.rope_theta);
  be_.rope_backward(k_, B, T, Gl, hs, m_.rope_theta);
  column_parallel_backward(tp, dln_, a.ln1, BT, d,
                           {{q_, P(kQ), G(kQ), Hl * hs}, {k_, P(kK), G(kK), Gl * hs}, {v_, P(kV), G(kV), Gl * hs}});
  be_.rmsnorm_backward(dres_, G(kAttnNorm), dln_, layer_input(l), P(kAttnNorm), a.rstd1, BT, d);
}

void LlamaModel::backward(float dloss, BackwardObserver* observer) {
  const TpContext tp = begin_backward();
  PhaseScope phase(*timing_.clock, Phase::Backward);
  const double compute0 = timing_.clock->elapsed(Phase::Backward);
  const int B = B_, BT = B * T_, d = m_.hidden, Vl = local_vocab_;
  const int head = llama_lm_head(m_), norm = llama_norm(m_);
  const StageRange& st = stage();
  if (st.last_stage) {
    vocab_parallel_cross_entropy_backward(tp, logits_, ce_max_, ce_sums_, ids_.targets, ids_.vocab_rows, dloss, BT, Vl);
    column_parallel_backward(tp, dln_, grad(head), nullptr, logits_, lnf_, param(head), BT, d, Vl);
    be_.zero(dres_, std::size_t(BT) * d);
    be_.rmsnorm_backward(dres_, grad(norm), dln_, layer_input(m_.layers), param(norm), rstdf_, BT, d);
  }  // else dres_ holds the received gradient of the stage's output
  dloss_ = dloss;
  for (int l = st.end - 1; l >= st.first; --l) {
    if (m_.moe())
      moe_backward(tp, l, B);
    else
      mlp_backward(tp, l, B);
    attention_backward(tp, l, B);
    if (observer) observer->layer_gradients_ready(l);
  }
  if (st.first_stage)
    vocab_parallel_embedding_backward(tp, grad(kEmbedTokens), nullptr, dres_, ids_.tokens, ids_.vocab_rows, B, T_, d);
  pace_compute(Phase::Backward, compute0, 2 * local_forward_flops(B));
}

}  // namespace ntp
