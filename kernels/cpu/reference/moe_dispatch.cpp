#include "kernels/cpu/reference/moe_dispatch.hpp"

namespace ntp::ref {

void moe_plan(const int* expert, const char* kept, long T, int E, int k, long* offsets, long* row_of) {
  // Expert by expert, the kept slots that chose it, in slot (token) order.
  long row = 0;
  for (int e = 0; e < E; e++) {
    offsets[e] = row;
    for (long a = 0; a < T * k; a++)
      if (kept[a] && expert[a] == e) row_of[a] = row++;
  }
  offsets[E] = row;
  for (long a = 0; a < T * k; a++)
    if (!kept[a]) row_of[a] = -1;
}

void moe_dispatch_forward(float* xs, const float* x, const long* row_of, long T, int k, int C) {
  for (long a = 0; a < T * k; a++)
    if (row_of[a] >= 0)
      for (int c = 0; c < C; c++) xs[row_of[a] * C + c] = x[(a / k) * C + c];
}

void moe_dispatch_backward(float* dx, const float* dxs, const long* row_of, long T, int k, int C) {
  for (long a = 0; a < T * k; a++)
    if (row_of[a] >= 0)
      for (int c = 0; c < C; c++) dx[(a / k) * C + c] += dxs[row_of[a] * C + c];
}

void moe_combine_forward(float* y, const float* ys, const float* weight, const long* row_of, long T, int k, int C) {
  for (long a = 0; a < T * k; a++)
    if (row_of[a] >= 0)
      for (int c = 0; c < C; c++) y[(a / k) * C + c] += weight[a] * ys[row_of[a] * C + c];
}

void moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                          const long* row_of, long T, int k, int C) {
  for (long a = 0; a < T * k; a++) {
    dweight[a] = 0;
    if (row_of[a] < 0) continue;
    for (int c = 0; c < C; c++) {
      dys[row_of[a] * C + c] = weight[a] * dy[(a / k) * C + c];
      dweight[a] += dy[(a / k) * C + c] * ys[row_of[a] * C + c];
    }
  }
}

}  // namespace ntp::ref
