#include "kernels/cpu/matmul.hpp"

#include <cblas.h>
#include <omp.h>

#include <vector>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout) {
  // Seed out with the bias (or zeros) and let sgemm accumulate with beta = 1: one pass over out.
  float beta = 0.0f;
  if (bias != nullptr) {
#pragma omp parallel for schedule(static) if (long(BT) * OC >= detail::kParallelMinElems)
    for (int bt = 0; bt < BT; bt++) {
      float* o = out + static_cast<size_t>(bt) * OC;
#pragma omp simd
      for (int i = 0; i < OC; i++) o[i] = bias[i];
    }
    beta = 1.0f;
  }
  if (layout == WeightLayout::OutIn) {  // out = inp @ W^T, W [OC, C]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, OC, C, 1.0f, inp, C, weight, C, beta, out, OC);
  } else {  // out = inp @ W, W [C, OC]
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, OC, C, 1.0f, inp, C, weight, OC, beta, out, OC);
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout) {
  if (layout == WeightLayout::OutIn) {
    // dinp += dout @ W;  dW [OC, C] += dout^T @ inp
    if (dinp != nullptr)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, BT, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
  } else {
    // dinp += dout @ W^T;  dW [C, OC] += inp^T @ dout
    if (dinp != nullptr)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, C, OC, 1.0f, dout, OC, weight, OC, 1.0f, dinp, C);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, C, OC, BT, 1.0f, inp, C, dout, OC, 1.0f, dweight, OC);
  }
  if (dbias != nullptr) bias_backward(dbias, dout, BT, OC);
}

void bias_forward(float* out, const float* bias, int BT, int OC) {
#pragma omp parallel for schedule(static) if (long(BT) * OC >= detail::kParallelMinElems)
  for (int bt = 0; bt < BT; bt++) {
    float* o = out + static_cast<size_t>(bt) * OC;
#pragma omp simd
    for (int i = 0; i < OC; i++) o[i] += bias[i];
  }
}

void bias_backward(float* dbias, const float* dout, int BT, int OC) {
  // Per-thread partial sums over a static row split, merged in thread order: deterministic for a
  // fixed thread count.
  const int nt = long(BT) * OC >= detail::kParallelMinElems ? omp_get_max_threads() : 1;
  std::vector<float> part(static_cast<size_t>(nt) * OC, 0.0f);
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    float* p = part.data() + static_cast<size_t>(omp_get_thread_num()) * OC;
#pragma omp for schedule(static)
    for (int bt = 0; bt < BT; bt++) {
      const float* g = dout + static_cast<size_t>(bt) * OC;
#pragma omp simd
      for (int i = 0; i < OC; i++) p[i] += g[i];
    }
  }
  for (int t = 0; t < nt; t++)
    for (int i = 0; i < OC; i++) dbias[i] += part[static_cast<size_t>(t) * OC + i];
}

}  // namespace ntp::cpu
