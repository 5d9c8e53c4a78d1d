#pragma once
// Megatron's tensor-parallel layers as free functions over one rank's shards. Every TP
// communication is one of Megatron's two conjugate operators:
//   f: identity forward, all-reduce backward   (in front of a column-parallel layer)
//   g: all-reduce forward, identity backward   (behind a row-parallel layer)
// The model composes these; the tests compare each with its unsharded self.
#include <cstddef>
#include <initializer_list>

#include "backend.hpp"
#include "comm.hpp"
#include "pacer.hpp"
#include "phase_clock.hpp"

namespace ntp {

// The TP group a layer runs in, and where its communication time is charged.
struct TpContext {
  Backend& be;
  Comm& comm;
  PhaseClock* clock = nullptr;
  Pacer* pacer = nullptr;  // paced timing: each all-reduce takes at least its emulated time
  void allreduce_sum(float* buf, std::size_t n) const;
  void allreduce_max(float* buf, std::size_t n) const;
};

// Column-parallel: out[BT, OCl] = inp[BT, C] @ W^T + b, W [OCl, C] the rank's output rows.
void column_parallel_forward(const TpContext& tp, float* out, const float* inp, const float* w, const float* b, int BT,
                             int C, int OCl);
// dinp[BT, C] is overwritten with the full input gradient (f: all-reduce of the partial sums);
// dw, db accumulate.
void column_parallel_backward(const TpContext& tp, float* dinp, float* dw, float* db, const float* dout,
                              const float* inp, const float* w, int BT, int C, int OCl);

// Several column-parallel layers reading the same input (Llama's q, k, v, and gate, up): each
// part's dw accumulates, and dinp[BT, C] is overwritten with the sum of the parts' input gradients,
// all-reduced once.
struct ColumnPart {
  const float* dout;  // [BT, OCl]
  const float* w;     // [OCl, C]
  float* dw;
  int OCl;
};
void column_parallel_backward(const TpContext& tp, float* dinp, const float* inp, int BT, int C,
                              std::initializer_list<ColumnPart> parts);

// Row-parallel: out[BT, OC] = allreduce(inp[BT, Cl] @ W) + b, W [Cl, OC] the rank's input rows;
// the bias (replicated; null for none) is added once, after the reduction.
void row_parallel_forward(const TpContext& tp, float* out, const float* inp, const float* w, const float* b, int BT,
                          int Cl, int OC);
// dinp[BT, Cl] overwritten (g backward is the identity); dw, db (null for none) accumulate.
void row_parallel_backward(const TpContext& tp, float* dinp, float* dw, float* db, const float* dout,
                           const float* inp, const float* w, int BT, int Cl, int OC);

// Vocabulary-parallel embedding: out = allreduce(rows this rank owns) + wpe[t] (wpe, dwpe null:
// no position table, as Llama).
void vocab_parallel_embedding_forward(const TpContext& tp, float* out, const int* tokens, const float* wte,
                                      const int* local_row, const float* wpe, int B, int T, int C);
void vocab_parallel_embedding_backward(const TpContext& tp, float* dwte, float* dwpe, const float* dout,
                                       const int* tokens, const int* local_row, int B, int T, int C);

// Vocabulary-parallel cross-entropy over logits [BT, Vl]: losses[BT] on every rank. row_max[BT]
// and sums[2 BT] are saved for the backward, which overwrites logits with dlogits.
void vocab_parallel_cross_entropy_forward(const TpContext& tp, float* losses, float* row_max, float* sums,
                                          const float* logits, const int* targets, const int* local_row, int BT,
                                          int Vl);
void vocab_parallel_cross_entropy_backward(const TpContext& tp, float* logits, const float* row_max,
                                           const float* sums, const int* targets, const int* local_row, float dloss,
                                           int BT, int Vl);

}  // namespace ntp
