#include "grad_sync.hpp"

#include <chrono>
#include <cmath>

#include "ntp_layout.hpp"

namespace ntp {

namespace {
constexpr ShardDim kDims[3] = {ShardDim::Heads, ShardDim::Mlp, ShardDim::Vocab};
double seconds_since(PhaseClock::clock::time_point t0) {
  return std::chrono::duration<double>(PhaseClock::clock::now() - t0).count();
}
}  // namespace

GradSync::GradSync(const Configuration& cfg, int replica, int tp_index, Comm& tp, Comm* slot,
                   const ParamLayout& layout, Backend& be, PhaseClock& clock, Pacer& pacer)
    : layout_(layout), be_(be), clock_(clock), pacer_(pacer), tp_(tp), slot_(slot), tp_index_(tp_index),
      n2_(cfg.n2), uniform_(cfg.uniform()) {
  const int n = cfg.replicas[replica].degree();
  std::size_t replicated = 0;
  for (int t = 0; t < layout.tensor_count(); ++t)
    if (layout.specs()[t].dim == ShardDim::Replicated) replicated += layout.slot(t).elems;
  replicated_.resize(replicated);
  if (uniform_) return;

  const ModelConfig& m = layout.model();
  const int units[3] = {m.heads, m.mlp(), m.vocab};
  std::vector<ReshardPlan> to, from;
  for (int k = 0; k < 3; ++k) {
    const auto& owners = layout.tp().map(kDims[k]).owners();
    const auto chunks = chunk_map(units[k], n, n2_).owners();
    to.emplace_back(owners, chunks, tp_index, n);
    from.emplace_back(chunks, owners, tp_index, n);
    chunk_units_.push_back(to.back().dst_count());
  }
  // Replicated gradients: copy j goes from core rank 0's chunk buffer to rank j.
  std::vector<int> src(n, 0), dst(n), rows(n, tp_index == 0 ? 0 : -1);
  for (int j = 0; j < n; ++j) dst[j] = j;
  from.emplace_back(src, dst, tp_index, n, &rows);
  to_chunks_ = std::make_unique<ReshardPlan>(ReshardPlan::combine(to));
  from_chunks_ = std::make_unique<ReshardPlan>(ReshardPlan::combine(from));
  // Core rank i's chunk buffer: for each tensor its chunk-i units, then all replicated tensors.
  std::size_t off = 0;
  chunk_offset_.resize(layout.tensor_count());
  for (int t = 0; t < layout.tensor_count(); ++t) {
    const auto& s = layout.specs()[t];
    chunk_offset_[t] = off;
    if (s.dim == ShardDim::Replicated) continue;
    const int k = s.dim == ShardDim::Heads ? 0 : s.dim == ShardDim::Mlp ? 1 : 2;
    off += std::size_t(chunk_units_[k]) * s.unit_elems;
  }
  if (tp_index_ < n2_) chunk_.resize(off + replicated);
}

void GradSync::pack_replicated(const float* grads, float* out) const {
  for (int t = 0; t < layout_.tensor_count(); ++t)
    if (layout_.specs()[t].dim == ShardDim::Replicated) {
      const auto& s = layout_.slot(t);
      be_.copy(out, grads + s.offset, s.elems);
      out += s.elems;
    }
}

void GradSync::unpack_replicated(const float* in, float* grads) const {
  for (int t = 0; t < layout_.tensor_count(); ++t)
    if (layout_.specs()[t].dim == ShardDim::Replicated) {
      const auto& s = layout_.slot(t);
      be_.copy(grads + s.offset, in, s.elems);
      in += s.elems;
    }
}

std::vector<ReshardTensor> GradSync::tensors(float* grads, bool to_chunks) {
  std::vector<ReshardTensor> v;
  const bool core = tp_index_ < n2_;
  for (int t = 0; t < layout_.tensor_count(); ++t) {
    const auto& s = layout_.specs()[t];
    if (s.dim == ShardDim::Replicated) continue;
    const int seg = s.dim == ShardDim::Heads ? 0 : s.dim == ShardDim::Mlp ? 1 : 2;
    float* arena = grads + layout_.slot(t).offset;
    float* chunk = core ? chunk_.data() + chunk_offset_[t] : nullptr;
    v.push_back(to_chunks ? ReshardTensor{arena, chunk, s.unit_elems, seg} : ReshardTensor{chunk, arena, s.unit_elems, seg});
  }
  if (!to_chunks) {
    const float* rep = tp_index_ == 0 ? chunk_.data() + (chunk_.size() - replicated_.size()) : nullptr;
    v.push_back({rep, replicated_.data(), static_cast<long>(replicated_.size()), 3});
  }
  return v;
}

void GradSync::sync(float* grads) {
  bytes_ = 0;
  auto allreduce = [&](float* buf, std::size_t n) {
    PhaseScope p(clock_, Phase::DpComm);
    const auto t0 = PhaseClock::clock::now();
    slot_->allreduce_sum(buf, n);
    const int R = slot_->size();
    const double bytes = R > 1 ? 2.0 * (R - 1) / R * n * sizeof(float) : 0.0;
    bytes_ += bytes;
    pacer_.pace_transfer(seconds_since(t0), bytes, 2 * (R - 1), Link::Dp);
  };
  if (uniform_) {
    allreduce(grads, layout_.total());
    return;
  }
  auto regroup = [&](bool to_chunks) {
    PhaseScope p(clock_, Phase::Reshard);
    const auto t0 = PhaseClock::clock::now();
    const double sent = reshard(tp_, to_chunks ? *to_chunks_ : *from_chunks_, tensors(grads, to_chunks));
    bytes_ += sent;
    pacer_.pace_transfer(seconds_since(t0), sent, tp_.size() - 1, Link::Tp);
  };
  const std::size_t rep_off = chunk_.size() - replicated_.size();
  regroup(true);
  if (slot_) {
    pack_replicated(grads, chunk_.data() + rep_off);
    allreduce(chunk_.data(), chunk_.size());
  }
  regroup(false);  // also hands every rank core rank 0's summed replicated gradients
  PhaseScope p(clock_, Phase::Reshard);
  unpack_replicated(replicated_.data(), grads);
}

double GradSync::global_norm(const float* grads) {
  PhaseScope p(clock_, Phase::Optimizer);
  // partial[i]: sharded squares of sync slot i; partial[n2]: replicated squares (slot 0 only).
  std::vector<double> partial(n2_ + 1, 0.0);
  if (tp_index_ < n2_) {
    for (int t = 0; t < layout_.tensor_count(); ++t) {
      const auto& s = layout_.specs()[t];
      const bool rep = s.dim == ShardDim::Replicated;
      if (rep && tp_index_ != 0) continue;
      const float* x = nullptr;
      long n = 0;
      if (uniform_) {
        x = grads + layout_.slot(t).offset, n = layout_.slot(t).elems;
      } else if (rep) {
        x = grads + layout_.slot(t).offset, n = layout_.slot(t).elems;
      } else {
        const int k = s.dim == ShardDim::Heads ? 0 : s.dim == ShardDim::Mlp ? 1 : 2;
        x = chunk_.data() + chunk_offset_[t], n = long(chunk_units_[k]) * s.unit_elems;
      }
      partial[rep ? n2_ : tp_index_] += be_.sum_squares(x, n);
    }
  }
  tp_.allreduce_sum(partial.data(), partial.size());
  double total = 0;
  for (double v : partial) total += v;  // fixed order: identical on every replica
  return std::sqrt(total);
}

}  // namespace ntp
