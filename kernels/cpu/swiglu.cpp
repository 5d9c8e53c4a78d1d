#include "kernels/cpu/swiglu.hpp"

#include <cmath>

#include "kernels/cpu/detail/parallel_chunks.hpp"
#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

NTP_AVX2 inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, detail::exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

NTP_AVX2 void forward_avx2(float* out, const float* gate, const float* up, long n) {
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid8(x)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; i++) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

NTP_AVX2 void backward_avx2(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(gate + i), g = _mm256_loadu_ps(dout + i);
    const __m256 s = sigmoid8(x);
    // silu'(x) = s (1 + x (1 - s))
    const __m256 dsilu = _mm256_mul_ps(s, _mm256_fmadd_ps(x, _mm256_sub_ps(one, s), one));
    const __m256 gu = _mm256_mul_ps(g, _mm256_loadu_ps(up + i));
    _mm256_storeu_ps(dgate + i, _mm256_fmadd_ps(gu, dsilu, _mm256_loadu_ps(dgate + i)));
    _mm256_storeu_ps(dup + i, _mm256_fmadd_ps(g, _mm256_mul_ps(x, s), _mm256_loadu_ps(dup + i)));
  }
  for (; i < n; i++) {
    const float x = gate[i], s = sigmoid(x);
    dgate[i] += dout[i] * up[i] * s * (1.0f + x * (1.0f - s));
    dup[i] += dout[i] * x * s;
  }
}
}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, long N) {
  const bool avx2 = detail::has_avx2_fma();
  detail::for_each_chunk(N, [&](long i0, long n) {
    if (avx2) {
      forward_avx2(out + i0, gate + i0, up + i0, n);
    } else {
      for (long i = i0; i < i0 + n; i++) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
    }
  });
}

void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout, long N) {
  const bool avx2 = detail::has_avx2_fma();
  detail::for_each_chunk(N, [&](long i0, long n) {
    if (avx2) {
      backward_avx2(dgate + i0, dup + i0, gate + i0, up + i0, dout + i0, n);
    } else {
      for (long i = i0; i < i0 + n; i++) {
        const float x = gate[i], s = sigmoid(x);
        dgate[i] += dout[i] * up[i] * s * (1.0f + x * (1.0f - s));
        dup[i] += dout[i] * x * s;
      }
    }
  });
}

}  // namespace ntp::cpu
