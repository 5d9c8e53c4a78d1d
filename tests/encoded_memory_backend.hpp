#pragma once
// A stand-in for device memory on machines without a GPU. Its allocations are host memory, but
// every float is stored XORed with a key that depends on its address, so host code that reads or
// writes them directly (MPI on a device pointer, a memcpy where Backend::copy belongs) gets
// garbage, as it would on real device memory: sums of stored values decode wrong, and a value
// moved by memcpy decodes wrong at its new address. Only the memory methods and sum_squares work:
// it tests the code that moves device buffers (host staging, reshard, GradSync), not kernels.
#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend.hpp"

namespace ntp::test {

class EncodedMemoryBackend final : public Backend {
 public:
  ~EncodedMemoryBackend() override {
    for (auto& [p, n] : blocks_) delete[] reinterpret_cast<float*>(p);
  }
  std::string name() const override { return "encoded-memory"; }

  // The value stored at `at` for x, and back.
  static float encode(float x, const float* at) { return std::bit_cast<float>(std::bit_cast<std::uint32_t>(x) ^ key(at)); }
  static float decode(float stored, const float* at) { return encode(stored, at); }

  float* allocate(std::size_t n) override {
    float* p = new float[n ? n : 1];
    blocks_[reinterpret_cast<std::uintptr_t>(p)] = n ? n : 1;
    zero(p, n);
    return p;
  }
  void release(float* p) override {
    blocks_.erase(reinterpret_cast<std::uintptr_t>(p));
    delete[] p;
  }
  void zero(float* p, std::size_t n) override {
    for (std::size_t i = 0; i < n; ++i) p[i] = encode(0.0f, p + i);
  }
  void copy(float* dst, const float* src, std::size_t n) override {
    if (dst == src) return;
    const bool from_dev = is_device_memory(src), to_dev = is_device_memory(dst);
    if (!from_dev && !to_dev) return (void)std::memmove(dst, src, n * sizeof(float));
    for (std::size_t i = 0; i < n; ++i) {
      const float x = from_dev ? decode(src[i], src + i) : src[i];
      dst[i] = to_dev ? encode(x, dst + i) : x;
    }
  }
  bool is_device_memory(const void* p) const override {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = blocks_.upper_bound(a);
    if (it == blocks_.begin()) return false;
    --it;
    return a < it->first + it->second * sizeof(float);
  }
  void to_host(float* host, const float* src, std::size_t n) override { copy(host, src, n); }
  void from_host(float* dst, const float* host, std::size_t n) override { copy(dst, host, n); }
  double sum_squares(const float* x, long n) override {
    double s = 0;
    for (long i = 0; i < n; ++i) {
      const double v = is_device_memory(x + i) ? decode(x[i], x + i) : x[i];
      s += v * v;
    }
    return s;
  }

  // Everything else is a kernel: not what this backend is for.
  int* allocate_ints(std::size_t) override { fail("allocate_ints"); }
  void release_ints(int*) override { fail("release_ints"); }
  void ints_from_host(int*, const int*, std::size_t) override { fail("ints_from_host"); }
  void embedding_forward(float*, const int*, const float*, const int*, int, int) override { fail("embedding"); }
  void embedding_backward(float*, const float*, const int*, const int*, int, int) override { fail("embedding"); }
  void position_embedding_forward(float*, const float*, int, int, int) override { fail("position embedding"); }
  void position_embedding_backward(float*, const float*, int, int, int) override { fail("position embedding"); }
  void layernorm_forward(float*, float*, float*, const float*, const float*, const float*, int, int) override {
    fail("layernorm");
  }
  void layernorm_backward(float*, float*, float*, const float*, const float*, const float*, const float*,
                          const float*, int, int) override {
    fail("layernorm");
  }
  void matmul_forward(float*, const float*, const float*, const float*, int, int, int, WeightLayout) override {
    fail("matmul");
  }
  void matmul_backward(float*, float*, float*, const float*, const float*, const float*, int, int, int,
                       WeightLayout) override {
    fail("matmul");
  }
  void bias_forward(float*, const float*, int, int) override { fail("bias"); }
  void bias_backward(float*, const float*, int, int) override { fail("bias"); }
  void attention_forward(float*, float*, const float*, int, int, int, int) override { fail("attention"); }
  void attention_backward(float*, float*, const float*, const float*, const float*, int, int, int, int) override {
    fail("attention");
  }
  void gelu_forward(float*, const float*, long) override { fail("gelu"); }
  void gelu_backward(float*, const float*, const float*, long) override { fail("gelu"); }
  void rmsnorm_forward(float*, float*, const float*, const float*, int, int) override { fail("rmsnorm"); }
  void rmsnorm_backward(float*, float*, const float*, const float*, const float*, const float*, int, int) override {
    fail("rmsnorm");
  }
  void swiglu_forward(float*, const float*, const float*, long) override { fail("swiglu"); }
  void swiglu_backward(float*, float*, const float*, const float*, const float*, long) override { fail("swiglu"); }
  void rope_forward(float*, int, int, int, int, float) override { fail("rope"); }
  void rope_backward(float*, int, int, int, int, float) override { fail("rope"); }
  void gqa_pack_forward(float*, const float*, const float*, const float*, int, int, int, int) override { fail("gqa"); }
  void gqa_pack_backward(float*, float*, float*, const float*, int, int, int, int) override { fail("gqa"); }
  void residual_forward(float*, const float*, const float*, long) override { fail("residual"); }
  void residual_backward(float*, float*, const float*, long) override { fail("residual"); }
  void crossentropy_local_max(float*, const float*, int, int) override { fail("cross-entropy"); }
  void crossentropy_local_sums(float*, const float*, const float*, const int*, const int*, int, int) override {
    fail("cross-entropy");
  }
  void crossentropy_loss(float*, const float*, const float*, int) override { fail("cross-entropy"); }
  void crossentropy_backward(float*, const float*, const float*, const float*, const int*, const int*, float, int,
                             int) override {
    fail("cross-entropy");
  }
  void adamw_update(float*, const float*, float*, float*, long, float, float, float, float, float, float,
                    int) override {
    fail("adamw");
  }

 private:
  [[noreturn]] static void fail(const char* what) {
    throw std::logic_error(std::string("EncodedMemoryBackend has no ") + what + " kernel");
  }
  static std::uint32_t key(const float* at) {  // splitmix64's finaliser of the float's index
    std::uint64_t z = reinterpret_cast<std::uintptr_t>(at) / sizeof(float);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<std::uint32_t>(z ^ (z >> 31));
  }
  std::map<std::uintptr_t, std::size_t> blocks_;  // start address -> floats
};

}  // namespace ntp::test
