#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/moe_router.hpp.
namespace ntp::ref {

void moe_router_forward(const float* logits, long T, int E, int k, long capacity, int* expert, float* weight,
                        char* kept, float* probs, long* tokens_per_expert, long* dropped, float* aux_loss);
void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* weight,
                         const float* dweight, long T, int E, int k, float aux_scale);

}  // namespace ntp::ref
