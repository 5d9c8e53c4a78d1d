#include "kernels/cpu/reference/swiglu.hpp"

#include <cmath>

namespace ntp::ref {

void swiglu_forward(float* out, const float* gate, const float* up, long N) {
  for (long i = 0; i < N; i++) {
    const float x = gate[i];
    out[i] = x / (1.0f + std::exp(-x)) * up[i];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N) {
  for (long i = 0; i < N; i++) {
    const float x = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-x));
    const float silu = x * sig;
    // d silu / dx = sig + x sig (1 - sig)
    dgate[i] += dout[i] * up[i] * (sig + x * sig * (1.0f - sig));
    dup[i] += dout[i] * silu;
  }
}

}  // namespace ntp::ref
