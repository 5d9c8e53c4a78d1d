#include "kernels/cpu/moe_dispatch.hpp"

#include <cstring>
#include <vector>

#include "kernels/cpu/detail/parallel_chunks.hpp"

namespace ntp::cpu {

namespace {
constexpr long kTokensPerChunk = 64;

// body(t) for every token, in parallel over chunks of tokens: each token owns its rows and its
// output row, so no two threads write the same memory.
template <typename Body>
void for_each_token(long T, int C, Body body) {
  detail::for_each_chunk(
      T,
      [&](long t0, long n) {
        for (long t = t0; t < t0 + n; t++) body(t);
      },
      kTokensPerChunk, detail::kParallelMinElems / (C > 0 ? C : 1) + 1);
}
}  // namespace

void moe_plan(const int* expert, const char* kept, long T, int E, int k, long* offsets, long* row_of) {
  for (int e = 0; e <= E; e++) offsets[e] = 0;
  for (long a = 0; a < T * k; a++)
    if (kept[a]) offsets[expert[a] + 1]++;
  for (int e = 0; e < E; e++) offsets[e + 1] += offsets[e];
  // Each expert's next free row; slots in token order keep each expert's rows in token order.
  std::vector<long> cursor(offsets, offsets + E);
  for (long a = 0; a < T * k; a++) row_of[a] = kept[a] ? cursor[expert[a]]++ : -1;
}

void moe_dispatch_forward(float* xs, const float* x, const long* row_of, long T, int k, int C) {
  for_each_token(T, C, [&](long t) {
    for (int j = 0; j < k; j++)
      if (const long r = row_of[t * k + j]; r >= 0) std::memcpy(xs + r * C, x + t * C, sizeof(float) * C);
  });
}

void moe_dispatch_backward(float* dx, const float* dxs, const long* row_of, long T, int k, int C) {
  for_each_token(T, C, [&](long t) {
    float* d = dx + t * C;
    for (int j = 0; j < k; j++)
      if (const long r = row_of[t * k + j]; r >= 0) {
        const float* g = dxs + r * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
      }
  });
}

void moe_combine_forward(float* y, const float* ys, const float* weight, const long* row_of, long T, int k, int C) {
  for_each_token(T, C, [&](long t) {
    float* out = y + t * C;
    for (int j = 0; j < k; j++)
      if (const long r = row_of[t * k + j]; r >= 0) {
        const float w = weight[t * k + j];
        const float* in = ys + r * C;
        for (int c = 0; c < C; c++) out[c] += w * in[c];
      }
  });
}

void moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                          const long* row_of, long T, int k, int C) {
  for_each_token(T, C, [&](long t) {
    const float* g = dy + t * C;
    for (int j = 0; j < k; j++) {
      const long a = t * k + j, r = row_of[a];
      if (r < 0) {
        dweight[a] = 0;
        continue;
      }
      const float w = weight[a];
      const float* in = ys + r * C;
      float* d = dys + r * C;
      float dot = 0;
      for (int c = 0; c < C; c++) {
        d[c] = w * g[c];
        dot += g[c] * in[c];
      }
      dweight[a] = dot;
    }
  });
}

}  // namespace ntp::cpu
