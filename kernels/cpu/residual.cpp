#include "kernels/cpu/residual.hpp"

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

void residual_forward(float* out, const float* a, const float* b, long N) {
#pragma omp parallel for simd schedule(static) if (N >= detail::kParallelMinElems)
  for (long i = 0; i < N; i++) out[i] = a[i] + b[i];
}

void residual_backward(float* da, float* db, const float* dout, long N) {
#pragma omp parallel for simd schedule(static) if (N >= detail::kParallelMinElems)
  for (long i = 0; i < N; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

}  // namespace ntp::cpu
