#include "kernels/cuda/attention.cuh"

#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/detail/gemm.cuh"

namespace ntp::cuda {

namespace {
using detail::gemm_operand;
using detail::gemm_rowmajor_batched;
using detail::kThreads;
using detail::kWarp;
constexpr int kRowsPerBlock = kThreads / kWarp;

// One warp per score row r of [B*NH*T, T]; row r is query position t = r % T, which sees
// columns 0..t. Normalised in place; columns above t are zeroed.
__global__ void causal_softmax_kernel(float* att, long rows, int T) {
  const long r = blockIdx.x * long(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  float* a = att + r * T;
  const int n = int(r % T) + 1;
  float mx = -INFINITY;
  for (int j = lane; j < n; j += kWarp) mx = fmaxf(mx, a[j]);
  mx = detail::warp_max(mx);
  float sum = 0.0f;
  for (int j = lane; j < n; j += kWarp) {
    const float e = expf(a[j] - mx);
    a[j] = e;
    sum += e;
  }
  const float inv = 1.0f / detail::warp_sum(sum);
  for (int j = lane; j < n; j += kWarp) a[j] *= inv;
  for (int j = n + lane; j < T; j += kWarp) a[j] = 0.0f;
}

// Softmax backward per row, in place on d: d = a * (d - sum_j a d) on 0..t, zero above.
__global__ void causal_softmax_backward_kernel(float* d, const float* att, long rows, int T) {
  const long r = blockIdx.x * long(kRowsPerBlock) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= rows) return;
  float* dr = d + r * T;
  const float* a = att + r * T;
  const int n = int(r % T) + 1;
  float dot = 0.0f;
  for (int j = lane; j < n; j += kWarp) dot += a[j] * dr[j];
  dot = detail::warp_sum(dot);
  for (int j = lane; j < n; j += kWarp) dr[j] = a[j] * (dr[j] - dot);
  for (int j = n + lane; j < T; j += kWarp) dr[j] = 0.0f;
}

unsigned row_blocks(long rows) { return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock); }

// Per b, heads batched: Q, K, V of head h are [T, HS] views with row stride ld = NH*3*HS starting
// at h*3*HS; out/dout views have row stride ldo = NH*HS starting at h*HS; att blocks are [T, T].
// Written over the GEMM operand type Op (float: fp32 GEMMs; __nv_bfloat16: bf16 GEMMs on copies
// cast into `ops`, see detail/gemm.cuh). The softmax and its backward read and write fp32.

template <typename Op>
void forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS, Op* ops, cublasHandle_t handle,
             cudaStream_t stream) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
  const int ld = NH * 3 * HS, ldo = NH * HS;
  const long long sQ = 3LL * HS, sA = 1LL * T * T, sO = HS;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const Op* qkv_op = gemm_operand(qkv, long(B) * T * ld, ops, stream);
  Op* const per_b = ops;  // each b's att copy reuses the same scratch
  for (int b = 0; b < B; b++) {
    const Op* q = qkv_op + static_cast<std::size_t>(b) * T * ld;
    const Op* k = q + HS;
    const Op* v = q + 2 * HS;
    float* a = att + static_cast<std::size_t>(b) * NH * T * T;
    float* o = out + static_cast<std::size_t>(b) * T * ldo;
    // att = scale * Q K^T (all T x T; the softmax masks the upper triangle)
    gemm_rowmajor_batched(handle, false, true, T, T, HS, scale, q, ld, sQ, k, ld, sQ, 0.0f, a, T, sA, NH);
    const long rows = long(NH) * T;
    causal_softmax_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(a, rows, T);
    NTP_CUDA_LAUNCHED();
    // out = att @ V
    Op* cursor = per_b;
    const Op* a_op = gemm_operand(a, rows * T, cursor, stream);
    gemm_rowmajor_batched(handle, false, false, T, HS, T, 1.0f, a_op, T, sA, v, ld, sQ, 0.0f, o, ldo, sO, NH);
  }
}

template <typename Op>
void backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B, int T,
              int NH, int HS, Op* ops, cublasHandle_t handle, cudaStream_t stream) {
  if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) return;
  const int ld = NH * 3 * HS, ldo = NH * HS;
  const long long sQ = 3LL * HS, sA = 1LL * T * T, sO = HS;
  const float scale = 1.0f / sqrtf(static_cast<float>(HS));
  const Op* qkv_op = gemm_operand(qkv, long(B) * T * ld, ops, stream);
  const Op* dout_op = gemm_operand(dout, long(B) * T * ldo, ops, stream);
  Op* const per_b = ops;  // each b's att and datt copies reuse the same scratch
  for (int b = 0; b < B; b++) {
    const std::size_t qoff = static_cast<std::size_t>(b) * T * ld;
    const Op* q = qkv_op + qoff;
    const Op* k = q + HS;
    const Op* v = q + 2 * HS;
    float* dq = dqkv + qoff;
    float* dk = dq + HS;
    float* dv = dq + 2 * HS;
    const float* a = att + static_cast<std::size_t>(b) * NH * T * T;
    float* d = scratch + static_cast<std::size_t>(b) * NH * T * T;
    const Op* g = dout_op + static_cast<std::size_t>(b) * T * ldo;
    const long rows = long(NH) * T;
    Op* cursor = per_b;
    const Op* a_op = gemm_operand(a, rows * T, cursor, stream);
    // dV += att^T @ dout;  datt = dout @ V^T
    gemm_rowmajor_batched(handle, true, false, T, HS, T, 1.0f, a_op, T, sA, g, ldo, sO, 1.0f, dv, ld, sQ, NH);
    gemm_rowmajor_batched(handle, false, true, T, T, HS, 1.0f, g, ldo, sO, v, ld, sQ, 0.0f, d, T, sA, NH);
    causal_softmax_backward_kernel<<<row_blocks(rows), kThreads, 0, stream>>>(d, a, rows, T);
    NTP_CUDA_LAUNCHED();
    // pre = scale * Q K^T:  dQ += scale * dpre @ K;  dK += scale * dpre^T @ Q
    const Op* d_op = gemm_operand(d, rows * T, cursor, stream);
    gemm_rowmajor_batched(handle, false, false, T, HS, T, scale, d_op, T, sA, k, ld, sQ, 1.0f, dq, ld, sQ, NH);
    gemm_rowmajor_batched(handle, true, false, T, HS, T, scale, d_op, T, sA, q, ld, sQ, 1.0f, dk, ld, sQ, NH);
  }
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                       cublasHandle_t handle, cudaStream_t stream) {
  float* no_scratch = nullptr;  // fp32 GEMMs read the buffers themselves
  forward(out, att, qkv, B, T, NH, HS, no_scratch, handle, stream);
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS, cublasHandle_t handle, cudaStream_t stream) {
  float* no_scratch = nullptr;
  backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS, no_scratch, handle, stream);
}

std::size_t attention_bf16_scratch(int B, int T, int NH, int HS) {
  using detail::operand_elems;
  const std::size_t qkv = std::size_t(B) * T * NH * 3 * HS, out = std::size_t(B) * T * NH * HS;
  return operand_elems(qkv) + operand_elems(out) + 2 * operand_elems(std::size_t(NH) * T * T);
}

void attention_forward_bf16(float* out, float* att, const float* qkv, int B, int T, int NH, int HS,
                            __nv_bfloat16* bf16_scratch, cublasHandle_t handle, cudaStream_t stream) {
  forward(out, att, qkv, B, T, NH, HS, bf16_scratch, handle, stream);
}

void attention_backward_bf16(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att,
                             int B, int T, int NH, int HS, __nv_bfloat16* bf16_scratch, cublasHandle_t handle,
                             cudaStream_t stream) {
  backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS, bf16_scratch, handle, stream);
}

}  // namespace ntp::cuda
