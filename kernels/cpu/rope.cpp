#include "kernels/cpu/rope.hpp"

#include <cmath>
#include <vector>

#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu {

namespace {
// cos and sin of every (position, pair) once, [T, HS/2] each; sign -1 gives the transpose.
void rotate(float* x, int B, int T, int NH, int HS, float theta, float sign) {
  const int half = HS / 2;
  std::vector<float> cs(static_cast<size_t>(T) * half), sn(cs.size());
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      const double angle = t * std::pow(static_cast<double>(theta), -2.0 * i / HS);
      cs[static_cast<size_t>(t) * half + i] = static_cast<float>(std::cos(angle));
      sn[static_cast<size_t>(t) * half + i] = sign * static_cast<float>(std::sin(angle));
    }
  const long rows = static_cast<long>(B) * T;
#pragma omp parallel for schedule(static) if (rows * NH * HS >= detail::kParallelMinElems)
  for (long r = 0; r < rows; r++) {
    const float* c = cs.data() + (r % T) * half;
    const float* s = sn.data() + (r % T) * half;
    for (int h = 0; h < NH; h++) {
      float* v = x + (r * NH + h) * HS;
#pragma omp simd
      for (int i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}
}  // namespace

void rope_forward(float* x, int B, int T, int NH, int HS, float theta) { rotate(x, B, T, NH, HS, theta, 1.0f); }
void rope_backward(float* dx, int B, int T, int NH, int HS, float theta) { rotate(dx, B, T, NH, HS, theta, -1.0f); }

}  // namespace ntp::cpu
