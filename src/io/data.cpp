#include "data.hpp"

#include <cmath>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>

#include <fmt/format.h>

namespace ntp {

namespace {
std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

MarkovData::MarkovData(int vocab, std::uint64_t seed, int successors)
    : V_(vocab), K_(successors), seed_(seed), next_(std::size_t(vocab) * successors),
      cdf_(std::size_t(vocab) * successors), prob_(std::size_t(vocab) * successors) {
  std::mt19937_64 rng(mix(seed ^ 0xda7a));
  std::uniform_int_distribution<int> tok(0, V_ - 1);
  std::exponential_distribution<double> weight(1.0);
  for (int i = 0; i < V_; ++i) {
    double total = 0;
    for (int k = 0; k < K_; ++k) {
      next_[i * K_ + k] = tok(rng);
      prob_[i * K_ + k] = weight(rng);
      total += prob_[i * K_ + k];
    }
    double acc = 0;
    for (int k = 0; k < K_; ++k) {
      prob_[i * K_ + k] /= total;
      acc += prob_[i * K_ + k];
      cdf_[i * K_ + k] = acc;
    }
    cdf_[i * K_ + K_ - 1] = 1.0;
  }
}

void MarkovData::sample(std::int64_t g, int T, int* tokens, int* targets) const {
  std::mt19937_64 rng(mix(seed_ ^ mix(static_cast<std::uint64_t>(g))));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  int cur = static_cast<int>(rng() % V_);
  for (int t = 0; t <= T; ++t) {
    if (t < T) tokens[t] = cur;
    if (t > 0) targets[t - 1] = cur;
    const double r = u(rng);
    int k = 0;
    while (k < K_ - 1 && r > cdf_[cur * K_ + k]) ++k;
    cur = next_[cur * K_ + k];
  }
}

double MarkovData::entropy_rate() const {
  // Stationary distribution by power iteration (the chain's start is uniform, which it forgets fast).
  std::vector<double> pi(V_, 1.0 / V_), nxt(V_);
  for (int it = 0; it < 500; ++it) {
    std::fill(nxt.begin(), nxt.end(), 0.0);
    for (int i = 0; i < V_; ++i)
      for (int k = 0; k < K_; ++k) nxt[next_[i * K_ + k]] += pi[i] * prob_[i * K_ + k];
    // A little uniform restart keeps this defined for periodic or reducible chains.
    for (int i = 0; i < V_; ++i) nxt[i] = 0.999 * nxt[i] + 0.001 / V_;
    pi.swap(nxt);
  }
  double h = 0;
  for (int i = 0; i < V_; ++i) {
    // Successors may repeat; merge them before taking the entropy.
    std::vector<std::pair<int, double>> row;
    for (int k = 0; k < K_; ++k) {
      bool merged = false;
      for (auto& e : row)
        if (e.first == next_[i * K_ + k]) e.second += prob_[i * K_ + k], merged = true;
      if (!merged) row.emplace_back(next_[i * K_ + k], prob_[i * K_ + k]);
    }
    double hi = 0;
    for (auto& e : row) hi -= e.second > 0 ? e.second * std::log(e.second) : 0.0;
    h += pi[i] * hi;
  }
  return h;
}

std::string MarkovData::describe() const {
  return fmt::format("synthetic Markov chain (V={}, {} successors per token, entropy rate {:.3f} nats/token)", V_,
                     K_, entropy_rate());
}

ByteFileData::ByteFileData(const std::string& path, int T) : path_(path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open data file '" + path + "'");
  bytes_.assign(std::istreambuf_iterator<char>(f), {});
  if (bytes_.size() < std::size_t(T) + 2)
    throw std::runtime_error(fmt::format("data file '{}' has {} bytes; sequences of {} tokens need at least {}", path,
                                         bytes_.size(), T, T + 2));
}

void ByteFileData::sample(std::int64_t g, int T, int* tokens, int* targets) const {
  const std::int64_t N = static_cast<std::int64_t>(bytes_.size());
  const std::int64_t o = (g * T) % (N - T - 1);
  for (int t = 0; t < T; ++t) {
    tokens[t] = bytes_[o + t];
    targets[t] = bytes_[o + t + 1];
  }
}

std::string ByteFileData::describe() const {
  return fmt::format("byte-level file {} ({} bytes)", path_, bytes_.size());
}

std::unique_ptr<DataSource> make_data(const std::string& spec, int vocab, int T, std::uint64_t seed) {
  if (spec == "synthetic") return std::make_unique<MarkovData>(vocab, seed);
  if (vocab < 256)
    throw std::invalid_argument(
        fmt::format("--data {}: byte-level data needs a vocabulary of at least 256 (got {})", spec, vocab));
  return std::make_unique<ByteFileData>(spec, T);
}

}  // namespace ntp
