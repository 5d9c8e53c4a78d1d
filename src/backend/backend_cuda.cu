// The CUDA backend: device memory on this rank's GPU, kernels/cuda (cuBLAS + CUDA kernels).
// Every kernel is queued on one stream; the calls that hand data to the host (to_host,
// sum_squares) synchronise it, as do from_host/ints_from_host (the host buffer is then free to
// reuse). Pointers given to the kernels must be device pointers from allocate()/allocate_ints().
//
// Device: node-local rank r takes GPU r. With fewer GPUs than ranks on the node, start-up fails
// unless NTPBENCH_ALLOW_GPU_SHARING=1 (the --allow-gpu-sharing flag), when rank r takes GPU
// r % count. NCCL refuses two ranks on one GPU, so ranks that share a GPU must communicate
// through MPI with host staging (see src/comm/comm_nccl.hpp).
//
// TF32: off (cuBLAS's default math), so results compare with the CPU path to fp32 tolerance.
// NTPBENCH_TF32=1 lets cuBLAS use TF32 tensor cores for the fp32 GEMMs (faster, ~1e-3 relative).
//
// Precision (--precision): fp32 by default. With bf16, every GEMM (the dense layers and the
// attention products) runs on bf16 tensor cores, autocast-style: the fp32 buffers stay the
// source of truth (master weights, activations, gradients, AdamW moments), each GEMM call casts
// its operands into a bf16 scratch buffer owned here, and cuBLAS accumulates and writes fp32
// (cublasGemmEx, CUBLAS_COMPUTE_32F). Every other kernel is the fp32 one. Results then match the
// CPU path to bf16 rounding (~1e-2 relative), not fp32 tolerance.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backend.hpp"
#include "cuda_pointer.hpp"
#include "kernels/cuda/adamw.cuh"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cross_entropy.cuh"
#include "kernels/cuda/detail/common.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/gelu.cuh"
#include "kernels/cuda/gqa.cuh"
#include "kernels/cuda/layernorm.cuh"
#include "kernels/cuda/matmul.cuh"
#include "kernels/cuda/residual.cuh"
#include "kernels/cuda/rmsnorm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/swiglu.cuh"

namespace ntp {

namespace {

bool env_is_one(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

std::string cuda_error_text(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + std::to_string(int(e)) + "): " + cudaGetErrorString(e);
}

// Why node-local rank `local_rank` has no GPU to use (`share`: ranks may share one), or "" and its
// GPU in `device`.
std::string find_device(int local_rank, bool share, int& device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();  // reset the last-error state
    return "--backend cuda: no usable GPU on this node: cudaGetDeviceCount failed with " + cuda_error_text(e) +
           " (no GPU, no driver, or CUDA_VISIBLE_DEVICES hides them; --backend cpu needs none)";
  }
  if (count == 0) return "--backend cuda: no GPU on this node (cudaGetDeviceCount returned 0)";
  if (local_rank < 0) return "--backend cuda: negative node-local rank";
  device = local_rank < count ? local_rank : local_rank % count;
  if (local_rank < count || share) return {};
  // The same text on every rank short of a GPU, so that the job's refusal says it once.
  return "--backend cuda: more ranks on a node than its " + std::to_string(count) +
         " visible GPU(s): run at most one rank per GPU, or pass --allow-gpu-sharing "
         "(NTPBENCH_ALLOW_GPU_SHARING=1) to share them; ranks sharing a GPU cannot use NCCL and "
         "communicate through MPI with host staging";
}

// The GPU for node-local rank `local_rank`, or a clear error.
int select_device(int local_rank) {
  int device = 0;
  const std::string why = find_device(local_rank, env_is_one("NTPBENCH_ALLOW_GPU_SHARING"), device);
  if (!why.empty()) throw std::runtime_error(why);
  return device;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(int local_rank, Precision precision)
      : device_(select_device(local_rank)), bf16_(precision == Precision::Bf16) {
    NTP_CUDA_CHECK(cudaSetDevice(device_));
    NTP_CUDA_CHECK(cudaStreamCreate(&stream_));
    NTP_CUBLAS_CHECK(cublasCreate(&cublas_));
    NTP_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    NTP_CUBLAS_CHECK(
        cublasSetMathMode(cublas_, env_is_one("NTPBENCH_TF32") ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    NTP_CUDA_CHECK(cudaMalloc(&sumsq_scratch_, cuda::sum_squares_scratch() * sizeof(double)));
  }

  ~CudaBackend() override {
    // No throwing here: report and carry on releasing.
    warn(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    if (scratch_) warn(cudaFree(scratch_), "cudaFree");
    if (bf16_scratch_) warn(cudaFree(bf16_scratch_), "cudaFree");
    warn(cudaFree(sumsq_scratch_), "cudaFree");
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) warn(cudaStreamDestroy(stream_), "cudaStreamDestroy");
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }

  float* allocate(std::size_t n) override { return static_cast<float*>(device_alloc(n * sizeof(float))); }
  void release(float* p) override { device_free(p); }
  void zero(float* p, std::size_t n) override {
    if (n) NTP_CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), stream_));
  }
  // cudaMemcpyDefault: the direction follows from the pointers (unified addressing), so a host
  // buffer on either side also works; the copy is then complete when this returns.
  void copy(float* dst, const float* src, std::size_t n) override {
    if (!n) return;
    NTP_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, stream_));
    if (!is_device_pointer(dst) || !is_device_pointer(src)) NTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  bool is_device_memory(const void* p) const override { return is_device_pointer(p); }
  void to_host(float* host, const float* src, std::size_t n) override {
    if (!n) return;
    NTP_CUDA_CHECK(cudaMemcpyAsync(host, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    NTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  void from_host(float* dst, const float* host, std::size_t n) override {
    if (!n) return;
    NTP_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(float), cudaMemcpyHostToDevice, stream_));
    NTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  int* allocate_ints(std::size_t n) override { return static_cast<int*>(device_alloc(n * sizeof(int))); }
  void release_ints(int* p) override { device_free(p); }
  void ints_from_host(int* dst, const int* host, std::size_t n) override {
    if (!n) return;
    NTP_CUDA_CHECK(cudaMemcpyAsync(dst, host, n * sizeof(int), cudaMemcpyHostToDevice, stream_));
    NTP_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void embedding_forward(float* out, const int* tokens, const float* wte, const int* local_row, int BT,
                         int C) override {
    cuda::embedding_forward(out, tokens, wte, local_row, BT, C, stream_);
  }
  void embedding_backward(float* dwte, const float* dout, const int* tokens, const int* local_row, int BT,
                          int C) override {
    cuda::embedding_backward(dwte, dout, tokens, local_row, BT, C, stream_);
  }
  void position_embedding_forward(float* out, const float* wpe, int B, int T, int C) override {
    cuda::position_embedding_forward(out, wpe, B, T, C, stream_);
  }
  void position_embedding_backward(float* dwpe, const float* dout, int B, int T, int C) override {
    cuda::position_embedding_backward(dwpe, dout, B, T, C, stream_);
  }
  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int BT, int C) override {
    cuda::layernorm_forward(out, mean, rstd, inp, weight, bias, BT, C, stream_);
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int BT, int C) override {
    float* s = scratch(cuda::layernorm_backward_scratch(BT, C));
    cuda::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, BT, C, s, stream_);
  }
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int BT, int C, int OC,
                      WeightLayout layout) override {
    if (bf16_)
      cuda::matmul_forward_bf16(out, inp, weight, bias, BT, C, OC, layout,
                                bf16_scratch(cuda::matmul_bf16_scratch(BT, C, OC)), cublas_, stream_);
    else
      cuda::matmul_forward(out, inp, weight, bias, BT, C, OC, layout, cublas_, stream_);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int BT, int C, int OC, WeightLayout layout) override {
    float* s = dbias ? scratch(cuda::bias_backward_scratch(BT, OC)) : nullptr;
    if (bf16_)
      cuda::matmul_backward_bf16(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, layout, s,
                                 bf16_scratch(cuda::matmul_bf16_scratch(BT, C, OC)), cublas_, stream_);
    else
      cuda::matmul_backward(dinp, dweight, dbias, dout, inp, weight, BT, C, OC, layout, s, cublas_, stream_);
  }
  void bias_forward(float* out, const float* bias, int BT, int OC) override {
    cuda::bias_forward(out, bias, BT, OC, stream_);
  }
  void bias_backward(float* dbias, const float* dout, int BT, int OC) override {
    cuda::bias_backward(dbias, dout, BT, OC, scratch(cuda::bias_backward_scratch(BT, OC)), stream_);
  }
  void attention_forward(float* out, float* att, const float* qkv, int B, int T, int NH, int HS) override {
    if (bf16_)
      cuda::attention_forward_bf16(out, att, qkv, B, T, NH, HS,
                                   bf16_scratch(cuda::attention_bf16_scratch(B, T, NH, HS)), cublas_, stream_);
    else
      cuda::attention_forward(out, att, qkv, B, T, NH, HS, cublas_, stream_);
  }
  void attention_backward(float* dqkv, float* scr, const float* dout, const float* qkv, const float* att, int B, int T,
                          int NH, int HS) override {
    if (bf16_)
      cuda::attention_backward_bf16(dqkv, scr, dout, qkv, att, B, T, NH, HS,
                                    bf16_scratch(cuda::attention_bf16_scratch(B, T, NH, HS)), cublas_, stream_);
    else
      cuda::attention_backward(dqkv, scr, dout, qkv, att, B, T, NH, HS, cublas_, stream_);
  }
  void gelu_forward(float* out, const float* inp, long N) override { cuda::gelu_forward(out, inp, N, stream_); }
  void gelu_backward(float* dinp, const float* inp, const float* dout, long N) override {
    cuda::gelu_backward(dinp, inp, dout, N, stream_);
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int BT, int C) override {
    cuda::rmsnorm_forward(out, rstd, inp, weight, BT, C, stream_);
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int BT, int C) override {
    float* s = scratch(cuda::rmsnorm_backward_scratch(BT, C));
    cuda::rmsnorm_backward(dinp, dweight, dout, inp, weight, rstd, BT, C, s, stream_);
  }
  void swiglu_forward(float* out, const float* gate, const float* up, long N) override {
    cuda::swiglu_forward(out, gate, up, N, stream_);
  }
  void swiglu_backward(float* dgate, float* dup, const float* gate, const float* up, const float* dout,
                       long N) override {
    cuda::swiglu_backward(dgate, dup, gate, up, dout, N, stream_);
  }
  void rope_forward(float* x, int B, int T, int NH, int HS, float theta) override {
    cuda::rope_forward(x, B, T, NH, HS, theta, stream_);
  }
  void rope_backward(float* dx, int B, int T, int NH, int HS, float theta) override {
    cuda::rope_backward(dx, B, T, NH, HS, theta, stream_);
  }
  void gqa_pack_forward(float* qkv, const float* q, const float* k, const float* v, int BT, int NH, int NKV,
                        int HS) override {
    cuda::gqa_pack_forward(qkv, q, k, v, BT, NH, NKV, HS, stream_);
  }
  void gqa_pack_backward(float* dq, float* dk, float* dv, const float* dqkv, int BT, int NH, int NKV,
                         int HS) override {
    cuda::gqa_pack_backward(dq, dk, dv, dqkv, BT, NH, NKV, HS, stream_);
  }
  void residual_forward(float* out, const float* a, const float* b, long N) override {
    cuda::residual_forward(out, a, b, N, stream_);
  }
  void residual_backward(float* da, float* db, const float* dout, long N) override {
    cuda::residual_backward(da, db, dout, N, stream_);
  }
  void crossentropy_local_max(float* row_max, const float* logits, int BT, int Vl) override {
    cuda::crossentropy_local_max(row_max, logits, BT, Vl, stream_);
  }
  void crossentropy_local_sums(float* sums, const float* logits, const float* row_max, const int* targets,
                               const int* local_row, int BT, int Vl) override {
    cuda::crossentropy_local_sums(sums, logits, row_max, targets, local_row, BT, Vl, stream_);
  }
  void crossentropy_loss(float* losses, const float* row_max, const float* sums, int BT) override {
    cuda::crossentropy_loss(losses, row_max, sums, BT, stream_);
  }
  void crossentropy_backward(float* dlogits, const float* logits, const float* row_max, const float* sums,
                             const int* targets, const int* local_row, float dloss, int BT, int Vl) override {
    cuda::crossentropy_backward(dlogits, logits, row_max, sums, targets, local_row, dloss, BT, Vl, stream_);
  }
  void adamw_update(float* params, const float* grads, float* m, float* v, long n, float lr, float beta1, float beta2,
                    float eps, float weight_decay, float grad_scale, int t) override {
    cuda::adamw_update(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, grad_scale, t, stream_);
  }
  double sum_squares(const float* x, long n) override { return cuda::sum_squares(x, n, sumsq_scratch_, stream_); }

 private:
  static void warn(cudaError_t e, const char* what) {
    if (e != cudaSuccess) std::fprintf(stderr, "ntpbench: warning: %s: %s\n", what, cuda_error_text(e).c_str());
  }

  // Zeroed device memory (at least one element, so the pointer is never null).
  void* device_alloc(std::size_t bytes) {
    if (bytes == 0) bytes = sizeof(float);
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      std::size_t free_b = 0, total_b = 0;
      cudaMemGetInfo(&free_b, &total_b);
      throw std::runtime_error("--backend cuda: cudaMalloc of " + std::to_string(bytes >> 20) + " MiB on GPU " +
                               std::to_string(device_) + " failed (" + std::to_string(free_b >> 20) + " of " +
                               std::to_string(total_b >> 20) + " MiB free): " + cuda_error_text(e));
    }
    NTP_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    return p;
  }

  // Called from destructors (Arena): reports instead of throwing.
  void device_free(void* p) {
    if (!p) return;
    warn(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");  // no kernel still uses p
    warn(cudaFree(p), "cudaFree");
  }

  // Scratch for the deterministic row reductions; grows, never shrinks.
  float* scratch(std::size_t floats) { return grow(scratch_, scratch_floats_, floats); }
  // Scratch for the bf16 copies of GEMM operands (--precision bf16); grows, never shrinks.
  __nv_bfloat16* bf16_scratch(std::size_t elems) { return grow(bf16_scratch_, bf16_scratch_elems_, elems); }

  // Makes `buf` (holding `have` elements) hold at least `need`; its contents are not kept.
  template <typename T>
  T* grow(T*& buf, std::size_t& have, std::size_t need) {
    if (need > have) {
      if (buf) {
        NTP_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no queued kernel still uses it
        NTP_CUDA_CHECK(cudaFree(buf));
        buf = nullptr;
        have = 0;
      }
      NTP_CUDA_CHECK(cudaMalloc(&buf, need * sizeof(T)));
      have = need;
    }
    return buf;
  }

  int device_;
  bool bf16_;  // --precision bf16: bf16 GEMM operands
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  double* sumsq_scratch_ = nullptr;
  float* scratch_ = nullptr;
  std::size_t scratch_floats_ = 0;
  __nv_bfloat16* bf16_scratch_ = nullptr;
  std::size_t bf16_scratch_elems_ = 0;
};

}  // namespace

std::string cuda_device_problem(int local_rank, bool share) {
  int device = 0;
  return find_device(local_rank, share, device);
}

std::unique_ptr<Backend> make_cuda_backend(int local_rank, Precision precision) {
  return std::make_unique<CudaBackend>(local_rank, precision);
}

}  // namespace ntp
