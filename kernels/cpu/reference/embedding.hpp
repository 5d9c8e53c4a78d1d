#pragma once
// Frozen naive reference, single-threaded, for tests only. Same contract as kernels/cpu/embedding.hpp.
namespace ntp::ref {

void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT, int C);
void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT, int C);

void position_embedding_forward(float* out, const float* wpe, int B, int T, int C);
void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C);

}  // namespace ntp::ref
