#include "kernels/cpu/gelu.hpp"

#include <cmath>
#include <numbers>

namespace ntp::cpu {

namespace {
const float kScale = std::sqrt(2.0f / std::numbers::pi_v<float>);
}

void gelu_forward(float* out, const float* inp, long N) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < N; i++) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kScale * (x + 0.044715f * x * x * x)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N) {
#pragma omp parallel for schedule(static)
  for (long i = 0; i < N; i++) {
    const float x = inp[i];
    const float th = std::tanh(kScale * (x + 0.044715f * x * x * x));
    // sech^2 = 1 - tanh^2: avoids coshf, which overflows for large |x|.
    const float sech2 = 1.0f - th * th;
    const float grad = 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
  }
}

}  // namespace ntp::cpu
