#include "kernels/cpu/reference/zero.hpp"

namespace ntp::ref {

void zero(float* p, long n) {
  for (long i = 0; i < n; i++) p[i] = 0.0f;
}

}  // namespace ntp::ref
