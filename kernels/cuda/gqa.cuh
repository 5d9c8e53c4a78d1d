#pragma once
// Grouped-query attention's pack on the GPU; contracts as kernels/cpu/gqa.hpp.
#include <cuda_runtime.h>

namespace ntp::cuda {

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV, int HS,
                      cudaStream_t stream);
void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV, int HS,
                       cudaStream_t stream);

}  // namespace ntp::cuda
