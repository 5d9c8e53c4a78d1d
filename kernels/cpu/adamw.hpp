#pragma once
// AdamW (Loshchilov & Hutter) with bias correction and decoupled weight decay.
namespace ntp::cpu {

// For each i: g = grads[i] * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
// params[i] -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + weight_decay * params[i] ).
// t is the 1-based step count.
void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, float grad_scale, int t);

// sum_i x[i]^2, accumulated in double.
double sum_squares(const float* x, long n);

}  // namespace ntp::cpu
