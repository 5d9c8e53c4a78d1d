#include "kernels/cpu/swiglu.hpp"

#include <cmath>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

void swiglu_forward(float* out, const float* gate, const float* up, long N) {
#pragma omp parallel for simd schedule(static) if (N >= detail::kParallelMinElems)
  for (long i = 0; i < N; i++) {
    const float x = gate[i];
    out[i] = x / (1.0f + std::exp(-x)) * up[i];
  }
}

void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N) {
#pragma omp parallel for simd schedule(static) if (N >= detail::kParallelMinElems)
  for (long i = 0; i < N; i++) {
    const float x = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-x));
    dgate[i] += dout[i] * up[i] * sig * (1.0f + x * (1.0f - sig));
    dup[i] += dout[i] * x * sig;
  }
}

}  // namespace ntp::cpu
