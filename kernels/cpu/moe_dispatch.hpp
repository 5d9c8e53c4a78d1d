#pragma once
// Tokens to their experts and back (after moe_router_forward). Each token t has k slots; a kept
// slot a = t*k + j is one row of expert expert[a]'s batch. The rows of all experts lie in one
// buffer [R, C], grouped by expert in expert order, each expert's rows in token order (the order
// in which capacity kept them): row_of[a] is slot a's row (-1: dropped), offsets[e] .. offsets[e+1]
// expert e's rows, R = offsets[E]. Expert parallelism sends each expert's block of rows to its rank.
namespace ntp::cpu {

// The rows' layout from the routing: offsets [E + 1], row_of [T * k].
void moe_plan(const int* expert, const char* kept, long T, int E, int k, long* offsets, long* row_of);
// xs[row_of[a]] = x[a / k] for every kept slot a; xs [R, C].
void moe_dispatch_forward(float* xs, const float* x, const long* row_of, long T, int k, int C);
// dx[t] += the sum of dxs[row_of[a]] over t's kept slots a.
void moe_dispatch_backward(float* dx, const float* dxs, const long* row_of, long T, int k, int C);
// y[t] += the sum of weight[a] * ys[row_of[a]] over t's kept slots a (a dropped slot adds nothing).
void moe_combine_forward(float* y, const float* ys, const float* weight, const long* row_of, long T, int k, int C);
// dys[row_of[a]] = weight[a] * dy[t] (overwrites every row); dweight[a] = dy[t] . ys[row_of[a]],
// 0 for a dropped slot (overwrites).
void moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                          const long* row_of, long T, int k, int C);

}  // namespace ntp::cpu
