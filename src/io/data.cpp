#include "data.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <tuple>

#include <fmt/format.h>

#include "splitmix64.hpp"

namespace ntp {

MarkovData::MarkovData(int vocab, std::uint64_t seed, int successors)
    : V_(vocab), K_(successors), seed_(seed), next_(std::size_t(vocab) * successors),
      cdf_(std::size_t(vocab) * successors), prob_(std::size_t(vocab) * successors) {
  std::mt19937_64 rng(splitmix64(seed ^ 0xda7a));
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
  std::mt19937_64 rng(splitmix64(seed_ ^ splitmix64(static_cast<std::uint64_t>(g))));
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

namespace {

// llm.c's token files (dev/data/data_common.py, write_datafile), told apart by their magic.
struct TokenFormat {
  const char* name;
  std::int32_t magic, version;
  int width;  // bytes per token
};
constexpr TokenFormat kTokenFormats[] = {{"GPT-2, uint16 tokens", 20240520, 1, 2},
                                         {"Llama 3, uint32 tokens", 20240801, 7, 4}};
constexpr std::int64_t kHeaderBytes = 256 * 4;
// The header and the tokens are little-endian.
static_assert(std::endian::native == std::endian::little, "token files are read in place: a little-endian host");

std::int32_t int32_at(const unsigned char* p, int i) {
  std::int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

const TokenFormat* token_format(std::int32_t magic) {
  for (const auto& f : kTokenFormats)
    if (f.magic == magic) return &f;
  return nullptr;
}

// The whole file, mapped read-only (nullptr for an empty file), and its size.
std::pair<std::shared_ptr<const unsigned char>, std::int64_t> map_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw DataError(fmt::format("cannot open data file '{}': {}", path, std::strerror(errno)));
  struct stat st {};
  const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (!regular || st.st_size == 0) {
    ::close(fd);
    if (!regular) throw DataError(fmt::format("data file '{}' is not a regular file", path));
    return {nullptr, 0};
  }
  const std::size_t len = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  if (p == MAP_FAILED) throw DataError(fmt::format("cannot map data file '{}': {}", path, std::strerror(err)));
  auto unmap = [len](const unsigned char* q) { ::munmap(const_cast<unsigned char*>(q), len); };
  return {std::shared_ptr<const unsigned char>(static_cast<const unsigned char*>(p), unmap),
          static_cast<std::int64_t>(st.st_size)};
}

template <class Tok>
std::int64_t max_of(const unsigned char* p, std::int64_t n) {
  Tok m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    Tok v;
    std::memcpy(&v, p + i * sizeof(Tok), sizeof(Tok));
    m = std::max(m, v);
  }
  return m;
}

}  // namespace

FileData::FileData(const std::string& path, int T) : path_(path), format_("byte-level") {
  std::int64_t size = 0;
  std::tie(map_, size) = map_file(path);
  const TokenFormat* f = size >= 4 ? token_format(int32_at(map_.get(), 0)) : nullptr;
  if (!f && std::filesystem::path(path).extension() == ".bin")
    throw DataError(size < 4 ? fmt::format("data file '{}' has {} bytes: too short for a token file", path, size)
                             : fmt::format("data file '{}' is not a token file: it starts with {}, not the magic {} "
                                           "({}) or {} ({})",
                                           path, int32_at(map_.get(), 0), kTokenFormats[0].magic, kTokenFormats[0].name,
                                           kTokenFormats[1].magic, kTokenFormats[1].name));
  tokens_ = map_.get(), n_ = size;
  if (f) {
    if (size < kHeaderBytes)
      throw DataError(fmt::format("data file '{}' has {} bytes: too short for the {}-byte header of a token file",
                                  path, size, kHeaderBytes));
    const std::int32_t version = int32_at(map_.get(), 1), count = int32_at(map_.get(), 2);
    if (version != f->version)
      throw DataError(fmt::format("data file '{}': unknown version {} of the token format with magic {} ({}); "
                                  "this reader knows version {}",
                                  path, version, f->magic, f->name, f->version));
    if (count < 0 || kHeaderBytes + std::int64_t(count) * f->width != size)
      throw DataError(fmt::format("data file '{}': its header counts {} tokens ({} bytes with the header) but the "
                                  "file has {} bytes",
                                  path, count, kHeaderBytes + std::int64_t(count) * f->width, size));
    format_ = f->name, width_ = f->width, tokens_ = map_.get() + kHeaderBytes, n_ = count;
  }
  if (n_ < std::int64_t(T) + 2)
    throw DataError(fmt::format("data file '{}' holds {} tokens; sequences of {} tokens need at least {}", path, n_,
                                T, T + 2));
}

std::int64_t FileData::at(std::int64_t i) const {
  if (width_ == 1) return tokens_[i];
  if (width_ == 2) {
    std::uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

std::int64_t FileData::max_token() const {
  if (width_ == 1) return max_of<std::uint8_t>(tokens_, n_);
  return width_ == 2 ? max_of<std::uint16_t>(tokens_, n_) : max_of<std::uint32_t>(tokens_, n_);
}

void FileData::sample(std::int64_t g, int T, int* tokens, int* targets) const {
  const std::int64_t o = (g * T) % (n_ - T - 1);
  for (int t = 0; t < T; ++t) {
    tokens[t] = static_cast<int>(at(o + t));
    targets[t] = static_cast<int>(at(o + t + 1));
  }
}

std::string FileData::describe() const {
  return width_ == 1 ? fmt::format("byte-level file {} ({} bytes)", path_, n_)
                     : fmt::format("token file {} ({} tokens; llm.c format, {})", path_, n_, format_);
}

namespace {
void check_vocab(const FileData& d, const std::string& spec, int vocab) {
  if (d.bytes() && vocab < 256)
    throw DataError(
        fmt::format("--data {}: byte-level data needs a vocabulary of at least 256 (got {})", spec, vocab));
}
}  // namespace

void validate_data(const std::string& spec, int vocab, int T) {
  if (spec == "synthetic") return;
  const FileData d(spec, T);
  check_vocab(d, spec, vocab);
  if (d.bytes() || vocab >= d.width_limit()) return;
  const std::int64_t top = d.max_token();
  if (top >= vocab)
    throw DataError(fmt::format("data file '{}': token id {} is outside the vocabulary of {} tokens; the file needs "
                                "--vocab {} or more",
                                spec, top, vocab, top + 1));
}

std::unique_ptr<DataSource> make_data(const std::string& spec, int vocab, int T, std::uint64_t seed) {
  if (spec == "synthetic") return std::make_unique<MarkovData>(vocab, seed);
  auto d = std::make_unique<FileData>(spec, T);
  check_vocab(*d, spec, vocab);
  return d;
}

}  // namespace ntp
