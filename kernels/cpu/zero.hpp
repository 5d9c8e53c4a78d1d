#pragma once
namespace ntp::cpu {

// p[0..n) = 0. Large arrays (the gradient arena before a step's backward: 0.5 GB for gpt2) with
// every OpenMP thread and streaming stores, which do not read the lines they overwrite; small ones
// (activations that are used again at once) with memset, which keeps them in cache.
void zero(float* p, long n);

}  // namespace ntp::cpu
