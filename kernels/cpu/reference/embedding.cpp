#include "kernels/cpu/reference/embedding.hpp"

namespace ntp::ref {

void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    int row = local_row[tokens[bt]];
    for (int i = 0; i < C; i++) out[bt * C + i] = row >= 0 ? wte[row * C + i] : 0.0f;
  }
}

void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    int row = local_row[tokens[bt]];
    if (row < 0) continue;
    for (int i = 0; i < C; i++) dwte[row * C + i] += dout[bt * C + i];
  }
}

void position_embedding_forward(float* out, const float* wpe, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < C; i++) out[(b * T + t) * C + i] += wpe[t * C + i];
}

void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C) {
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int i = 0; i < C; i++) dwpe[t * C + i] += dout[(b * T + t) * C + i];
}

}  // namespace ntp::ref
