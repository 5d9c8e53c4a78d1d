#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/moe_dispatch.hpp.
namespace ntp::ref {

void moe_plan(const int* expert, const char* kept, long T, int E, int k, long* offsets, long* row_of);
void moe_dispatch_forward(float* xs, const float* x, const long* row_of, long T, int k, int C);
void moe_dispatch_backward(float* dx, const float* dxs, const long* row_of, long T, int k, int C);
void moe_combine_forward(float* y, const float* ys, const float* weight, const long* row_of, long T, int k, int C);
void moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                          const long* row_of, long T, int k, int C);

}  // namespace ntp::ref
