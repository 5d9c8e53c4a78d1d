#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/zero.hpp.
namespace ntp::ref {

void zero(float* p, long n);

}  // namespace ntp::ref
