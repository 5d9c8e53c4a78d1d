#include "kernels/cpu/gelu.hpp"

#include <cmath>
#include <numbers>

#include "kernels/cpu/detail/parallel_chunks.hpp"
#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {
const float kScale = std::sqrt(2.0f / std::numbers::pi_v<float>);
constexpr float kCubic = 0.044715f;

// Scalar forms: the fallback without AVX2, and the tails.
inline float gelu_f(float x) { return 0.5f * x * (1.0f + std::tanh(kScale * (x + kCubic * x * x * x))); }
inline float gelu_grad(float x) {
  const float th = std::tanh(kScale * (x + kCubic * x * x * x));
  // sech^2 = 1 - tanh^2: avoids coshf, which overflows for large |x|.
  const float sech2 = 1.0f - th * th;
  return 0.5f * (1.0f + th) + 0.5f * x * sech2 * kScale * (1.0f + 3.0f * kCubic * x * x);
}

NTP_AVX2 void forward_avx2(float* out, const float* inp, long n) {
  const __m256 k = _mm256_set1_ps(kScale), c = _mm256_set1_ps(kCubic), half = _mm256_set1_ps(0.5f),
               one = _mm256_set1_ps(1.0f);
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(inp + i);
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 th = detail::tanh8(_mm256_mul_ps(k, _mm256_fmadd_ps(c, x3, x)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(half, x), _mm256_add_ps(one, th)));
  }
  for (; i < n; i++) out[i] = gelu_f(inp[i]);
}

NTP_AVX2 void backward_avx2(float* dinp, const float* inp, const float* dout, long n) {
  const __m256 k = _mm256_set1_ps(kScale), c = _mm256_set1_ps(kCubic), c3 = _mm256_set1_ps(3.0f * kCubic),
               half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
  long i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(inp + i);
    const __m256 x2 = _mm256_mul_ps(x, x);
    const __m256 th = detail::tanh8(_mm256_mul_ps(k, _mm256_fmadd_ps(_mm256_mul_ps(c, x2), x, x)));
    const __m256 sech2 = _mm256_fnmadd_ps(th, th, one);
    // 0.5 (1 + th) + 0.5 x sech2 k (1 + 3c x^2)
    const __m256 right = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(half, x), sech2),
                                       _mm256_mul_ps(k, _mm256_fmadd_ps(c3, x2, one)));
    const __m256 grad = _mm256_fmadd_ps(half, _mm256_add_ps(one, th), right);
    _mm256_storeu_ps(dinp + i, _mm256_fmadd_ps(grad, _mm256_loadu_ps(dout + i), _mm256_loadu_ps(dinp + i)));
  }
  for (; i < n; i++) dinp[i] += gelu_grad(inp[i]) * dout[i];
}
}  // namespace

void gelu_forward(float* out, const float* inp, long N) {
  const bool avx2 = detail::has_avx2_fma();
  detail::for_each_chunk(N, [&](long i0, long n) {
    if (avx2) {
      forward_avx2(out + i0, inp + i0, n);
    } else {
      for (long i = i0; i < i0 + n; i++) out[i] = gelu_f(inp[i]);
    }
  });
}

void gelu_backward(float* dinp, const float* inp, const float* dout, long N) {
  const bool avx2 = detail::has_avx2_fma();
  detail::for_each_chunk(N, [&](long i0, long n) {
    if (avx2) {
      backward_avx2(dinp + i0, inp + i0, dout + i0, n);
    } else {
      for (long i = i0; i < i0 + n; i++) dinp[i] += gelu_grad(inp[i]) * dout[i];
    }
  });
}

}  // namespace ntp::cpu
