#include "kernels/cpu/reference/rope.hpp"

#include <cmath>

namespace ntp::ref {

namespace {
void rotate(float* x, int B, int T, int NH, int HS, float theta, float sign) {
  const int half = HS / 2;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < NH; h++) {
        float* v = x + ((static_cast<long>(b) * T + t) * NH + h) * HS;
        for (int i = 0; i < half; i++) {
          const double angle = t * std::pow(static_cast<double>(theta), -2.0 * i / HS);
          const float c = static_cast<float>(std::cos(angle)), s = sign * static_cast<float>(std::sin(angle));
          const float a = v[i], bb = v[i + half];
          v[i] = a * c - bb * s;
          v[i + half] = bb * c + a * s;
        }
      }
}
}  // namespace

void rope_forward(float* x, int B, int T, int NH, int HS, float theta) { rotate(x, B, T, NH, HS, theta, 1.0f); }
void rope_backward(float* dx, int B, int T, int NH, int HS, float theta) { rotate(dx, B, T, NH, HS, theta, -1.0f); }

}  // namespace ntp::ref
