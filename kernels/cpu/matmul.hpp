#pragma once
// Dense layer through cblas_sgemm. inp is [BT, C], out is [BT, OC].
namespace ntp::cpu {

// How the weight is stored. Column-parallel layers shard output features, row-parallel layers
// input features; each stores its weight so that one shard unit is a block of whole rows.
enum class WeightLayout {
  OutIn,  // weight [OC, C]   (out = inp @ weight^T)
  InOut,  // weight [C, OC]   (out = inp @ weight)
};

// out = inp @ W (+ bias[OC] when bias != nullptr). Overwrites out.
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                    WeightLayout layout);
// Accumulates (+=): dinp [BT, C] (skipped if nullptr), dweight (same layout as weight),
// dbias [OC] (skipped if nullptr).
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int BT, int C, int OC, WeightLayout layout);

// out[bt, :] += bias[:]  (the row-parallel bias, added once after the all-reduce)
void bias_forward(float* out, const float* bias, int BT, int OC);
// dbias[:] += sum_bt dout[bt, :]
void bias_backward(float* dbias, const float* dout, int BT, int OC);

}  // namespace ntp::cpu
