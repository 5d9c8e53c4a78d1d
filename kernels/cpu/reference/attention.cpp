#include "kernels/cpu/reference/attention.hpp"

#include <cmath>
#include <vector>

namespace ntp::ref {

// qkv [B, T, NH, 3, HS]: element (b, t, h, part, i) with part 0 = query, 1 = key, 2 = value.
namespace {
long qkv_idx(int b, int t, int h, int part, int i, int T, int NH, int HS) {
  return ((((static_cast<long>(b) * T + t) * NH + h) * 3 + part) * HS) + i;
}
}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) {
  float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  std::vector<float> preatt(T);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        float* att_bth = att + ((static_cast<long>(b) * NH + h) * T + t) * T;

        // pass 1: query dot key, and the max
        float maxval = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          float val = 0.0f;
          for (int i = 0; i < HS; i++)
            val += qkv[qkv_idx(b, t, h, 0, i, T, NH, HS)] * qkv[qkv_idx(b, t2, h, 1, i, T, NH, HS)];
          val *= scale;
          if (val > maxval) maxval = val;
          preatt[t2] = val;
        }

        // pass 2: exp and sum
        float expsum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          float expv = std::exp(preatt[t2] - maxval);
          expsum += expv;
          att_bth[t2] = expv;
        }
        float expsum_inv = 1.0f / expsum;

        // pass 3: normalize; causal mask above the diagonal
        for (int t2 = 0; t2 < T; t2++) att_bth[t2] = t2 <= t ? att_bth[t2] * expsum_inv : 0.0f;

        // pass 4: weighted sum of the values
        float* out_bth = out + ((static_cast<long>(b) * T + t) * NH + h) * HS;
        for (int i = 0; i < HS; i++) out_bth[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++)
          for (int i = 0; i < HS; i++) out_bth[i] += att_bth[t2] * qkv[qkv_idx(b, t2, h, 2, i, T, NH, HS)];
      }
    }
  }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS) {
  float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  std::vector<float> datt(T);
  for (int b = 0; b < B; b++) {
    for (int t = 0; t < T; t++) {
      for (int h = 0; h < NH; h++) {
        const float* att_bth = att + ((static_cast<long>(b) * NH + h) * T + t) * T;
        float* dpreatt_bth = scratch + ((static_cast<long>(b) * NH + h) * T + t) * T;
        const float* dout_bth = dout + ((static_cast<long>(b) * T + t) * NH + h) * HS;

        // backward pass 4: through the value accumulation
        for (int t2 = 0; t2 <= t; t2++) {
          datt[t2] = 0.0f;
          for (int i = 0; i < HS; i++) {
            datt[t2] += qkv[qkv_idx(b, t2, h, 2, i, T, NH, HS)] * dout_bth[i];
            dqkv[qkv_idx(b, t2, h, 2, i, T, NH, HS)] += att_bth[t2] * dout_bth[i];
          }
        }

        // backward passes 2 & 3: the softmax
        for (int t2 = 0; t2 < T; t2++) dpreatt_bth[t2] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          for (int t3 = 0; t3 <= t; t3++) {
            float indicator = t2 == t3 ? 1.0f : 0.0f;
            float local_derivative = att_bth[t2] * (indicator - att_bth[t3]);
            dpreatt_bth[t3] += local_derivative * datt[t2];
          }
        }

        // backward pass 1: the query @ key matmul
        for (int t2 = 0; t2 <= t; t2++) {
          for (int i = 0; i < HS; i++) {
            dqkv[qkv_idx(b, t, h, 0, i, T, NH, HS)] +=
                qkv[qkv_idx(b, t2, h, 1, i, T, NH, HS)] * dpreatt_bth[t2] * scale;
            dqkv[qkv_idx(b, t2, h, 1, i, T, NH, HS)] +=
                qkv[qkv_idx(b, t, h, 0, i, T, NH, HS)] * dpreatt_bth[t2] * scale;
          }
        }
      }
    }
  }
}

}  // namespace ntp::ref
