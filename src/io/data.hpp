#pragma once
// Training data. Every sample has a global index g; sample g is the same sequence whatever the
// layout, so a run at any TP x DP (or a failure-shrunk one) sees exactly the samples of the
// one-rank reference. One global cursor hands indices out in order, replica by replica.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ntp {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // Writes sample g: tokens[0..T) and targets[0..T) (the next tokens).
  virtual void sample(std::int64_t g, int T, int* tokens, int* targets) const = 0;
  virtual std::string describe() const = 0;
};

// A seeded first-order Markov chain over the vocabulary: each token has a few likely successors,
// so a model can learn it and the loss falls toward the chain's entropy rate.
class MarkovData final : public DataSource {
 public:
  MarkovData(int vocab, std::uint64_t seed, int successors = 4);
  void sample(std::int64_t g, int T, int* tokens, int* targets) const override;
  std::string describe() const override;
  // Entropy rate in nats per token: sum_i pi_i H(row i), pi the stationary distribution.
  double entropy_rate() const;

 private:
  int V_, K_;
  std::uint64_t seed_;
  std::vector<int> next_;      // [V, K] successor tokens
  std::vector<double> cdf_;    // [V, K] cumulative probabilities
  std::vector<double> prob_;   // [V, K]
};

// Byte-level text: V = 256, sample g is bytes [o, o+T) with targets [o+1, o+T+1),
// o = (g*T) mod (N-T-1), N the file size.
class ByteFileData final : public DataSource {
 public:
  ByteFileData(const std::string& path, int T);
  void sample(std::int64_t g, int T, int* tokens, int* targets) const override;
  std::string describe() const override;

 private:
  std::string path_;
  std::vector<unsigned char> bytes_;
};

// "synthetic" or a file path.
std::unique_ptr<DataSource> make_data(const std::string& spec, int vocab, int T, std::uint64_t seed);

}  // namespace ntp
