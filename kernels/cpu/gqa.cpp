#include "kernels/cpu/gqa.hpp"

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV, int HS) {
  const int group = NH / NKV;
#pragma omp parallel for schedule(static) if (3L * BT * NH * HS >= detail::kParallelMinElems)
  for (int bt = 0; bt < BT; bt++)
    for (int h = 0; h < NH; h++) {
      float* o = qkv + (static_cast<long>(bt) * NH + h) * 3 * HS;
      const float* qh = q + (static_cast<long>(bt) * NH + h) * HS;
      const long kv = (static_cast<long>(bt) * NKV + h / group) * HS;
#pragma omp simd
      for (int i = 0; i < HS; i++) {
        o[i] = qh[i];
        o[HS + i] = k[kv + i];
        o[2 * HS + i] = v[kv + i];
      }
    }
}

void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV, int HS) {
  const int group = NH / NKV;
  // Rows are independent (a row's query heads only feed that row's key/value heads).
#pragma omp parallel for schedule(static) if (3L * BT * NH * HS >= detail::kParallelMinElems)
  for (int bt = 0; bt < BT; bt++)
    for (int h = 0; h < NH; h++) {
      const float* g = dqkv + (static_cast<long>(bt) * NH + h) * 3 * HS;
      float* dqh = dq + (static_cast<long>(bt) * NH + h) * HS;
      const long kv = (static_cast<long>(bt) * NKV + h / group) * HS;
#pragma omp simd
      for (int i = 0; i < HS; i++) {
        dqh[i] += g[i];
        dk[kv + i] += g[HS + i];
        dv[kv + i] += g[2 * HS + i];
      }
    }
}

}  // namespace ntp::cpu
