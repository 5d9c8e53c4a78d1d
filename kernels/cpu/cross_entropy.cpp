#include "kernels/cpu/cross_entropy.hpp"

#include <cmath>

namespace ntp::cpu {

void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = logits + static_cast<size_t>(bt) * Vl;
    float mx = -INFINITY;
    for (int j = 0; j < Vl; j++) mx = x[j] > mx ? x[j] : mx;
    row_max[bt] = mx;
  }
}

void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl) {
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = logits + static_cast<size_t>(bt) * Vl;
    const float mx = row_max[bt];
    double s = 0.0;  // double: the sum runs over up to the full vocabulary
    for (int j = 0; j < Vl; j++) s += std::exp(x[j] - mx);
    const int row = local_row[targets[bt]];
    sums[2 * bt] = static_cast<float>(s);
    sums[2 * bt + 1] = row >= 0 ? x[row] : 0.0f;
  }
}

void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT) {
  for (int bt = 0; bt < BT; bt++) losses[bt] = std::log(sums[2 * bt]) + row_max[bt] - sums[2 * bt + 1];
}

void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl) {
  // Elementwise read-then-write per j, so dlogits may alias logits.
#pragma omp parallel for schedule(static)
  for (int bt = 0; bt < BT; bt++) {
    const float* x = logits + static_cast<size_t>(bt) * Vl;
    float* d = dlogits + static_cast<size_t>(bt) * Vl;
    const float mx = row_max[bt];
    const float inv = 1.0f / sums[2 * bt];
    for (int j = 0; j < Vl; j++) d[j] = std::exp(x[j] - mx) * inv * dloss;
    const int row = local_row[targets[bt]];
    if (row >= 0) d[row] -= dloss;
  }
}

}  // namespace ntp::cpu
