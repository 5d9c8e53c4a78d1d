#pragma once
// Internal to kernels/cuda: error checks, launch sizes and warp/block reductions.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ntp::cuda::detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + std::to_string(int(e)) +
                           "): " + cudaGetErrorString(e) + " in " + what + " at " + file + ":" + std::to_string(line));
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("cuBLAS error ") + cublasGetStatusName(s) + ": " + cublasGetStatusString(s) +
                           " in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace ntp::cuda::detail

#define NTP_CUDA_CHECK(call)                                                                  \
  do {                                                                                        \
    const cudaError_t ntp_e_ = (call);                                                        \
    if (ntp_e_ != cudaSuccess) ::ntp::cuda::detail::throw_cuda(ntp_e_, #call, __FILE__, __LINE__); \
  } while (0)
#define NTP_CUBLAS_CHECK(call)                                                                      \
  do {                                                                                              \
    const cublasStatus_t ntp_s_ = (call);                                                           \
    if (ntp_s_ != CUBLAS_STATUS_SUCCESS) ::ntp::cuda::detail::throw_cublas(ntp_s_, #call, __FILE__, __LINE__); \
  } while (0)
// After every kernel launch: reports a bad launch configuration at the call that made it.
#define NTP_CUDA_LAUNCHED() NTP_CUDA_CHECK(cudaGetLastError())

namespace ntp::cuda::detail {

constexpr int kThreads = 256;  // threads per block of the elementwise and per-row kernels
constexpr int kWarp = 32;

// Blocks for a grid-stride loop over n elements (capped: each thread then takes several).
inline unsigned grid_for(long n, int threads = kThreads) {
  const long blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks);
}

template <typename T>
__device__ inline T warp_sum(T v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// A fixed tree: the result is the same from run to run. Uses `shared` (32 Ts) and syncs twice.
template <typename T>
__device__ inline T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}
__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

}  // namespace ntp::cuda::detail
