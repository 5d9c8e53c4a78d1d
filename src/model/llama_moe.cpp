// Llama's sparse MLP (Mixtral's block) on one rank of a TP group, its experts spread whole over
// the group (expert parallelism = the TP group; ShardDim::Experts).
//
// Attention is tensor-parallel without sequence parallelism, so every rank of the group holds
// every token after it: the router (replicated) runs on each rank alike, each rank runs its own
// experts' rows, and their weighted outputs meet in one all-reduce, as a row-parallel layer's do
// (Megatron's all-gather token dispatcher does the same exchange). Tokens thus never travel to an
// expert: they are where it is. The backward's input gradient and the routing weights' gradient
// (each slot's, computed where its expert lives) are summed in one all-reduce; the router's
// backward then runs on every rank alike. Any placement of the experts works, even or not: a
// rank's experts are whichever ShardDim::Experts gives it (ntp's layouts after a failure).
#include <algorithm>
#include <cmath>

#include "llama_model.hpp"
#include "splitmix64.hpp"

namespace ntp {

template <class F>
void LlamaModel::for_local_experts(const MoeRouting& r, F&& f) const {
  for (int i = 0; i < static_cast<int>(experts_.size()); ++i) {
    const int e = experts_[i];
    const long rows = r.tokens_per_expert[e];
    if (rows > 0) f(i, e, r.first_row[i], rows);
  }
}

void LlamaModel::note_routing(const MoeRouting& r, long BT) {
  routed_.aux_loss += double(m_.router_aux_coef) * r.aux_loss;
  routed_.dropped += r.dropped;
  routed_.tokens_per_expert.resize(m_.experts, 0);
  const double even = double(BT) * m_.top_k / m_.experts;
  for (int e = 0; e < m_.experts; ++e) {
    routed_.kept += r.tokens_per_expert[e];
    routed_.tokens_per_expert[e] += r.tokens_per_expert[e];
    routed_.load_max = std::max(routed_.load_max, double(r.tokens_per_expert[e]) / even);
  }
  for (std::size_t a = 0; a < r.expert.size(); ++a)
    routed_.choices = splitmix64(routed_.choices ^ (std::uint64_t(r.expert[a]) << 1 | std::uint64_t(r.kept[a] != 0)));
}

void LlamaModel::moe_forward(const TpContext& tp, int l, int B) {
  auto& a = acts(l);
  MoeRouting& r = routing_[current_slot()][l - stage().first];
  auto P = [&](LlamaTensor t) { return param(llama_tensor(m_, l, t)); };
  const long BT = long(B) * T_;
  const int d = m_.hidden, f = m_.mlp(), E = m_.experts, k = m_.top_k;
  be_.rmsnorm_forward(a.ln2, a.rstd2, a.res2, P(kMlpNorm), int(BT), d);
  be_.matmul_forward(a.logits, a.ln2, P(kRouter), nullptr, int(BT), d, E, WeightLayout::OutIn);
  const long capacity =
      m_.capacity_factor > 0 ? long(std::ceil(double(m_.capacity_factor) * double(BT) * k / E)) : 0;
  r.expert.resize(BT * k), r.weight.resize(BT * k), r.kept.resize(BT * k), r.probs.resize(BT * E);
  r.tokens_per_expert.resize(E), r.offsets.resize(E + 1), r.row_of.resize(BT * k);
  be_.moe_router_forward(a.logits, BT, E, k, capacity, r.expert.data(), r.weight.data(), r.kept.data(),
                         r.probs.data(), r.tokens_per_expert.data(), &r.dropped, &r.aux_loss);
  be_.moe_plan(r.expert.data(), r.kept.data(), BT, E, k, r.offsets.data(), r.row_of.data());
  note_routing(r, BT);
  // This rank's rows: its experts' blocks, packed in expert order.
  std::vector<long> local_first(E, -1);
  r.first_row.assign(experts_.size(), 0);
  r.rows = 0;
  for (std::size_t i = 0; i < experts_.size(); ++i) {
    r.first_row[i] = local_first[experts_[i]] = r.rows;
    r.rows += r.tokens_per_expert[experts_[i]];
  }
  for (long s = 0; s < BT * k; ++s) {
    const long first = local_first[r.expert[s]];
    r.row_of[s] = r.row_of[s] < 0 || first < 0 ? -1 : r.row_of[s] - r.offsets[r.expert[s]] + first;
  }
  be_.moe_dispatch_forward(a.xs, a.ln2, r.row_of.data(), BT, k, d, r.rows);
  for_local_experts(r, [&](int i, int, long first, long rows) {
    const std::size_t expert = std::size_t(i) * f * d;
    be_.matmul_forward(a.gate + first * f, a.xs + first * d, P(kGate) + expert, nullptr, int(rows), d, f,
                       WeightLayout::OutIn);
    be_.matmul_forward(a.up + first * f, a.xs + first * d, P(kUp) + expert, nullptr, int(rows), d, f,
                       WeightLayout::OutIn);
  });
  be_.swiglu_forward(a.h, a.gate, a.up, r.rows * f);
  for_local_experts(r, [&](int i, int, long first, long rows) {
    be_.matmul_forward(a.ys + first * d, a.h + first * f, P(kDown) + std::size_t(i) * f * d, nullptr, int(rows), f, d,
                       WeightLayout::InOut);
  });
  be_.zero(proj_, std::size_t(BT) * d);
  be_.moe_combine_forward(proj_, a.ys, r.weight.data(), r.row_of.data(), BT, k, d, r.rows);
  tp.allreduce_sum(proj_, std::size_t(BT) * d);
  be_.residual_forward(a.res3, a.res2, proj_, BT * d);
}

// dres_ holds the gradient of res3 on entry and of res2 on exit (RMSNorm's backward adds into it).
void LlamaModel::moe_backward(const TpContext& tp, int l, int B) {
  auto& a = acts(l);
  const MoeRouting& r = routing_[current_slot()][l - stage().first];
  auto P = [&](LlamaTensor t) { return param(llama_tensor(m_, l, t)); };
  auto G = [&](LlamaTensor t) { return grad(llama_tensor(m_, l, t)); };
  const long BT = long(B) * T_;
  const int d = m_.hidden, f = m_.mlp(), E = m_.experts, k = m_.top_k;
  // The combine's backward: each row's gradient, and each slot's weight gradient where its expert
  // is here (0 elsewhere, so the sum over the group is every slot's).
  std::vector<float> dweight(BT * k);
  be_.moe_combine_backward(dys_, dweight.data(), dres_, a.ys, r.weight.data(), r.row_of.data(), BT, k, d, r.rows);
  be_.zero(dh_, std::size_t(r.rows) * f);
  for_local_experts(r, [&](int i, int, long first, long rows) {
    be_.matmul_backward(dh_ + first * f, G(kDown) + std::size_t(i) * f * d, nullptr, dys_ + first * d,
                        a.h + first * f, P(kDown) + std::size_t(i) * f * d, int(rows), f, d, WeightLayout::InOut);
  });
  be_.zero(dgate_, std::size_t(r.rows) * f);
  be_.zero(dup_, std::size_t(r.rows) * f);
  be_.swiglu_backward(dgate_, dup_, a.gate, a.up, dh_, r.rows * f);
  be_.zero(dxs_, std::size_t(r.rows) * d);
  for_local_experts(r, [&](int i, int, long first, long rows) {
    const std::size_t expert = std::size_t(i) * f * d;
    be_.matmul_backward(dxs_ + first * d, G(kGate) + expert, nullptr, dgate_ + first * f, a.xs + first * d,
                        P(kGate) + expert, int(rows), d, f, WeightLayout::OutIn);
    be_.matmul_backward(dxs_ + first * d, G(kUp) + expert, nullptr, dup_ + first * f, a.xs + first * d,
                        P(kUp) + expert, int(rows), d, f, WeightLayout::OutIn);
  });
  // One all-reduce: the experts' input gradient [BT, d] and the weights' gradient [BT, k].
  float* dln = moe_reduce_;
  be_.zero(dln, std::size_t(BT) * d);
  be_.moe_dispatch_backward(dln, dxs_, r.row_of.data(), BT, k, d, r.rows);
  be_.from_host(moe_reduce_ + BT * d, dweight.data(), std::size_t(BT) * k);
  tp.allreduce_sum(moe_reduce_, std::size_t(BT) * (d + k));
  be_.to_host(dweight.data(), moe_reduce_ + BT * d, std::size_t(BT) * k);
  // The router, alike on every rank: its logits' gradient (the balancing loss weighted as each
  // token's loss is, by dloss), its weight's, and its share of the input gradient.
  be_.zero(dlogits_, std::size_t(BT) * E);
  be_.moe_router_backward(dlogits_, r.probs.data(), r.expert.data(), r.weight.data(), dweight.data(), BT, E, k,
                          m_.router_aux_coef * float(BT) * dloss_);
  be_.matmul_backward(dln, G(kRouter), nullptr, dlogits_, a.ln2, P(kRouter), int(BT), d, E, WeightLayout::OutIn);
  be_.rmsnorm_backward(dres_, G(kMlpNorm), dln, a.res2, P(kMlpNorm), a.rstd2, int(BT), d);
}

}  // namespace ntp
