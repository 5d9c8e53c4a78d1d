#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/adamw.hpp.
namespace ntp::ref {

void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t);

double sum_squares(const float* x, long n);

}  // namespace ntp::ref
