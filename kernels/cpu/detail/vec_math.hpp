#pragma once
// Internal to kernels/cpu: AVX2+FMA building blocks for the memory- and transcendental-bound
// kernels, with a run-time check so the library still runs (on the plain loops) on CPUs without
// AVX2. The build targets x86-64-v2, so these functions carry their own target attribute.
//
// exp8: Cephes-style expf (range reduction by ln 2, degree-5 polynomial), about 2 ulp on
// [-87, 88.37]; returns exactly 0 below -87 (instead of a denormal) and saturates above.
#include <immintrin.h>

namespace ntp::cpu::detail {

// Below this many elements a memory-bound loop runs on the calling thread only. An OpenMP
// fork/join costs microseconds on idle cores, but up to a scheduler time slice (milliseconds) when
// the cores are shared with other processes and a worker has been descheduled; one core streams
// 1M floats in well under a millisecond. (GEMMs, attention and the vocabulary-wide cross-entropy
// keep their threads.)
constexpr long kParallelMinElems = 1L << 20;
// The optimizer's per-tensor loops (read 4, write 3 arrays per element) go parallel earlier.
constexpr long kParallelMinOptimizer = 1L << 18;

inline bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

#define NTP_AVX2 __attribute__((target("avx2,fma")))

NTP_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 hi = _mm256_set1_ps(88.3762626647949f), lo = _mm256_set1_ps(-87.0f);
  const __m256 zero_mask = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
  x = _mm256_min_ps(x, hi);
  x = _mm256_max_ps(x, lo);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 r2 = _mm256_mul_ps(r, r);
  p = _mm256_fmadd_ps(p, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(zero_mask, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// tanh(u) = sign(u) (1 - 2 / (exp(2|u|) + 1)); |u| capped at 9, where tanh rounds to 1 in float.
NTP_AVX2 inline __m256 tanh8(__m256 u) {
  const __m256 sign = _mm256_and_ps(u, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_min_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), u), _mm256_set1_ps(9.0f));
  const __m256 e = exp8(_mm256_add_ps(a, a));
  const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                 _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  return _mm256_or_ps(t, sign);
}

NTP_AVX2 inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

NTP_AVX2 inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

NTP_AVX2 inline double hsum4d(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

}  // namespace ntp::cpu::detail
