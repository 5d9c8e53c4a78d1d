// The data files' reader: llm.c token files (uint16 and uint32), byte-level text, the sample rule
// (sample g is tokens [o, o+T), targets [o+1, o+T+1), o = (g*T) mod (N-T-1)) and every refusal.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data.hpp"

namespace ntp {
namespace {

namespace fs = std::filesystem;

// A file under the test's temporary directory, removed at the end of the test.
class DataFile : public ::testing::Test {
 protected:
  fs::path dir_ = fs::temp_directory_path() / ("ntp_test_data_" + std::to_string(::getpid()));
  void SetUp() override { fs::create_directories(dir_); }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::vector<char>& bytes) {
    const auto p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return p;
  }
  // llm.c's layout: 256 int32 (magic, version, count), then the tokens of Tok's width.
  template <class Tok>
  std::string token_file(const std::string& name, const std::vector<Tok>& toks, std::int32_t magic,
                         std::int32_t version, std::int64_t count) {
    std::vector<char> b(1024 + toks.size() * sizeof(Tok), 0);
    const std::int32_t head[3] = {magic, version, static_cast<std::int32_t>(count)};
    std::memcpy(b.data(), head, sizeof head);
    if (!toks.empty()) std::memcpy(b.data() + 1024, toks.data(), toks.size() * sizeof(Tok));  // data() may be null
    return write(name, b);
  }
  template <class Tok>
  std::string token_file(const std::string& name, const std::vector<Tok>& toks, std::int32_t magic,
                         std::int32_t version) {
    return token_file(name, toks, magic, version, std::int64_t(toks.size()));
  }
};

// Expects validate_data to throw a DataError whose message has every one of `parts`.
void expect_refused(const std::string& path, int vocab, int T, const std::vector<std::string>& parts) {
  try {
    validate_data(path, vocab, T);
    FAIL() << path << " was accepted";
  } catch (const DataError& e) {
    for (const auto& part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

std::vector<std::uint16_t> ramp16(int n, int scale) {
  std::vector<std::uint16_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<std::uint16_t>((i * scale) % 50257);
  return v;
}

TEST_F(DataFile, Uint16TokensFollowTheSampleRule) {
  const auto toks = ramp16(100, 997);
  const auto path = token_file("gpt2.bin", toks, 20240520, 1);
  validate_data(path, 50257, 8);
  const FileData d(path, 8);
  EXPECT_EQ(d.size(), 100);
  EXPECT_NE(d.describe().find("token file"), std::string::npos) << d.describe();
  const int T = 8;
  for (std::int64_t g : {0, 1, 5, 11, 12, 1000}) {
    std::vector<int> in(T), tgt(T);
    d.sample(g, T, in.data(), tgt.data());
    const std::int64_t o = (g * T) % (100 - T - 1);
    for (int t = 0; t < T; ++t) {
      EXPECT_EQ(in[t], toks[o + t]) << "g " << g << " t " << t;
      EXPECT_EQ(tgt[t], toks[o + t + 1]) << "g " << g << " t " << t;
    }
  }
}

TEST_F(DataFile, Uint32TokensAreReadWhole) {
  std::vector<std::uint32_t> toks(40);
  for (int i = 0; i < 40; ++i) toks[i] = 100000u + 7u * i;  // beyond uint16
  // The magic decides, not the name: a token file need not end in .bin.
  const auto path = token_file("llama3.tokens", toks, 20240801, 7);
  const FileData d(path, 4);
  EXPECT_EQ(d.max_token(), 100000 + 7 * 39);
  std::vector<int> in(4), tgt(4);
  d.sample(3, 4, in.data(), tgt.data());
  for (int t = 0; t < 4; ++t) {  // o = 12
    EXPECT_EQ(in[t], static_cast<int>(toks[12 + t]));
    EXPECT_EQ(tgt[t], static_cast<int>(toks[13 + t]));
  }
  validate_data(path, 100000 + 7 * 39 + 1, 4);
  expect_refused(path, 100000 + 7 * 39, 4, {path, "token id 100273", "--vocab 100274"});
}

TEST_F(DataFile, OtherFilesAreBytes) {
  const std::string text = "the quick brown fox jumps over the lazy dog";
  const auto path = write("text.txt", std::vector<char>(text.begin(), text.end()));
  const FileData d(path, 8);
  EXPECT_EQ(d.size(), std::int64_t(text.size()));
  std::vector<int> in(8), tgt(8);
  d.sample(2, 8, in.data(), tgt.data());
  EXPECT_EQ(std::string(in.begin(), in.end()), "fox jump");  // o = 16
  EXPECT_EQ(std::string(tgt.begin(), tgt.end()), "ox jumps");
  d.sample(5, 8, in.data(), tgt.data());  // o = 40 mod 34 = 6
  EXPECT_EQ(std::string(in.begin(), in.end()), "ick brow");
  expect_refused(path, 255, 8, {"byte-level data needs a vocabulary of at least 256"});
}

TEST_F(DataFile, EveryBadFileIsRefusedWithItsReason) {
  const auto toks = ramp16(64, 31);
  expect_refused(token_file("magic.bin", toks, 20240521, 1), 50257, 8,
                 {"magic.bin", "is not a token file", "starts with 20240521", "20240520", "20240801"});
  expect_refused(write("short.bin", {'a', 'b'}), 50257, 8, {"short.bin", "too short"});
  std::vector<char> magic_only(8, 0);  // the magic and a version, and no more of the header
  const std::int32_t head[2] = {20240520, 1};
  std::memcpy(magic_only.data(), head, sizeof head);
  expect_refused(write("header.bin", magic_only), 50257, 8,
                 {"header.bin", "has 8 bytes: too short for the 1024-byte header"});
  expect_refused(token_file("empty.bin", std::vector<std::uint16_t>{}, 20240520, 1), 50257, 8,
                 {"empty.bin", "holds 0 tokens"});
  expect_refused(token_file("version.bin", toks, 20240520, 2), 50257, 8,
                 {"version.bin", "unknown version 2", "this reader knows version 1"});
  expect_refused(token_file("version32.bin", std::vector<std::uint32_t>(64, 5), 20240801, 1), 50257, 8,
                 {"version32.bin", "unknown version 1", "this reader knows version 7"});
  expect_refused(token_file("count.bin", toks, 20240520, 1, 65), 50257, 8,
                 {"count.bin", "counts 65 tokens", "1154 bytes with the header", "file has 1152 bytes"});
  expect_refused(token_file("negative.bin", toks, 20240520, 1, -1), 50257, 8, {"negative.bin", "counts -1 tokens"});
  expect_refused(token_file("few.bin", ramp16(9, 1), 20240520, 1), 50257, 8,
                 {"few.bin", "holds 9 tokens; sequences of 8 tokens need at least 10"});
  expect_refused((dir_ / "missing.bin").string(), 50257, 8, {"cannot open data file", "missing.bin"});
  expect_refused(dir_.string(), 50257, 8, {dir_.string(), "is not a regular file"});
  // The largest id decides: 50256 fits V = 50257, not V = 50000.
  const std::vector<std::uint16_t> ids{1, 2, 50256, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const auto big = token_file("vocab.bin", ids, 20240520, 1);
  validate_data(big, 50257, 8);
  expect_refused(big, 50000, 8, {"vocab.bin", "token id 50256 is outside the vocabulary of 50000", "--vocab 50257"});
}

}  // namespace
}  // namespace ntp
