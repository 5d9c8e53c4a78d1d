#pragma once
// fp32 -> bf16 on the GPU: the operands of the bf16 GEMMs (--precision bf16). The fp32 buffers
// stay the source of truth; a bf16 copy is scratch for one GEMM call.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace ntp::cuda {

// out[i] = in[i] rounded to the nearest bf16 (ties to even; NaN stays NaN, overflow gives inf).
void cast_to_bf16(__nv_bfloat16* out, const float* in, long N, cudaStream_t stream);

}  // namespace ntp::cuda
