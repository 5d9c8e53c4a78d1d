#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/gqa.hpp.
namespace ntp::ref {

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV, int HS);
void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV, int HS);

}  // namespace ntp::ref
