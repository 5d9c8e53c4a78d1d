#pragma once
// One allocation of backend memory holding many named tensors (llm.c style): parameters,
// gradients, each AdamW moment and the activations are each one Arena.
#include <cstddef>

#include "backend.hpp"

namespace ntp {

class Arena {
 public:
  Arena() = default;
  Arena(Backend& b, std::size_t n) : backend_(&b), data_(n ? b.allocate(n) : nullptr), size_(n) {}
  ~Arena() { reset(); }
  Arena(Arena&& o) noexcept { *this = std::move(o); }
  Arena& operator=(Arena&& o) noexcept {
    if (this != &o) {
      reset();
      backend_ = o.backend_;
      data_ = o.data_;
      size_ = o.size_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  std::size_t size() const { return size_; }
  void zero() {
    if (data_) backend_->zero(data_, size_);
  }
  // Frees the memory (a killed rank drops its state this way).
  void reset() {
    if (data_) backend_->release(data_);
    data_ = nullptr;
    size_ = 0;
  }

 private:
  Backend* backend_ = nullptr;
  float* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace ntp
