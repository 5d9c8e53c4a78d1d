#include "kernels/cuda/detail/column_sum.cuh"
#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda::detail {

namespace {

// grid (ceil(C / kThreads), chunks): thread c of chunk k sums rows [k*kChunkRows, ...) of column c.
__global__ void column_partials_kernel(float* partials, const float* in, int R, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int k = blockIdx.y;
  if (c >= C) return;
  const int r0 = k * kChunkRows, r1 = min(R, r0 + kChunkRows);
  float s = 0.0f;
  for (int r = r0; r < r1; r++) s += in[std::size_t(r) * C + c];
  partials[std::size_t(k) * C + c] = s;
}

__global__ void add_partials_kernel(float* out, const float* partials, int chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float s = 0.0f;
  for (int k = 0; k < chunks; k++) s += partials[std::size_t(k) * C + c];
  out[c] += s;
}

}  // namespace

void column_sum_add(float* out, const float* in, int R, int C, float* scratch, cudaStream_t stream) {
  if (R <= 0 || C <= 0) return;
  const int chunks = column_chunks(R);
  const dim3 grid((C + kThreads - 1) / kThreads, chunks);
  column_partials_kernel<<<grid, kThreads, 0, stream>>>(scratch, in, R, C);
  NTP_CUDA_LAUNCHED();
  add_column_partials(out, scratch, chunks, C, stream);
}

void add_column_partials(float* out, const float* partials, int chunks, int C, cudaStream_t stream) {
  if (C <= 0) return;
  add_partials_kernel<<<(C + kThreads - 1) / kThreads, kThreads, 0, stream>>>(out, partials, chunks, C);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda::detail
