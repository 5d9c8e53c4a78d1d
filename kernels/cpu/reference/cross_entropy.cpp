#include "kernels/cpu/reference/cross_entropy.hpp"

#include <cmath>

namespace ntp::ref {

void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl) {
  for (int bt = 0; bt < BT; bt++) {
    float m = -INFINITY;
    for (int j = 0; j < Vl; j++)
      if (logits[static_cast<long>(bt) * Vl + j] > m) m = logits[static_cast<long>(bt) * Vl + j];
    row_max[bt] = m;
  }
}

void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl) {
  for (int bt = 0; bt < BT; bt++) {
    double s = 0.0;
    for (int j = 0; j < Vl; j++)
      s += std::exp(static_cast<double>(logits[static_cast<long>(bt) * Vl + j]) - row_max[bt]);
    int row = local_row[targets[bt]];
    sums[2 * bt] = static_cast<float>(s);
    sums[2 * bt + 1] = row >= 0 ? logits[static_cast<long>(bt) * Vl + row] : 0.0f;
  }
}

void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT) {
  for (int bt = 0; bt < BT; bt++) losses[bt] = std::log(sums[2 * bt]) + row_max[bt] - sums[2 * bt + 1];
}

void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl) {
  for (int bt = 0; bt < BT; bt++) {
    int row = local_row[targets[bt]];
    for (int j = 0; j < Vl; j++) {
      long k = static_cast<long>(bt) * Vl + j;
      float p = std::exp(logits[k] - row_max[bt]) / sums[2 * bt];
      float indicator = j == row ? 1.0f : 0.0f;
      dlogits[k] = (p - indicator) * dloss;
    }
  }
}

}  // namespace ntp::ref
