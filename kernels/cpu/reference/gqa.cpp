#include "kernels/cpu/reference/gqa.hpp"

namespace ntp::ref {

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV, int HS) {
  const int group = NH / NKV;
  for (int bt = 0; bt < BT; bt++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < HS; i++) {
        const long o = ((static_cast<long>(bt) * NH + h) * 3) * HS + i;
        const long kv = (static_cast<long>(bt) * NKV + h / group) * HS + i;
        qkv[o] = q[(static_cast<long>(bt) * NH + h) * HS + i];
        qkv[o + HS] = k[kv];
        qkv[o + 2 * HS] = v[kv];
      }
}

void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV, int HS) {
  const int group = NH / NKV;
  for (int bt = 0; bt < BT; bt++)
    for (int h = 0; h < NH; h++)
      for (int i = 0; i < HS; i++) {
        const long o = ((static_cast<long>(bt) * NH + h) * 3) * HS + i;
        const long kv = (static_cast<long>(bt) * NKV + h / group) * HS + i;
        dq[(static_cast<long>(bt) * NH + h) * HS + i] += dqkv[o];
        dk[kv] += dqkv[o + HS];
        dv[kv] += dqkv[o + 2 * HS];
      }
}

}  // namespace ntp::ref
