#include "kernels/cpu/embedding.hpp"

#include <cstring>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT, int C) {
#pragma omp parallel for schedule(static) if (long(BT) * C >= detail::kParallelMinElems)
  for (int bt = 0; bt < BT; bt++) {
    float* o = out + static_cast<size_t>(bt) * C;
    const int row = local_row[tokens[bt]];
    if (row < 0) {
      std::memset(o, 0, sizeof(float) * C);
    } else {
      std::memcpy(o, wte + static_cast<size_t>(row) * C, sizeof(float) * C);
    }
  }
}

void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT, int C) {
  // Repeated tokens hit the same dwte row, so split the C dimension across threads instead of bt:
  // each thread owns a column block and walks all positions in order (race-free, and deterministic
  // for any thread count).
  constexpr int kBlock = 64;
  const int nblocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (long(BT) * C >= detail::kParallelMinElems)
  for (int blk = 0; blk < nblocks; blk++) {
    const int c0 = blk * kBlock;
    const int c1 = c0 + kBlock < C ? c0 + kBlock : C;
    for (int bt = 0; bt < BT; bt++) {
      const int row = local_row[tokens[bt]];
      if (row < 0) continue;
      float* d = dwte + static_cast<size_t>(row) * C;
      const float* g = dout + static_cast<size_t>(bt) * C;
#pragma omp simd
      for (int c = c0; c < c1; c++) d[c] += g[c];
    }
  }
}

void position_embedding_forward(float* out, const float* wpe, int B, int T, int C) {
#pragma omp parallel for schedule(static) if (long(B) * T * C >= detail::kParallelMinElems)
  for (int bt = 0; bt < B * T; bt++) {
    float* o = out + static_cast<size_t>(bt) * C;
    const float* w = wpe + static_cast<size_t>(bt % T) * C;
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] += w[c];
  }
}

void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C) {
  // Each position t is owned by one thread; the sum over b runs in order.
#pragma omp parallel for schedule(static) if (long(B) * T * C >= detail::kParallelMinElems)
  for (int t = 0; t < T; t++) {
    float* d = dwpe + static_cast<size_t>(t) * C;
    for (int b = 0; b < B; b++) {
      const float* g = dout + (static_cast<size_t>(b) * T + t) * C;
#pragma omp simd
      for (int c = 0; c < C; c++) d[c] += g[c];
    }
  }
}

}  // namespace ntp::cpu
