#include "kernels/cuda/gqa.cuh"

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda {

namespace {
using detail::kThreads;

// One thread per query feature: n = BT NH HS.
__global__ void pack_kernel(float* qkv, const float* q, const float* k, const float* v, int NH, int NKV, int HS,
                            long n) {
  const int group = NH / NKV;
  for (long e = blockIdx.x * long(blockDim.x) + threadIdx.x; e < n; e += long(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(e % HS), h = static_cast<int>((e / HS) % NH);
    const long bt = e / (long(HS) * NH);
    const long kv = (bt * NKV + h / group) * HS + i;
    float* o = qkv + (bt * NH + h) * 3 * HS + i;
    o[0] = q[e];
    o[HS] = k[kv];
    o[2 * HS] = v[kv];
  }
}

// dq: one thread per query feature. dk, dv: one thread per key/value feature, summing its group's
// query heads in ascending order (as the CPU kernel; no atomics).
__global__ void unpack_q_kernel(float* dq, const float* dqkv, int NH, int HS, long n) {
  for (long e = blockIdx.x * long(blockDim.x) + threadIdx.x; e < n; e += long(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(e % HS);
    dq[e] += dqkv[(e / HS) * 3 * HS + i];
  }
}
__global__ void unpack_kv_kernel(float* dk, float* dv, const float* dqkv, int NH, int NKV, int HS, long n) {
  const int group = NH / NKV;
  for (long e = blockIdx.x * long(blockDim.x) + threadIdx.x; e < n; e += long(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(e % HS), g = static_cast<int>((e / HS) % NKV);
    const long bt = e / (long(HS) * NKV);
    float sk = 0.0f, sv = 0.0f;
    for (int h = g * group; h < (g + 1) * group; h++) {
      const float* in = dqkv + (bt * NH + h) * 3 * HS + i;
      sk += in[HS];
      sv += in[2 * HS];
    }
    dk[e] += sk;
    dv[e] += sv;
  }
}
}  // namespace

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV, int HS,
                      cudaStream_t stream) {
  const long n = long(BT) * NH * HS;
  if (n <= 0) return;
  pack_kernel<<<detail::grid_for(n), kThreads, 0, stream>>>(qkv, q, k, v, NH, NKV, HS, n);
  NTP_CUDA_LAUNCHED();
}

void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV, int HS,
                       cudaStream_t stream) {
  const long nq = long(BT) * NH * HS, nkv = long(BT) * NKV * HS;
  if (nq <= 0) return;
  unpack_q_kernel<<<detail::grid_for(nq), kThreads, 0, stream>>>(dq, dqkv, NH, HS, nq);
  NTP_CUDA_LAUNCHED();
  unpack_kv_kernel<<<detail::grid_for(nkv), kThreads, 0, stream>>>(dk, dv, dqkv, NH, NKV, HS, nkv);
  NTP_CUDA_LAUNCHED();
}

}  // namespace ntp::cuda
