#include "kernels/cpu/moe_router.hpp"

#include <cmath>
#include <vector>

#include "kernels/cpu/detail/parallel_chunks.hpp"

namespace ntp::cpu {

namespace {

constexpr long kTokensPerChunk = 256;

// Token t's top-k (by falling logit, ties to the lower expert: an insertion into k sorted slots),
// their softmax, and the softmax over all E.
void route_token(const float* z, int E, int k, int* expert, float* weight, float* probs) {
  int n = 0;
  for (int e = 0; e < E; e++) {
    if (n == k && z[e] <= z[expert[k - 1]]) continue;
    int j = n < k ? n++ : k - 1;
    while (j > 0 && z[e] > z[expert[j - 1]]) {
      expert[j] = expert[j - 1];
      j--;
    }
    expert[j] = e;
  }
  const float top = z[expert[0]];
  float sum = 0;
  for (int j = 0; j < k; j++) sum += (weight[j] = std::exp(z[expert[j]] - top));
  for (int j = 0; j < k; j++) weight[j] /= sum;
  float all = 0;
  for (int e = 0; e < E; e++) all += (probs[e] = std::exp(z[e] - top));  // top >= every logit
  const float inv = 1.0f / all;
  for (int e = 0; e < E; e++) probs[e] *= inv;
}

}  // namespace

void moe_router_forward(const float* logits, long T, int E, int k, long capacity, int* expert, float* weight,
                        char* kept, float* probs, long* tokens_per_expert, long* dropped, float* aux_loss) {
  detail::for_each_chunk(
      T,
      [&](long t0, long n) {
        for (long t = t0; t < t0 + n; t++)
          route_token(logits + t * E, E, k, expert + t * k, weight + t * k, probs + t * E);
      },
      kTokensPerChunk, 4 * kTokensPerChunk);
  // Capacity is first come, first served in token order: one serial pass.
  std::vector<long> chosen(E, 0);
  for (int e = 0; e < E; e++) tokens_per_expert[e] = 0;
  long lost = 0;
  for (long i = 0; i < T * k; i++) {
    const int e = expert[i];
    chosen[e]++;
    const bool fits = capacity <= 0 || tokens_per_expert[e] < capacity;
    kept[i] = fits ? 1 : 0;
    tokens_per_expert[e] += fits ? 1 : 0;
    lost += fits ? 0 : 1;
  }
  *dropped = lost;
  std::vector<double> p(E, 0.0);
  for (long t = 0; t < T; t++)
    for (int e = 0; e < E; e++) p[e] += probs[t * E + e];
  double aux = 0;
  for (int e = 0; e < E; e++) aux += double(chosen[e]) * p[e];
  *aux_loss = static_cast<float>(double(E) * aux / (double(T) * double(T * k)));
}

void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* weight,
                         const float* dweight, long T, int E, int k, float aux_scale) {
  std::vector<float> f(E, 0.0f);
  for (long i = 0; i < T * k; i++) f[expert[i]] += 1.0f;
  for (int e = 0; e < E; e++) f[e] /= float(T * k);
  const float c = aux_scale * float(E) / float(T);
  detail::for_each_chunk(
      T,
      [&](long t0, long n) {
        for (long t = t0; t < t0 + n; t++) {
          const float* w = weight + t * k;
          const float* dw = dweight + t * k;
          const float* pt = probs + t * E;
          float* dz = dlogits + t * E;
          float dot = 0;
          for (int j = 0; j < k; j++) dot += w[j] * dw[j];
          for (int j = 0; j < k; j++) dz[expert[t * k + j]] += w[j] * (dw[j] - dot);
          float fp = 0;
          for (int e = 0; e < E; e++) fp += f[e] * pt[e];
          for (int e = 0; e < E; e++) dz[e] += c * pt[e] * (f[e] - fp);
        }
      },
      kTokensPerChunk, 4 * kTokensPerChunk);
}

}  // namespace ntp::cpu
