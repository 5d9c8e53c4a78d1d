#include "tp_layers.hpp"

namespace ntp {

namespace {
// Runs an all-reduce charged to TpComm, paced as a ring all-reduce: 2(n-1)/n of the bytes and
// 2(n-1) messages per rank.
template <typename F>
void timed_allreduce(const TpContext& tp, std::size_t n, F&& op) {
  if (tp.comm.size() == 1) return;
  if (!tp.clock) return op();
  PhaseScope s(*tp.clock, Phase::TpComm);
  const auto t0 = PhaseClock::clock::now();
  op();
  if (tp.pacer && tp.pacer->enabled()) {
    const double real = seconds_since(t0);
    const int P = tp.comm.size();
    tp.pacer->pace_transfer(real, 2.0 * (P - 1) / P * n * sizeof(float), 2 * (P - 1), Link::Tp, Traffic::Activations);
  }
}
}  // namespace

void TpContext::allreduce_sum(float* buf, std::size_t n) const {
  timed_allreduce(*this, n, [&] { comm.allreduce_sum(buf, n); });
}

void TpContext::allreduce_max(float* buf, std::size_t n) const {
  timed_allreduce(*this, n, [&] { comm.allreduce_max(buf, n); });
}

void column_parallel_forward(const TpContext& tp, float* out, const float* inp, const float* w, const float* b, int BT,
                             int C, int OCl) {
  tp.be.matmul_forward(out, inp, w, b, BT, C, OCl, WeightLayout::OutIn);
}

void column_parallel_backward(const TpContext& tp, float* dinp, float* dw, float* db, const float* dout,
                              const float* inp, const float* w, int BT, int C, int OCl) {
  const std::size_t n = std::size_t(BT) * C;
  tp.be.zero(dinp, n);
  tp.be.matmul_backward(dinp, dw, db, dout, inp, w, BT, C, OCl, WeightLayout::OutIn);
  tp.allreduce_sum(dinp, n);
}

void column_parallel_backward(const TpContext& tp, float* dinp, const float* inp, int BT, int C,
                              std::initializer_list<ColumnPart> parts) {
  const std::size_t n = std::size_t(BT) * C;
  tp.be.zero(dinp, n);
  for (const auto& p : parts)
    tp.be.matmul_backward(dinp, p.dw, nullptr, p.dout, inp, p.w, BT, C, p.OCl, WeightLayout::OutIn);
  tp.allreduce_sum(dinp, n);
}

void row_parallel_forward(const TpContext& tp, float* out, const float* inp, const float* w, const float* b, int BT,
                          int Cl, int OC) {
  tp.be.matmul_forward(out, inp, w, nullptr, BT, Cl, OC, WeightLayout::InOut);
  tp.allreduce_sum(out, std::size_t(BT) * OC);
  if (b) tp.be.bias_forward(out, b, BT, OC);
}

void row_parallel_backward(const TpContext& tp, float* dinp, float* dw, float* db, const float* dout,
                           const float* inp, const float* w, int BT, int Cl, int OC) {
  if (db) tp.be.bias_backward(db, dout, BT, OC);
  tp.be.zero(dinp, std::size_t(BT) * Cl);
  tp.be.matmul_backward(dinp, dw, nullptr, dout, inp, w, BT, Cl, OC, WeightLayout::InOut);
}

void vocab_parallel_embedding_forward(const TpContext& tp, float* out, const int* tokens, const float* wte,
                                      const int* local_row, const float* wpe, int B, int T, int C) {
  tp.be.embedding_forward(out, tokens, wte, local_row, B * T, C);
  tp.allreduce_sum(out, std::size_t(B) * T * C);
  if (wpe) tp.be.position_embedding_forward(out, wpe, B, T, C);
}

void vocab_parallel_embedding_backward(const TpContext& tp, float* dwte, float* dwpe, const float* dout,
                                       const int* tokens, const int* local_row, int B, int T, int C) {
  tp.be.embedding_backward(dwte, dout, tokens, local_row, B * T, C);
  if (dwpe) tp.be.position_embedding_backward(dwpe, dout, B, T, C);
}

void vocab_parallel_cross_entropy_forward(const TpContext& tp, float* losses, float* row_max, float* sums,
                                          const float* logits, const int* targets, const int* local_row, int BT,
                                          int Vl) {
  tp.be.crossentropy_local_max(row_max, logits, BT, Vl);
  tp.allreduce_max(row_max, BT);
  tp.be.crossentropy_local_sums(sums, logits, row_max, targets, local_row, BT, Vl);
  tp.allreduce_sum(sums, 2 * std::size_t(BT));
  tp.be.crossentropy_loss(losses, row_max, sums, BT);
}

void vocab_parallel_cross_entropy_backward(const TpContext& tp, float* logits, const float* row_max,
                                           const float* sums, const int* targets, const int* local_row, float dloss,
                                           int BT, int Vl) {
  tp.be.crossentropy_backward(logits, logits, row_max, sums, targets, local_row, dloss, BT, Vl);
}

}  // namespace ntp
