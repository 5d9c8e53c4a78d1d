#include "optimizer.hpp"

#include <cmath>

namespace ntp {

float OptimizerConfig::lr_at(int step) const {
  if (warmup > 0 && step <= warmup) return lr * float(step) / float(warmup);
  if (!cosine) return lr;
  const int span = std::max(1, total_steps - warmup);
  const double progress = std::min(1.0, double(step - warmup) / span);
  const double min_lr = double(lr) * min_lr_ratio;
  return float(min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress)));
}

AdamW::AdamW(Backend& backend, const ParamLayout& layout, const OptimizerConfig& cfg)
    : be_(backend), layout_(layout), cfg_(cfg), m_(backend, layout.total()), v_(backend, layout.total()) {}

double AdamW::grad_norm(const float* grads, Comm& tp) const {
  double sq[2] = {0.0, 0.0};  // {sharded, replicated}
  for (int t = 0; t < layout_.tensor_count(); ++t) {
    const auto& slot = layout_.slot(t);
    const double s = be_.sum_squares(grads + slot.offset, slot.elems);
    sq[layout_.specs()[t].dim == ShardDim::Replicated ? 1 : 0] += s;
  }
  tp.allreduce_sum(sq, 1);
  return std::sqrt(sq[0] + sq[1]);
}

void AdamW::step(float* params, const float* grads, float grad_scale, float lr) {
  ++t_;
  for (int t = 0; t < layout_.tensor_count(); ++t) {
    const auto& slot = layout_.slot(t);
    const float wd = layout_.specs()[t].decay ? cfg_.weight_decay : 0.0f;
    be_.adamw_update(params + slot.offset, grads + slot.offset, m_.data() + slot.offset, v_.data() + slot.offset,
                     slot.elems, lr, cfg_.beta1, cfg_.beta2, cfg_.eps, wd, grad_scale, t_);
  }
}

float clip_scale(double norm, float clip) {
  if (clip <= 0.0f || !(norm > clip)) return 1.0f;
  return float(clip / norm);
}

}  // namespace ntp
