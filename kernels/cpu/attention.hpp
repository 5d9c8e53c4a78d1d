#pragma once
// Causal multi-head self-attention over a rank's local heads.
// qkv is [B, T, NH, 3, HS]: per head, its HS query, HS key and HS value features side by side
// (the per-head interleave keeps one head a contiguous block, so heads shard as whole units).
// out is [B, T, NH, HS]. Scale 1/sqrt(HS).
namespace ntp::cpu {

// att [B, NH, T, T] receives the softmax probabilities (row t valid for columns <= t, zero above).
void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS);
// Accumulates (+=) into dqkv. scratch holds B*NH*T*T floats and is overwritten.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int NH, int HS);

}  // namespace ntp::cpu
