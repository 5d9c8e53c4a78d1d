#pragma once
// Internal to kernels/cuda: row-major GEMMs on column-major cuBLAS, with cblas_sgemm's
// RowMajor argument order, so each call reads like its CPU twin in kernels/cpu.
// Row-major C [M, N] = alpha op(A) [M, K] @ op(B) [K, N] + beta C is computed as the
// column-major C^T = op(B)^T op(A)^T: a row-major buffer viewed column-major is its transpose.
//
// Each GEMM has two operand types with one output type, fp32: fp32 operands go to cublasSgemm;
// bf16 operands go to cublasGemmEx (CUDA_R_16BF in, CUDA_R_32F out, CUBLAS_COMPUTE_32F: the
// products are exact in fp32 and accumulate in fp32, so only the operands' rounding differs).
// A kernel written once over the operand type T serves both: gemm_operand() hands it fp32 data
// as it is, or as a bf16 copy cast into scratch.
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <cstddef>

#include "kernels/cuda/cast.cuh"
#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda::detail {

inline cublasOperation_t op(bool t) { return t ? CUBLAS_OP_T : CUBLAS_OP_N; }

inline void gemm_rowmajor(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  NTP_CUBLAS_CHECK(cublasSgemm(h, op(tb), op(ta), N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

inline void gemm_rowmajor(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                          const __nv_bfloat16* A, int lda, const __nv_bfloat16* B, int ldb, float beta, float* C,
                          int ldc) {
  NTP_CUBLAS_CHECK(cublasGemmEx(h, op(tb), op(ta), N, M, K, &alpha, B, CUDA_R_16BF, ldb, A, CUDA_R_16BF, lda, &beta,
                                C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// `batch` independent products; matrix i of A/B/C starts at A + i*sA (etc.).
inline void gemm_rowmajor_batched(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                                  const float* A, int lda, long long sA, const float* B, int ldb, long long sB,
                                  float beta, float* C, int ldc, long long sC, int batch) {
  NTP_CUBLAS_CHECK(cublasSgemmStridedBatched(h, op(tb), op(ta), N, M, K, &alpha, B, ldb, sB, A, lda, sA, &beta, C,
                                             ldc, sC, batch));
}

inline void gemm_rowmajor_batched(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                                  const __nv_bfloat16* A, int lda, long long sA, const __nv_bfloat16* B, int ldb,
                                  long long sB, float beta, float* C, int ldc, long long sC, int batch) {
  NTP_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, op(tb), op(ta), N, M, K, &alpha, B, CUDA_R_16BF, ldb, sB, A,
                                              CUDA_R_16BF, lda, sA, &beta, C, CUDA_R_32F, ldc, sC, batch,
                                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Scratch elements a bf16 copy of n floats takes: rounded up so that every copy starts 256-byte
// aligned (as cudaMalloc's buffers), which keeps cuBLAS's vectorised tensor-core kernels usable.
inline std::size_t operand_elems(std::size_t n) {
  constexpr std::size_t kAlign = 256 / sizeof(__nv_bfloat16);
  return (n + kAlign - 1) / kAlign * kAlign;
}

// The GEMM operand for the n floats at x. fp32 GEMMs read x itself (no copy, `cursor` untouched);
// bf16 GEMMs read a bf16 copy cast into the scratch at `cursor`, which then moves past it
// (operand_elems(n) elements).
inline const float* gemm_operand(const float* x, long, float*&, cudaStream_t) { return x; }
inline const __nv_bfloat16* gemm_operand(const float* x, long n, __nv_bfloat16*& cursor, cudaStream_t stream) {
  __nv_bfloat16* copy = cursor;
  cast_to_bf16(copy, x, n, stream);
  cursor += operand_elems(static_cast<std::size_t>(n));
  return copy;
}

}  // namespace ntp::cuda::detail
