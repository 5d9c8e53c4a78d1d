#pragma once
// Vocabulary-parallel softmax cross-entropy (Megatron) on the GPU; contracts and the 3-stage
// protocol as kernels/cpu/cross_entropy.hpp:
//   1. crossentropy_local_max           -> all-reduce MAX over the TP group
//   2. crossentropy_local_sums          -> all-reduce SUM over the TP group
//   3. crossentropy_loss / crossentropy_backward
// logits are [BT, Vl] (this rank's vocabulary rows); targets [BT] are global token ids and
// local_row [V] maps them to local rows (-1: not here). One block per row for the reductions.
#include <cuda_runtime.h>

namespace ntp::cuda {

// row_max[bt] = max_j logits[bt, j]  (-inf when Vl == 0)
void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl, cudaStream_t stream);
// sums[2*bt] = sum_j exp(logits[bt, j] - row_max[bt]) (accumulated in double);
// sums[2*bt+1] = logits[bt, local_row[targets[bt]]] if owned here, else 0
void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl, cudaStream_t stream);
// losses[bt] = log(sums[2bt]) + row_max[bt] - sums[2bt+1]
void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT, cudaStream_t stream);
// dlogits[bt, j] = (softmax_j - [j is the target]) * dloss. Overwrites dlogits; may alias logits.
void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl,
                           cudaStream_t stream);

}  // namespace ntp::cuda
