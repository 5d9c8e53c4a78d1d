// The CPU backend: host memory, kernels/cpu (OpenBLAS + OpenMP).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "backend.hpp"
#include "kernels/cpu/adamw.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/cross_entropy.hpp"
#include "kernels/cpu/embedding.hpp"
#include "kernels/cpu/gelu.hpp"
#include "kernels/cpu/gqa.hpp"
#include "kernels/cpu/layernorm.hpp"
#include "kernels/cpu/matmul.hpp"
#include "kernels/cpu/residual.hpp"
#include "kernels/cpu/rmsnorm.hpp"
#include "kernels/cpu/rope.hpp"
#include "kernels/cpu/swiglu.hpp"
#include "kernels/cpu/zero.hpp"

namespace ntp {

namespace {

class CpuBackend final : public Backend {
 public:
  std::string name() const override { return "cpu"; }

  float* allocate(std::size_t n) override {
    const std::size_t bytes = ((std::max<std::size_t>(n, 1) * sizeof(float) + 63) / 64) * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return static_cast<float*>(p);
  }
  void release(float* p) override { std::free(p); }
  // Zero-length moves are legal with null pointers (a tensor another pipeline stage holds has no
  // elements here); memset and memcpy are not.
  void zero(float* p, std::size_t n) override { cpu::zero(p, static_cast<long>(n)); }
  void copy(float* dst, const float* src, std::size_t n) override {
    if (n > 0) std::memcpy(dst, src, n * sizeof(float));
  }
  bool is_device_memory(const void*) const override { return false; }
  void to_host(float* host, const float* src, std::size_t n) override { copy(host, src, n); }
  void from_host(float* dst, const float* host, std::size_t n) override { copy(dst, host, n); }
  int* allocate_ints(std::size_t n) override {
    static_assert(sizeof(int) == sizeof(float));
    return reinterpret_cast<int*>(allocate(n));
  }
  void release_ints(int* p) override { std::free(p); }
  void ints_from_host(int* dst, const int* host, std::size_t n) override { std::memcpy(dst, host, n * sizeof(int)); }

  void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT,
                         int C) override {
    cpu::embedding_forward(out, tokens, wte, local_row, BT, C);
  }
  void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT,
                          int C) override {
    cpu::embedding_backward(dwte, dout, tokens, local_row, BT, C);
  }
  void position_embedding_forward(float* out, const float* wpe, int B, int T, int C) override {
    cpu::position_embedding_forward(out, wpe, B, T, C);
  }
  void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C) override {
    cpu::position_embedding_backward(dwpe, dout, B, T, C);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int BT, int C) override {
    cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, BT, C);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int BT, int C) override {
    cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, BT, C);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                      WeightLayout layout) override {
    cpu::matmul_forward(out, inp, weight, bias, BT, C, OC, layout);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int BT, int C, int OC, WeightLayout layout) override {
    cpu::matmul_backward(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, layout);
  }
  void bias_forward(float* out, const float* bias, int BT, int OC) override { cpu::bias_forward(out, bias, BT, OC); }
  void bias_backward(float* dbias, const float* dout, int BT, int OC) override {
    cpu::bias_backward(dbias, dout, BT, OC);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) override {
    cpu::attention_forward(out, att, qkv, B, T, NH, HS);
  }
  void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv, const float* att, int B,
                          int T, int NH, int HS) override {
    cpu::attention_backward(dqkv, scratch, dout, qkv, att, B, T, NH, HS);
  }
  void gelu_forward(float* out, const float* inp, long N) override { cpu::gelu_forward(out, inp, N); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, long N) override {
    cpu::gelu_backward(dinp, inp, dout, N);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C) override {
    cpu::rmsnorm_forward(out, rstd, inp, weight, BT, C);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int BT, int C) override {
    cpu::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, BT, C);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, long N) override {
    cpu::swiglu_forward(out, gate, up, N);
  }
  void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout,
                       long N) override {
    cpu::swiglu_backward(dgate, dup, gate, up, dout, N);
  }
  void rope_forward(float* x, int B, int T, int NH, int HS, float theta) override {
    cpu::rope_forward(x, B, T, NH, HS, theta);
  }
  void rope_backward(float* dx, int B, int T, int NH, int HS, float theta) override {
    cpu::rope_backward(dx, B, T, NH, HS, theta);
  }
  void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV,
                        int HS) override {
    cpu::gqa_pack_forward(qkv, q, k, v, BT, NH, NKV, HS);
  }
  void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV,
                         int HS) override {
    cpu::gqa_pack_backward(dq, dk, dv, dqkv, BT, NH, NKV, HS);
  }
  void residual_forward(float* out, const float* a, const float* b, long N) override {
    cpu::residual_forward(out, a, b, N);
  }
  void residual_backward(float* da, float* db, const float* dout, long N) override {
    cpu::residual_backward(da, db, dout, N);
  }
  void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl) override {
    cpu::crossentropy_local_max(row_max, logits, BT, Vl);
  }
  void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                               const int* local_row, int BT, int Vl) override {
    cpu::crossentropy_local_sums(sums, logits, row_max, targets, local_row, BT, Vl);
  }
  void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT) override {
    cpu::crossentropy_loss(losses, row_max, sums, BT);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                             const int* targets, const int* local_row, float dloss, int BT, int Vl) override {
    cpu::crossentropy_backward(dlogits, logits, row_max, sums, targets, local_row, dloss, BT, Vl);
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale, int t) override {
    cpu::adamw_update(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t);
  }
  double sum_squares(const float* x, long n) override { return cpu::sum_squares(x, n); }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

#ifdef NTPBENCH_HAVE_CUDA
// src/backend/backend_cuda.cu
std::unique_ptr<Backend> make_cuda_backend(int local_rank, Precision precision);
std::string cuda_device_problem(int local_rank, bool share);
#endif

std::unique_ptr<Backend> make_backend(BackendKind kind, int local_rank, Precision precision) {
  if (kind == BackendKind::Cpu) {
    if (precision != Precision::Fp32)
      throw std::invalid_argument("--precision bf16 needs --backend cuda: the CPU backend computes in fp32 only");
    return make_cpu_backend();
  }
#ifdef NTPBENCH_HAVE_CUDA
  if (kind == BackendKind::Cuda) return make_cuda_backend(local_rank, precision);
#endif
  throw std::invalid_argument(backend_problem(kind, local_rank, false));
}

std::string backend_problem(BackendKind kind, int local_rank, bool share_gpus) {
  if (kind == BackendKind::Cpu) return {};
#ifdef NTPBENCH_HAVE_CUDA
  return cuda_device_problem(local_rank, share_gpus);
#else
  (void)local_rank, (void)share_gpus;
  return "--backend cuda: this build has no CUDA backend (nvcc not found)";
#endif
}

}  // namespace ntp
