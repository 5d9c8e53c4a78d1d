#pragma once
// Vocabulary-parallel softmax cross-entropy (Megatron). Each rank holds logits for its vocabulary
// rows only ([BT, Vl], local row order as in the embedding); the caller combines the per-rank
// partial statistics with all-reduces between the calls:
//   1. crossentropy_local_max           -> all-reduce MAX over the TP group
//   2. crossentropy_local_sums          -> all-reduce SUM over the TP group
//   3. crossentropy_loss / crossentropy_backward
namespace ntp::cpu {

// row_max[bt] = max_j logits[bt, j]  (-inf when Vl == 0)
void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl);
// sums[2*bt]   = sum_j exp(logits[bt, j] - row_max[bt])
// sums[2*bt+1] = logits[bt, local_row[targets[bt]]] if owned here, else 0
void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl);
// losses[bt] = log(sums[2bt]) + row_max[bt] - sums[2bt+1]
void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT);
// dlogits[bt, j] = (softmax_j - [j is the target]) * dloss. Overwrites dlogits; may alias logits.
void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl);

}  // namespace ntp::cpu
