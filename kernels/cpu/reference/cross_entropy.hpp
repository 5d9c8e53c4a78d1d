#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/cross_entropy.hpp.
namespace ntp::ref {

void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl);
void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl);
void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT);
void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl);

}  // namespace ntp::ref
