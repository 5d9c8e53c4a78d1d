#pragma once
// Rotary position embeddings (RoPE) as Hugging Face's Llama applies them ("rotate half"): in each
// head of HS features (HS even), feature i and feature i + HS/2 rotate together by the angle
// t * theta^(-2i/HS), t the token's position in its sequence. x is [B, T, NH, HS]. Angles are
// computed in double and rounded once, so every implementation uses the same cos and sin.
namespace ntp::cpu {

// Rotates x in place.
void rope_forward(float* x, int B, int T, int NH, int HS, float theta);
// In place, the transpose (rotation by the negative angle): turns the gradient with respect to
// the rotated features into the gradient with respect to the unrotated ones.
void rope_backward(float* dx, int B, int T, int NH, int HS, float theta);

}  // namespace ntp::cpu
