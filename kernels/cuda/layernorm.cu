#include "kernels/cuda/layernorm.cuh"

#include "kernels/cuda/detail/column_sum.cuh"
#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;
using detail::kWarp;
constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / kWarp;

__global__ void forward_kernel(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                               const float* bias, int BT, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= BT) return;
  const float* x = inp + std::size_t(row) * C;
  float* o = out + std::size_t(row) * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += kWarp) s += x[i];
  const float m = detail::warp_sum(s) / C;
  float v = 0.0f;  // two-pass variance, as the CPU kernel
  for (int i = lane; i < C; i += kWarp) v += (x[i] - m) * (x[i] - m);
  v = detail::warp_sum(v) / C;
  const float r = 1.0f / sqrtf(v + kEps);
  for (int i = lane; i < C; i += kWarp) o[i] = (x[i] - m) * r * weight[i] + bias[i];
  if (lane == 0) mean[row] = m, rstd[row] = r;
}

// dinp rows, one warp per row.
__global__ void backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                      const float* mean, const float* rstd, int BT, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= BT) return;
  const float* g = dout + std::size_t(row) * C;
  const float* x = inp + std::size_t(row) * C;
  float* dx = dinp + std::size_t(row) * C;
  const float m = mean[row], r = rstd[row];
  float dm = 0.0f, dnm = 0.0f;
  for (int i = lane; i < C; i += kWarp) {
    const float dnorm = weight[i] * g[i];
    dm += dnorm;
    dnm += dnorm * (x[i] - m) * r;
  }
  dm = detail::warp_sum(dm) / C;
  dnm = detail::warp_sum(dnm) / C;
  for (int i = lane; i < C; i += kWarp) {
    const float norm = (x[i] - m) * r;
    dx[i] += (weight[i] * g[i] - dm - norm * dnm) * r;
  }
}

// Stage 1 of dweight/dbias: grid (ceil(C / kThreads), chunks); partials [2, chunks, C].
__global__ void backward_param_partials_kernel(float* partials, const float* dout, const float* inp,
                                               const float* mean, const float* rstd, int BT, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= C) return;
  const int r0 = k * detail::kChunkRows, r1 = min(BT, r0 + detail::kChunkRows);
  float pw = 0.0f, pb = 0.0f;
  for (int r = r0; r < r1; r++) {
    const float g = dout[std::size_t(r) * C + c];
    pb += g;
    pw += (inp[std::size_t(r) * C + c] - mean[r]) * rstd[r] * g;
  }
  const std::size_t plane = std::size_t(gridDim.y) * C;
  partials[std::size_t(k) * C + c] = pw;
  partials[plane + std::size_t(k) * C + c] = pb;
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int BT, int C, cudaStream_t stream) {
  if (BT <= 0 || C <= 0) return;
  forward_kernel<<<(BT + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(out, mean, rstd, inp, weight,
                                                                                    bias, BT, C);
  NTP_CUDA_LAUNCHED();
}

std::size_t layernorm_backward_scratch(int BT, int C) { return 2 * detail::column_sum_scratch(BT, C); }

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                        const float* weight, const float* mean, const float* rstd, int BT, int C, float* scratch,
                        cudaStream_t stream) {
  if (BT <= 0 || C <= 0) return;
  backward_input_kernel<<<(BT + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(dinp, dout, inp, weight,
                                                                                           mean, rstd, BT, C);
  NTP_CUDA_LAUNCHED();
  const int chunks = detail::column_chunks(BT);
  const dim3 grid((C + kThreads - 1) / kThreads, chunks);
  backward_param_partials_kernel<<<grid, kThreads, 0, stream>>>(scratch, dout, inp, mean, rstd, BT, C);
  NTP_CUDA_LAUNCHED();
  detail::add_column_partials(dweight, scratch, chunks, C, stream);
  detail::add_column_partials(dbias, scratch + std::size_t(chunks) * C, chunks, C, stream);
}

}  // namespace ntp::cuda
