#include "kernels/cpu/reference/matmul.hpp"

namespace ntp::ref {

namespace {
// Element (o, i) of the logical [OC, C] weight, whatever the storage layout.
long widx(int o, int i, int C, int OC, WeightLayout layout) {
  return layout == WeightLayout::OutIn ? static_cast<long>(o) * C + i : static_cast<long>(i) * OC + o;
}
}  // namespace

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout) {
  for (int bt = 0; bt < BT; bt++) {
    for (int o = 0; o < OC; o++) {
      float val = bias != nullptr ? bias[o] : 0.0f;
      for (int i = 0; i < C; i++) val += inp[bt * C + i] * weight[widx(o, i, C, OC, layout)];
      out[bt * OC + o] = val;
    }
  }
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout) {
  for (int bt = 0; bt < BT; bt++) {
    for (int o = 0; o < OC; o++) {
      float d = dout[bt * OC + o];
      for (int i = 0; i < C; i++) {
        long w = widx(o, i, C, OC, layout);
        if (dinp != nullptr) dinp[bt * C + i] += weight[w] * d;
        dweight[w] += inp[bt * C + i] * d;
      }
      if (dbias != nullptr) dbias[o] += d;
    }
  }
}

void bias_forward(float* out, const float* bias, int BT, int OC) {
  for (int bt = 0; bt < BT; bt++)
    for (int o = 0; o < OC; o++) out[bt * OC + o] += bias[o];
}

void bias_backward(float* dbias, const float* dout, int BT, int OC) {
  for (int bt = 0; bt < BT; bt++)
    for (int o = 0; o < OC; o++) dbias[o] += dout[bt * OC + o];
}

}  // namespace ntp::ref
