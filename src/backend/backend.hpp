#pragma once
// The compute seam. The model calls kernels only through Backend, so a CUDA backend (device
// memory, cuBLAS) can replace the CPU one without touching model code. Signatures and semantics
// are those of kernels/cpu/*.hpp; backward kernels accumulate (+=).
#include <cstddef>
#include <memory>
#include <string>

#include "kernels/cpu/matmul.hpp"

namespace ntp {

using WeightLayout = cpu::WeightLayout;

// Arithmetic of the GEMMs (--precision). Fp32: fp32 throughout. Bf16 (CUDA backend only): the
// GEMMs take bf16 copies of their operands and accumulate and write fp32; parameters, gradients,
// AdamW moments and every other kernel stay fp32.
enum class Precision { Fp32, Bf16 };
// Where the kernels run and the memory lives (--backend).
enum class BackendKind { Cpu, Cuda };

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Zero-initialised buffer of n floats in the backend's memory; release with release().
  virtual float* allocate(std::size_t n) = 0;
  virtual void release(float* p) = 0;
  virtual void zero(float* p, std::size_t n) = 0;
  // Any direction: either side may be backend or host memory.
  virtual void copy(float* dst, const float* src, std::size_t n) = 0;
  // True where `p` is backend memory the host cannot read directly (device memory); host code
  // (MPI, packing) must then go through copy / to_host / from_host.
  virtual bool is_device_memory(const void* p) const = 0;
  virtual void to_host(float* host, const float* src, std::size_t n) = 0;
  virtual void from_host(float* dst, const float* host, std::size_t n) = 0;
  virtual int* allocate_ints(std::size_t n) = 0;
  virtual void release_ints(int* p) = 0;
  virtual void ints_from_host(int* dst, const int* host, std::size_t n) = 0;

  virtual void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT,
                                 int C) = 0;
  virtual void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT,
                                  int C) = 0;
  virtual void position_embedding_forward(float* out, const float* wpe, int B, int T, int C) = 0;
  virtual void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C) = 0;

  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int BT, int C) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, int BT, int C) = 0;

  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C,
                              int OC, WeightLayout layout) = 0;
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, int BT, int C, int OC, WeightLayout layout) = 0;
  virtual void bias_forward(float* out, const float* bias, int BT, int OC) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int BT, int OC) = 0;

  virtual void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) = 0;
  virtual void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                                  const float* att, int B, int T, int NH, int HS) = 0;

  virtual void gelu_forward(float* out, const float* inp, long N) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, long N) = 0;

  // Llama's kernels (kernels/cpu/rmsnorm.hpp, swiglu.hpp, rope.hpp, gqa.hpp). rope_* work in place.
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int BT, int C) = 0;
  virtual void swiglu_forward(float* out, const float* gate, const float* up, long N) = 0;
  virtual void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout,
                               long N) = 0;
  virtual void rope_forward(float* x, int B, int T, int NH, int HS, float theta) = 0;
  virtual void rope_backward(float* dx, int B, int T, int NH, int HS, float theta) = 0;
  virtual void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV,
                                int HS) = 0;
  virtual void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV,
                                 int HS) = 0;

  virtual void residual_forward(float* out, const float* a, const float* b, long N) = 0;
  virtual void residual_backward(float* da, float* db, const float* dout, long N) = 0;

  virtual void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl) = 0;
  virtual void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                                       const int* local_row, int BT, int Vl) = 0;
  virtual void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT) = 0;
  virtual void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                                     const int* targets, const int* local_row, float dloss, int BT, int Vl) = 0;

  virtual void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, float grad_scale, int t) = 0;
  virtual double sum_squares(const float* x, long n) = 0;

  // Mixture of experts (kernels/cpu/moe_router.hpp, moe_dispatch.hpp; src/backend/backend_moe.cpp).
  // The routing's results are host memory (the model reads them to pick each expert's rows):
  // expert, weight, kept, probs, the counts, and row_of. Logits, activations and their gradients
  // are the backend's; where they are device memory, the rows go through host copies and the CPU
  // kernels (correct, not fast: the step's matmuls stay on the device). rows: R, the rows of xs/ys.
  void moe_router_forward(const float* logits, long T, int E, int k, long capacity, int* expert, float* weight,
                          char* kept, float* probs, long* tokens_per_expert, long* dropped, float* aux_loss);
  // The rows' layout from the routing, on the host (kernels/cpu/moe_dispatch.hpp).
  void moe_plan(const int* expert, const char* kept, long T, int E, int k, long* offsets, long* row_of);
  void moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* weight,
                           const float* dweight, long T, int E, int k, float aux_scale);
  void moe_dispatch_forward(float* xs, const float* x, const long* row_of, long T, int k, int C, long rows);
  void moe_dispatch_backward(float* dx, const float* dxs, const long* row_of, long T, int k, int C, long rows);
  void moe_combine_forward(float* y, const float* ys, const float* weight, const long* row_of, long T, int k, int C,
                           long rows);
  void moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                            const long* row_of, long T, int k, int C, long rows);
};

std::unique_ptr<Backend> make_cpu_backend();
// The CPU backend, or the CUDA one where the build has it (NTPBENCH_HAVE_CUDA); throws otherwise,
// and for Precision::Bf16 on the CPU backend. local_rank: this rank's index on its node, which
// picks its GPU.
std::unique_ptr<Backend> make_backend(BackendKind kind, int local_rank, Precision precision);
// Why backend `kind` cannot run on this rank (node-local rank `local_rank`; `share_gpus`: ranks may
// share a GPU), or "" when it can: an unknown backend, a build without CUDA, no usable GPU of its
// own. Asks the device, builds nothing; make_backend fails for the same reasons.
std::string backend_problem(BackendKind kind, int local_rank, bool share_gpus);

}  // namespace ntp
