#include "kernels/cpu/zero.hpp"

#include <omp.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {

// From 16 MB on, an array is larger than a core's share of the caches: streaming past them costs
// nothing that a later pass would have found there.
constexpr long kStreamMinElems = 1L << 22;

NTP_AVX2 void zero_streaming(float* p, long n) {
  long i = 0;
  for (; i < n && (reinterpret_cast<std::uintptr_t>(p + i) & 31) != 0; i++) p[i] = 0.0f;  // to 32-byte alignment
  const __m256 z = _mm256_setzero_ps();
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(p + i, z);
  for (; i < n; i++) p[i] = 0.0f;
  _mm_sfence();  // the streaming stores are visible before the thread leaves the parallel region
}

}  // namespace

void zero(float* p, long n) {
  if (n <= 0) return;
  if (n < kStreamMinElems || !detail::has_avx2_fma()) {
    std::memset(p, 0, std::size_t(n) * sizeof(float));
    return;
  }
#pragma omp parallel
  {
    const int t = omp_get_thread_num(), T = omp_get_num_threads();
    const long i0 = n * t / T, i1 = n * (t + 1) / T;
    zero_streaming(p + i0, i1 - i0);
  }
}

}  // namespace ntp::cpu
