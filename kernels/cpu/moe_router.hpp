#pragma once
// Mixture-of-experts routing, as Mixtral routes: each token's top-k experts by router logit (ties:
// the lower expert), weighted by the softmax over those k logits. Each expert takes at most
// `capacity` of the assignments, in token order (capacity <= 0: no limit); an assignment past it is
// dropped (kept = 0) and its weight is not renormalized onto the others: that share of the token is
// lost, as in Switch Transformer. The load-balancing loss (Switch Transformer's, as Mixtral trains
// it): aux = E * sum_e f_e P_e, f_e the share of the T*k assignments, before capacity, that chose e,
// P_e the mean over tokens of the softmax over all E logits.
namespace ntp::cpu {

// logits [T, E] -> expert, weight, kept [T, k] (slot j of token t at t*k + j, by falling logit),
// probs [T, E] (the full softmax, kept for the backward), tokens_per_expert [E] (kept assignments),
// *dropped (assignments dropped), *aux_loss.
void moe_router_forward(const float* logits, long T, int E, int k, long capacity, int* expert, float* weight,
                        char* kept, float* probs, long* tokens_per_expert, long* dropped, float* aux_loss);
// dlogits [T, E] += the gradient of sum(dweight * weight) + aux_scale * aux, through both softmaxes
// (f_e counts assignments: it has no gradient). A dropped slot's dweight is the caller's: 0 where
// the token's output does not use it.
void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* weight,
                         const float* dweight, long T, int E, int k, float aux_scale);

}  // namespace ntp::cpu
