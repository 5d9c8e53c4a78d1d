#pragma once
// Training data. Every sample has a global index g; sample g is the same sequence whatever the
// layout, so a run at any TP x DP (or a failure-shrunk one) sees exactly the samples of the
// one-rank reference. One global cursor hands indices out in order, replica by replica.
#include <cstdint>
#include <memory>
#include <stdexcept>
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

// A refused data file: the message names the file and the reason.
struct DataError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Tokens read from a file, either of two kinds:
//  - an llm.c token file: a header of 256 little-endian int32 (magic, version, token count), then
//    the tokens: magic 20240520, version 1, uint16 tokens (GPT-2); magic 20240801, version 7, uint32
//    tokens (Llama 3). A file whose first int32 is one of these magics is read as one, and a file
//    named *.bin must be one;
//  - any other file is byte-level text: token i is byte i (needs V >= 256).
// Sample g is tokens [o, o+T) with targets [o+1, o+T+1), o = (g*T) mod (N-T-1), N the token count.
// The file is mapped read-only once per process (the ranks of a host share its pages); a sample
// copies its T+1 tokens and nothing else.
class FileData final : public DataSource {
 public:
  // Checks the header and the size against the token count; throws DataError.
  FileData(const std::string& path, int T);
  void sample(std::int64_t g, int T, int* tokens, int* targets) const override;
  std::string describe() const override;
  std::int64_t size() const { return n_; }
  bool bytes() const { return width_ == 1; }
  // One more than the largest id the file's width holds: a vocabulary this big needs no scan.
  std::int64_t width_limit() const { return std::int64_t(1) << (8 * width_); }
  // The largest token id in the file: one pass over all of it.
  std::int64_t max_token() const;

 private:
  std::int64_t at(std::int64_t i) const;
  std::string path_, format_;
  std::shared_ptr<const unsigned char> map_;  // the whole file; unmapped with the last owner
  const unsigned char* tokens_ = nullptr;
  int width_ = 1;  // bytes per token
  std::int64_t n_ = 0;
};

// Start-up check of --data: a file's format, size and vocabulary, and (for a token file whose
// width allows ids >= vocab) every token id below `vocab`, one full pass. Throws DataError.
void validate_data(const std::string& spec, int vocab, int T);

// "synthetic" or a file path (a FileData; its token ids are checked by validate_data, not here).
std::unique_ptr<DataSource> make_data(const std::string& spec, int vocab, int T, std::uint64_t seed);

}  // namespace ntp
