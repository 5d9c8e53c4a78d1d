// The mixture-of-experts operations of every backend: the CPU kernels, in place where the
// buffers are host memory, through host copies where they are device memory.
#include <vector>

#include "backend.hpp"
#include "kernels/cpu/moe_dispatch.hpp"
#include "kernels/cpu/moe_router.hpp"

namespace ntp {

namespace {
// A backend buffer seen from the host: the buffer itself, or a copy (read in, and written back
// at the end of the scope when `write_back`).
class HostView {
 public:
  HostView(Backend& be, const float* p, std::size_t n, bool read, bool write_back)
      : be_(be), device_(be.is_device_memory(p)), p_(const_cast<float*>(p)), n_(n), write_back_(write_back) {
    if (!device_) return;
    copy_.resize(n);
    if (read) be.to_host(copy_.data(), p, n);
  }
  ~HostView() {
    if (device_ && write_back_) be_.from_host(p_, copy_.data(), n_);
  }
  HostView(const HostView&) = delete;
  HostView& operator=(const HostView&) = delete;
  float* get() { return device_ ? copy_.data() : p_; }

 private:
  Backend& be_;
  bool device_;
  float* p_;
  std::size_t n_;
  bool write_back_;
  std::vector<float> copy_;
};
}  // namespace

void Backend::moe_router_forward(const float* logits, long T, int E, int k, long capacity, int* expert,
                                 float* weight, char* kept, float* probs, long* tokens_per_expert, long* dropped,
                                 float* aux_loss) {
  HostView z(*this, logits, std::size_t(T) * E, true, false);
  cpu::moe_router_forward(z.get(), T, E, k, capacity, expert, weight, kept, probs, tokens_per_expert, dropped,
                          aux_loss);
}

void Backend::moe_plan(const int* expert, const char* kept, long T, int E, int k, long* offsets, long* row_of) {
  cpu::moe_plan(expert, kept, T, E, k, offsets, row_of);
}

void Backend::moe_router_backward(float* dlogits, const float* probs, const int* expert, const float* weight,
                                  const float* dweight, long T, int E, int k, float aux_scale) {
  HostView dz(*this, dlogits, std::size_t(T) * E, true, true);
  cpu::moe_router_backward(dz.get(), probs, expert, weight, dweight, T, E, k, aux_scale);
}

void Backend::moe_dispatch_forward(float* xs, const float* x, const long* row_of, long T, int k, int C, long rows) {
  HostView out(*this, xs, std::size_t(rows) * C, true, true), in(*this, x, std::size_t(T) * C, true, false);
  cpu::moe_dispatch_forward(out.get(), in.get(), row_of, T, k, C);
}

void Backend::moe_dispatch_backward(float* dx, const float* dxs, const long* row_of, long T, int k, int C,
                                    long rows) {
  HostView out(*this, dx, std::size_t(T) * C, true, true), in(*this, dxs, std::size_t(rows) * C, true, false);
  cpu::moe_dispatch_backward(out.get(), in.get(), row_of, T, k, C);
}

void Backend::moe_combine_forward(float* y, const float* ys, const float* weight, const long* row_of, long T, int k,
                                  int C, long rows) {
  HostView out(*this, y, std::size_t(T) * C, true, true), in(*this, ys, std::size_t(rows) * C, true, false);
  cpu::moe_combine_forward(out.get(), in.get(), weight, row_of, T, k, C);
}

void Backend::moe_combine_backward(float* dys, float* dweight, const float* dy, const float* ys, const float* weight,
                                   const long* row_of, long T, int k, int C, long rows) {
  HostView out(*this, dys, std::size_t(rows) * C, true, true), g(*this, dy, std::size_t(T) * C, true, false),
      in(*this, ys, std::size_t(rows) * C, true, false);
  cpu::moe_combine_backward(out.get(), dweight, g.get(), in.get(), weight, row_of, T, k, C);
}

}  // namespace ntp
