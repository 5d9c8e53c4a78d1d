#pragma once
// AdamW and the squared norm on the GPU; contracts as kernels/cpu/adamw.hpp.
#include <cuda_runtime.h>

#include <cstddef>

namespace ntp::cuda {

// For each i: g = grads[i] * grad_scale; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// params[i] -= lr * ((m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * params[i]).
void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t, cudaStream_t stream);

// sum_i x[i]^2 in double, deterministic: a fixed grid of block partials, then one block sums
// them in a fixed order. `scratch` holds sum_squares_scratch() doubles; the result is left in
// scratch[0] (device) and returned (the call synchronises `stream` to read it).
double sum_squares(const float* x, long n, double* scratch, cudaStream_t stream);
std::size_t sum_squares_scratch();

}  // namespace ntp::cuda
