#pragma once
// Token and position embeddings. The token table is vocabulary-parallel: a rank holds the rows of
// the tokens it owns, in ascending token order, and `local_row[tok]` is that token's row (or -1).
namespace ntp::cpu {

// out[bt, :] = wte[local_row[tokens[bt]], :], or zeros when this rank does not own the token.
void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT, int C);
// dwte[local_row[tokens[bt]], :] += dout[bt, :] for owned tokens.
void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT, int C);

// out[b, t, :] += wpe[t, :]
void position_embedding_forward(float* out, const float* wpe, int B, int T, int C);
// dwpe[t, :] += sum_b dout[b, t, :]
void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C);

}  // namespace ntp::cpu
