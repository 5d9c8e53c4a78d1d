#include "kernels/cuda/rope.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;

// One thread per rotated pair: n = B T NH HS/2.
__global__ void rotate_kernel(float* x, int T, int NH, int HS, double theta, float sign, long n) {
  const int half = HS / 2;
  for (long p = blockIdx.x * long(blockDim.x) + threadIdx.x; p < n; p += long(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(p % half);
    const long head = p / half;  // (b T + t) NH + h
    const int t = static_cast<int>((head / NH) % T);
    const double angle = t * pow(theta, -2.0 * i / HS);
    double s, c;
    sincos(angle, &s, &c);
    const float cf = static_cast<float>(c), sf = sign * static_cast<float>(s);
    float* v = x + head * HS;
    const float a = v[i], b = v[i + half];
    v[i] = a * cf - b * sf;
    v[i + half] = b * cf + a * sf;
  }
}

void rotate(float* x, int B, int T, int NH, int HS, float theta, float sign, cudaStream_t stream) {
  const long n = long(B) * T * NH * (HS / 2);
  if (n <= 0) return;
  rotate_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(x, T, NH, HS, theta, sign, n);
  NTP_CUDA_LAUNCHED();
}
}  // namespace

void rope_forward(float* x, int B, int T, int NH, int HS, float theta, cudaStream_t stream) {
  rotate(x, B, T, NH, HS, theta, 1.0f, stream);
}
void rope_backward(float* dx, int B, int T, int NH, int HS, float theta, cudaStream_t stream) {
  rotate(dx, B, T, NH, HS, theta, -1.0f, stream);
}

}  // namespace ntp::cuda
