#include "kernels/cuda/rmsnorm.cuh"

#include "kernels/cuda/detail/column_sum.cuh"
#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;
using detail::kWarp;
constexpr float kEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / kWarp;

__global__ void forward_kernel(float* out, float* rstd, const float* inp, const float* weight, int BT, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= BT) return;
  const float* x = inp + std::size_t(row) * C;
  float* o = out + std::size_t(row) * C;
  float ss = 0.0f;
  for (int i = lane; i < C; i += kWarp) ss += x[i] * x[i];
  const float r = 1.0f / sqrtf(detail::warp_sum(ss) / C + kEps);
  for (int i = lane; i < C; i += kWarp) o[i] = x[i] * r * weight[i];
  if (lane == 0) rstd[row] = r;
}

__global__ void backward_input_kernel(float* dinp, const float* dout, const float* inp, const float* weight,
                                      const float* rstd, int BT, int C) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (row >= BT) return;
  const float* g = dout + std::size_t(row) * C;
  const float* x = inp + std::size_t(row) * C;
  float* dx = dinp + std::size_t(row) * C;
  const float r = rstd[row];
  float dot = 0.0f;
  for (int i = lane; i < C; i += kWarp) dot += weight[i] * g[i] * x[i];
  const float k = r * r * r * detail::warp_sum(dot) / C;
  for (int i = lane; i < C; i += kWarp) dx[i] += r * weight[i] * g[i] - x[i] * k;
}

// Stage 1 of dweight: grid (ceil(C / kThreads), chunks); partials [chunks, C].
__global__ void backward_weight_partials_kernel(float* partials, const float* dout, const float* inp,
                                                const float* rstd, int BT, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= C) return;
  const int r0 = k * detail::kChunkRows, r1 = min(BT, r0 + detail::kChunkRows);
  float pw = 0.0f;
  for (int r = r0; r < r1; r++) pw += dout[std::size_t(r) * C + c] * inp[std::size_t(r) * C + c] * rstd[r];
  partials[std::size_t(k) * C + c] = pw;
}
}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C,
                     cudaStream_t stream) {
  if (BT <= 0 || C <= 0) return;
  forward_kernel<<<(BT + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(out, rstd, inp, weight, BT, C);
  NTP_CUDA_LAUNCHED();
}

std::size_t rmsnorm_backward_scratch(int BT, int C) { return detail::column_sum_scratch(BT, C); }

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                      const float* rstd, int BT, int C, float* scratch, cudaStream_t stream) {
  if (BT <= 0 || C <= 0) return;
  backward_input_kernel<<<(BT + kRowsPerBlock - 1) / kRowsPerBlock, kThreads, 0, stream>>>(dinp, dout, inp, weight,
                                                                                           rstd, BT, C);
  NTP_CUDA_LAUNCHED();
  const int chunks = detail::column_chunks(BT);
  const dim3 grid((C + kThreads - 1) / kThreads, chunks);
  backward_weight_partials_kernel<<<grid, kThreads, 0, stream>>>(scratch, dout, inp, rstd, BT, C);
  NTP_CUDA_LAUNCHED();
  detail::add_column_partials(dweight, scratch, chunks, C, stream);
}

}  // namespace ntp::cuda
