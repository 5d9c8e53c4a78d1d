#pragma once
// Internal to kernels/cpu: splits an elementwise loop into fixed pieces for OpenMP, so each
// thread streams contiguous memory and small tensors stay on the calling thread.
#include "kernels/cpu/detail/vec_math.hpp"

namespace ntp::cpu::detail {

constexpr long kElementwiseChunk = 4096;  // elements per OpenMP work item (16 KiB of each array)

// Calls body(i0, n) for each `chunk`-element piece of [0, N), in parallel when N >= parallel_min.
template <typename Body>
void for_each_chunk(long N, Body body, long chunk = kElementwiseChunk, long parallel_min = kParallelMinElems) {
  const long chunks = (N + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (N >= parallel_min)
  for (long ch = 0; ch < chunks; ch++) {
    const long i0 = ch * chunk;
    body(i0, N - i0 < chunk ? N - i0 : chunk);
  }
}

}  // namespace ntp::cpu::detail
