#pragma once
// Internal to kernels/cuda: row-major GEMMs on column-major cuBLAS, with cblas_sgemm's
// RowMajor argument order, so each call reads like its CPU twin in kernels/cpu.
// Row-major C [M, N] = alpha op(A) [M, K] @ op(B) [K, N] + beta C is computed as the
// column-major C^T = op(B)^T op(A)^T: a row-major buffer viewed column-major is its transpose.
#include <cublas_v2.h>

#include "kernels/cuda/detail/common.cuh"

namespace ntp::cuda::detail {

inline void gemm_rowmajor(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha, const float* A,
                          int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  NTP_CUBLAS_CHECK(cublasSgemm(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B,
                               ldb, A, lda, &beta, C, ldc));
}

// `batch` independent products; matrix i of A/B/C starts at A + i*sA (etc.).
inline void gemm_rowmajor_batched(cublasHandle_t h, bool ta, bool tb, int M, int N, int K, float alpha,
                                  const float* A, int lda, long long sA, const float* B, int ldb, long long sB,
                                  float beta, float* C, int ldc, long long sC, int batch) {
  NTP_CUBLAS_CHECK(cublasSgemmStridedBatched(h, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N, N, M,
                                             K, &alpha, B, ldb, sB, A, lda, sA, &beta, C, ldc, sC, batch));
}

}  // namespace ntp::cuda::detail
