#include "kernels/cuda/cross_entropy.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;

__global__ void local_max_kernel(float* row_max, const float* logits, int Vl) {
  __shared__ float shared[32];
  const float* x = logits + static_cast<std::size_t>(blockIdx.x) * Vl;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) mx = fmaxf(mx, x[j]);
  mx = detail::block_max(mx, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = mx;
}

__global__ void local_sums_kernel(float* sums, const float* logits, const float* row_max, const int* targets,
                                  const int* local_row, int Vl) {
  __shared__ double shared[32];
  const int bt = blockIdx.x;
  const float* x = logits + static_cast<std::size_t>(bt) * Vl;
  const float mx = row_max[bt];
  double s = 0.0;
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) s += expf(x[j] - mx);
  s = detail::block_sum(s, shared);
  if (threadIdx.x == 0) {
    const int row = local_row[targets[bt]];
    sums[2 * bt] = static_cast<float>(s);
    sums[2 * bt + 1] = row >= 0 ? x[row] : 0.0f;
  }
}

__global__ void loss_kernel(float* losses, const float* row_max, const float* sums, int BT) {
  const int bt = blockIdx.x * blockDim.x + threadIdx.x;
  if (bt < BT) losses[bt] = logf(sums[2 * bt]) + row_max[bt] - sums[2 * bt + 1];
}

// One block per row; each element is read before it is written by the same thread (aliasing ok).
__global__ void backward_kernel(float* dlogits, const float* logits, const float* row_max, const float* sums,
                                const int* targets, const int* local_row, float dloss, int Vl) {
  const int bt = blockIdx.x;
  const float* x = logits + static_cast<std::size_t>(bt) * Vl;
  float* d = dlogits + static_cast<std::size_t>(bt) * Vl;
  const float mx = row_max[bt];
  const float inv = 1.0f / sums[2 * bt];
  const int row = local_row[targets[bt]];
  for (int j = threadIdx.x; j < Vl; j += blockDim.x) {
    float g = expf(x[j] - mx) * inv * dloss;
    if (j == row) g -= dloss;
    d[j] = g;
  }
}
}  // namespace

void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl, cudaStream_t stream) {
  if (BT <= 0) return;
  local_max_kernel<<<BT, kThreads, 0, stream>>>(row_max, logits, Vl);
  NTP_CUDA_LAUNCHED();
}

void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                             const int* local_row, int BT, int Vl, cudaStream_t stream) {
  if (BT <= 0) return;
  local_sums_kernel<<<BT, kThreads, 0, stream>>>(sums, logits, row_max, targets, local_row, Vl);
  NTP_CUDA_LAUNCHED();
}

void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT, cudaStream_t stream) {
  if (BT <= 0) return;
  loss_kernel<<<(BT + kThreads - 1) / kThreads, kThreads, 0, stream>>>(losses, row_max, sums, BT);
  NTP_CUDA_LAUNCHED();
}

void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                           const int* targets, const int* local_row, float dloss, int BT, int Vl,
                           cudaStream_t stream) {
  if (BT <= 0 || Vl <= 0) return;
  backward_kernel<<<BT, kThreads, 0, stream>>>(dlogits, logits, row_max, sums, targets, local_row, dloss, Vl);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda
