#pragma once
// Internal to kernels/cuda: deterministic sums over the rows of a [R, C] matrix. Stage 1 sums
// fixed chunks of kChunkRows rows into partials [chunks, C]; stage 2 adds each column's partials
// in chunk order to out[C]. No atomics, so the result is the same bits on every run.
#include <cuda_runtime.h>

#include <cstddef>

namespace ntp::cuda::detail {

constexpr int kChunkRows = 64;
inline int column_chunks(int R) { return (R + kChunkRows - 1) / kChunkRows; }
// Scratch floats column_sum_add needs.
inline std::size_t column_sum_scratch(int R, int C) { return std::size_t(column_chunks(R)) * C; }

// out[c] += sum_r in[r, c]
void column_sum_add(float* out, const float* in, int R, int C, float* scratch, cudaStream_t stream);
// out[c] += sum_k partials[k, c] for k in [0, chunks), in order.
void add_column_partials(float* out, const float* partials, int chunks, int C, cudaStream_t stream);

}  // namespace ntp::cuda::detail
