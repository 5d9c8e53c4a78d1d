#pragma once
// Whether a pointer is device (or managed) memory: the CUDA backend's question, and the NCCL
// communicator's (NCCL takes device memory; plain host memory goes through MPI). CUDA builds only.
#include <cuda_runtime.h>

namespace ntp {

inline bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // clear the error a host pointer leaves
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

}  // namespace ntp
