#include "kernels/cpu/attention.hpp"

#include <cblas.h>

#include <cmath>

namespace ntp::cpu {

// Per (b, head): Q, K, V are [T, HS] views into qkv with row stride ld = NH*3*HS; out/dout are
// [T, HS] views with row stride NH*HS; att/scratch blocks are dense [T, T]. The QK^T product is
// computed in full and masked afterwards: simpler than triangular blocking, at most 2x the flops
// of the (small) score GEMM.

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) {
  const int ld = NH * 3 * HS, ldo = NH * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const float* q = qkv + static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * 3 * HS;
      const float* k = q + HS;
      const float* v = q + 2 * HS;
      float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      float* o = out + static_cast<size_t>(b) * T * ldo + static_cast<size_t>(h) * HS;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, scale, q, ld, k, ld, 0.0f, a, T);
      for (int t = 0; t < T; t++) {  // causal softmax of row t over columns 0..t
        float* row = a + static_cast<size_t>(t) * T;
        float mx = row[0];
        for (int j = 1; j <= t; j++) mx = row[j] > mx ? row[j] : mx;
        float sum = 0.0f;
        for (int j = 0; j <= t; j++) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (int j = 0; j <= t; j++) row[j] *= inv;
        for (int j = t + 1; j < T; j++) row[j] = 0.0f;
      }
      // out = att @ V (zeros above the diagonal keep it causal)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, v, ld, 0.0f, o, ldo);
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS) {
  const int ld = NH * 3 * HS, ldo = NH * HS;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
#pragma omp parallel for collapse(2) schedule(static)
  for (int b = 0; b < B; b++) {
    for (int h = 0; h < NH; h++) {
      const size_t qoff = static_cast<size_t>(b) * T * ld + static_cast<size_t>(h) * 3 * HS;
      const float* q = qkv + qoff;
      const float* k = q + HS;
      const float* v = q + 2 * HS;
      float* dq = dqkv + qoff;
      float* dk = dq + HS;
      float* dv = dq + 2 * HS;
      const float* a = att + (static_cast<size_t>(b) * NH + h) * T * T;
      float* d = scratch + (static_cast<size_t>(b) * NH + h) * T * T;
      const float* g = dout + static_cast<size_t>(b) * T * ldo + static_cast<size_t>(h) * HS;
      // dV += att^T @ dout;  datt = dout @ V^T
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, 1.0f, a, T, g, ldo, 1.0f, dv, ld);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, HS, 1.0f, g, ldo, v, ld, 0.0f, d, T);
      // Softmax backward in place: dpre = att * (datt - sum_j att * datt); zero above the diagonal.
      for (int t = 0; t < T; t++) {
        const float* arow = a + static_cast<size_t>(t) * T;
        float* drow = d + static_cast<size_t>(t) * T;
        float dot = 0.0f;
        for (int j = 0; j <= t; j++) dot += arow[j] * drow[j];
        for (int j = 0; j <= t; j++) drow[j] = arow[j] * (drow[j] - dot);
        for (int j = t + 1; j < T; j++) drow[j] = 0.0f;
      }
      // pre = scale * Q K^T:  dQ += scale * dpre @ K;  dK += scale * dpre^T @ Q
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, HS, T, scale, d, T, k, ld, 1.0f, dq, ld);
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, HS, T, scale, d, T, q, ld, 1.0f, dk, ld);
    }
  }
}

}  // namespace ntp::cpu
