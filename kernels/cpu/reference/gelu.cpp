#include "kernels/cpu/reference/gelu.hpp"

#include <cmath>
#include <numbers>

namespace ntp::ref {

namespace {
const float kScale = std::sqrt(2.0f / std::numbers::pi_v<float>);
}

void gelu_forward(float* out, const float* inp, long N) {
  for (long i = 0; i < N; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + std::tanh(kScale * (x + cube)));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N) {
  for (long i = 0; i < N; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float tanh_arg = kScale * (x + cube);
    float tanh_out = std::tanh(tanh_arg);
    float cosh_out = std::cosh(tanh_arg);
    float sech_out = 1.0f / (cosh_out * cosh_out);
    float local_grad = 0.5f * (1.0f + tanh_out) + x * 0.5f * sech_out * kScale * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local_grad * dout[i];
  }
}

}  // namespace ntp::ref
