#pragma once
// Grouped-query attention's bridge to the multi-head attention kernel (attention.hpp): NH query
// heads share NKV key/value heads, query head h reading key/value head h / (NH / NKV). The pack
// writes each query head beside a copy of its key and value head in the attention kernel's
// [BT, NH, 3, HS] layout; the backward sums the copies' gradients back onto the shared heads.
// q is [BT, NH, HS], k and v [BT, NKV, HS]; NH a multiple of NKV.
namespace ntp::cpu {

void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV, int HS);
// dq, dk, dv += their shares of dqkv.
void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV, int HS);

}  // namespace ntp::cpu
