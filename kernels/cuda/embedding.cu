#include "kernels/cuda/embedding.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;

__global__ void embedding_forward_kernel(float* out, const int* tokens, const float* wte, const int* local_row,
                                         long n, int C) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const long bt = i / C, c = i % C;
    const int row = local_row[tokens[bt]];
    out[i] = row >= 0 ? wte[long(row) * C + c] : 0.0f;
  }
}

// grid (BT, ceil(C / kThreads)). Block (bt, cb) does nothing unless bt is the first position of
// its token; then thread c sums dout[j, c] over every position j >= bt holding the same token,
// in order, and adds the sum to the token's row once.
__global__ void embedding_backward_kernel(float* dwte, const float* dout, const int* tokens, const int* local_row,
                                          int BT, int C) {
  const int bt = blockIdx.x;
  const int tok = tokens[bt];
  const int row = local_row[tok];
  if (row < 0) return;  // the same for the whole block
  int earlier = 0;
  for (int j = threadIdx.x; j < bt; j += blockDim.x) earlier |= tokens[j] == tok;
  if (__syncthreads_or(earlier)) return;
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int j = bt; j < BT; j++)
    if (tokens[j] == tok) s += dout[long(j) * C + c];
  dwte[long(row) * C + c] += s;
}

__global__ void position_forward_kernel(float* out, const float* wpe, long n, int T, int C) {
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const long t = (i / C) % T, c = i % C;
    out[i] += wpe[t * C + c];
  }
}

__global__ void position_backward_kernel(float* dwpe, const float* dout, int B, int T, int C) {
  const long n = long(T) * C;
  for (long i = blockIdx.x * long(blockDim.x) + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int b = 0; b < B; b++) s += dout[long(b) * n + i];
    dwpe[i] += s;
  }
}
}  // namespace

void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT, int C,
                       cudaStream_t stream) {
  const long n = long(BT) * C;
  if (n <= 0) return;
  embedding_forward_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(out, tokens, wte, local_row, n, C);
  NTP_CUDA_LAUNCHED();
}

void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT, int C,
                        cudaStream_t stream) {
  if (BT <= 0 || C <= 0) return;
  const dim3 grid(BT, (C + kThreads - 1) / kThreads);
  embedding_backward_kernel<<<grid, kThreads, 0, stream>>>(dwte, dout, tokens, local_row, BT, C);
  NTP_CUDA_LAUNCHED();
}

void position_embedding_forward(float* out, const float* wpe, int B, int T, int C, cudaStream_t stream) {
  const long n = long(B) * T * C;
  if (n <= 0) return;
  position_forward_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(out, wpe, n, T, C);
  NTP_CUDA_LAUNCHED();
}

void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C, cudaStream_t stream) {
  const long n = long(T) * C;
  if (n <= 0) return;
  position_backward_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(dwpe, dout, B, T, C);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda
