#include "kernels/cpu/reference/moe_router.hpp"

#include <cmath>
#include <vector>

namespace ntp::ref {

void moe_router_forward(const float* logits, long T, int E, int k, long capacity, int* expert, float* weight,
                        char* kept, float* probs, long* tokens_per_expert, long* dropped, float* aux_loss) {
  std::vector<long> chosen(E, 0);
  for (int e = 0; e < E; e++) tokens_per_expert[e] = 0;
  *dropped = 0;
  for (long t = 0; t < T; t++) {
    const float* z = logits + t * E;
    // Top-k by repeated selection of the largest logit not yet taken (ties: the lower expert).
    std::vector<char> taken(E, 0);
    for (int j = 0; j < k; j++) {
      int best = -1;
      for (int e = 0; e < E; e++)
        if (!taken[e] && (best < 0 || z[e] > z[best])) best = e;
      taken[best] = 1;
      expert[t * k + j] = best;
    }
    float top = z[expert[t * k]];
    float sum = 0;
    for (int j = 0; j < k; j++) sum += std::exp(z[expert[t * k + j]] - top);
    for (int j = 0; j < k; j++) weight[t * k + j] = std::exp(z[expert[t * k + j]] - top) / sum;
    float zmax = z[0];
    for (int e = 1; e < E; e++) zmax = z[e] > zmax ? z[e] : zmax;
    float all = 0;
    for (int e = 0; e < E; e++) all += std::exp(z[e] - zmax);
    for (int e = 0; e < E; e++) probs[t * E + e] = std::exp(z[e] - zmax) / all;
  }
  // Capacity, in token order.
  for (long t = 0; t < T; t++)
    for (int j = 0; j < k; j++) {
      const int e = expert[t * k + j];
      chosen[e]++;
      const bool fits = capacity <= 0 || tokens_per_expert[e] < capacity;
      kept[t * k + j] = fits ? 1 : 0;
      if (fits) tokens_per_expert[e]++;
      else ++*dropped;
    }
  double aux = 0;
  for (int e = 0; e < E; e++) {
    double p = 0;
    for (long t = 0; t < T; t++) p += probs[t * E + e];
    aux += (double(chosen[e]) / double(T * k)) * (p / double(T));
  }
  *aux_loss = static_cast<float>(E * aux);
}

void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* weight,
                         const float* dweight, long T, int E, int k, float aux_scale) {
  std::vector<double> f(E, 0.0);
  for (long i = 0; i < T * k; i++) f[expert[i]] += 1.0 / double(T * k);
  for (long t = 0; t < T; t++) {
    // The top-k softmax: dz_j = w_j (dw_j - sum_i w_i dw_i) for the chosen j.
    float dot = 0;
    for (int j = 0; j < k; j++) dot += weight[t * k + j] * dweight[t * k + j];
    for (int j = 0; j < k; j++) {
      const int e = expert[t * k + j];
      dlogits[t * E + e] += weight[t * k + j] * (dweight[t * k + j] - dot);
    }
    // The balancing loss through P: d aux / dz_e = (E / T) p_e (f_e - sum_e' f_e' p_e').
    double fp = 0;
    for (int e = 0; e < E; e++) fp += f[e] * probs[t * E + e];
    for (int e = 0; e < E; e++)
      dlogits[t * E + e] += static_cast<float>(aux_scale * double(E) / double(T) * probs[t * E + e] * (f[e] - fp));
  }
}

}  // namespace ntp::ref
