#include "grad_sync.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "ntp_layout.hpp"

namespace ntp {

GradSync::GradSync(const Configuration& cfg, int replica, int tp_index, Comm& tp, Comm* slot,
                   const ParamLayout& layout, Backend& be, PhaseClock& clock, Pacer& pacer)
    : layout_(layout), be_(be), clock_(clock), pacer_(pacer), tp_(tp), slot_(slot), tp_index_(tp_index),
      n2_(cfg.n2), uniform_(cfg.uniform()) {
  if (uniform_) return;
  const int n = cfg.replicas[replica].degree();
  const ModelConfig& m = layout.model();
  std::vector<ReshardPlan> to, from;
  chunks_.units.assign(kShardDims.size(), 0);
  for (ShardDim d : kShardDims) {
    const auto& owners = layout.tp().map(d).owners();
    const auto chunks = chunk_map(shard_units(m, d), n, n2_).owners();
    to.emplace_back(owners, chunks, tp_index, n);
    from.emplace_back(chunks, owners, tp_index, n);
    chunks_.units[shard_index(d)] = to.back().dst_count();
  }
  // Replicated gradients: copy j goes from core rank 0's chunk buffer to rank j.
  std::vector<int> src(n, 0), dst(n), rows(n, tp_index == 0 ? 0 : -1);
  for (int j = 0; j < n; ++j) dst[j] = j;
  from.emplace_back(src, dst, tp_index, n, &rows);
  chunks_.to = std::make_unique<ReshardPlan>(ReshardPlan::combine(to));
  chunks_.from = std::make_unique<ReshardPlan>(ReshardPlan::combine(from));

  // Aligned: this replica's placement is the chunk placement (decided from the whole replica's
  // maps, so every rank of it agrees).
  chunks_.aligned = n == n2_;
  for (ShardDim d : kShardDims)
    chunks_.aligned = chunks_.aligned && layout.tp().map(d).owners() == chunk_map(shard_units(m, d), n, n2_).owners();

  // The chunk buffer in arena order: the bucket of a layer is one range of it.
  chunks_.offset.assign(layout.tensor_count(), 0);
  std::size_t off = 0;
  for (int t = 0; t < layout.tensor_count(); ++t) {
    const auto& s = layout.specs()[t];
    chunks_.offset[t] = off;
    if (!layout.holds(t)) continue;  // another pipeline stage's
    off += ParamLayout::padded(s.dim == ShardDim::Replicated
                                   ? std::size_t(s.unit_elems)
                                   : std::size_t(chunks_.units[shard_index(s.dim)]) * s.unit_elems);
  }
  if (chunks_.aligned && off != layout.total())
    throw std::logic_error("GradSync: an aligned replica's arena is not its chunk buffer");
  // Buckets in backward order: layer L-1 first, layer 0, then the rest (embeddings, final LN).
  const int L = m.layers;
  chunks_.buckets.resize(L + 1);
  for (int t = 0; t < layout.tensor_count(); ++t) {
    if (!layout.holds(t)) continue;
    const int layer = layout.specs()[t].layer;
    auto& bk = chunks_.buckets[layer >= 0 ? L - 1 - layer : L];
    const std::size_t len = (t + 1 < layout.tensor_count() ? chunks_.offset[t + 1] : off) - chunks_.offset[t];
    if (!bk.tensors.empty() && bk.tensors.back() == t - 1)
      bk.ranges.back().second += len;
    else
      bk.ranges.emplace_back(chunks_.offset[t], len);
    bk.tensors.push_back(t);
  }
  if (tp_index_ < n2_ && !chunks_.aligned) {
    chunks_.buffer = Arena(be, off);
    chunks_.buffer.zero();  // the padding between tensors rides along in the all-reduces
  }
  chunks_.regroup.resize(chunks_.buckets.size());
  chunks_.reverse.resize(chunks_.buckets.size());
}

GradSync::~GradSync() = default;

std::vector<ReshardTensor> GradSync::tensors(int b, bool to_chunks) {
  const bool core = tp_index_ < n2_;
  std::vector<ReshardTensor> v;
  for (int t : chunks_.buckets[b].tensors) {
    const auto& s = layout_.specs()[t];
    float* arena = grads_ + layout_.slot(t).offset;
    if (s.dim == ShardDim::Replicated) {
      // Back from chunks only: core rank 0's summed copy to every rank (kept in place there when
      // its chunk buffer is the arena).
      const int segment = static_cast<int>(kShardDims.size());  // after the sharded dimensions'
      if (!to_chunks) v.push_back({tp_index_ == 0 ? chunk() + chunks_.offset[t] : nullptr, arena, s.unit_elems, segment});
      continue;
    }
    if (chunks_.aligned) continue;  // already in place
    float* c = core ? chunk() + chunks_.offset[t] : nullptr;
    v.push_back(to_chunks ? ReshardTensor{arena, c, s.unit_elems, shard_index(s.dim)}
                          : ReshardTensor{c, arena, s.unit_elems, shard_index(s.dim)});
  }
  return v;
}

// Replicated gradients ride along in every slot's all-reduce.
void GradSync::pack_replicated(int b) {
  if (chunks_.aligned) return;  // they are in the arena already
  for (int t : chunks_.buckets[b].tensors)
    if (layout_.specs()[t].dim == ShardDim::Replicated)
      be_.copy(chunk() + chunks_.offset[t], grads_ + layout_.slot(t).offset, layout_.slot(t).elems);
}

void GradSync::begin(float* grads) {
  grads_ = grads;
  sent_.total = 0, sent_.allreduce = 0, sent_.regroup = 0;
  for (auto& f : chunks_.regroup) f.link = {};
}

// An exchange posted now: on the emulated TP link from now (behind what is on it) while the
// backward goes on; complete() waits for its emulated end.
GradSync::InFlight GradSync::post(const ReshardPlan& plan, int b, bool to_chunks) {
  auto exchange = std::make_unique<ReshardExchange>(tp_, plan, tensors(b, to_chunks), &be_);
  const LinkTicket link = pacer_.post(exchange->bytes_sent(), tp_.size() - 1, Link::Tp, Traffic::Parameters);
  return {std::move(exchange), link};
}

void GradSync::post_regroup(int b) {
  if (chunks_.aligned) return;  // every chunk is where it belongs
  chunks_.regroup[b] = post(*chunks_.to, b, true);
  sent_.regroup += chunks_.regroup[b].exchange->bytes_sent();
}

PaceClock::time_point GradSync::regroup_end() const {
  PaceClock::time_point end{};
  for (const auto& f : chunks_.regroup) end = std::max(end, f.link.end);
  return end;
}

void GradSync::layer_gradients_ready(int layer) {
  if (uniform_ || grads_ == nullptr) return;
  const int b = static_cast<int>(chunks_.buckets.size()) - 2 - layer;
  if (!chunks_.buckets[b].tensors.empty()) post_regroup(b);
  progress();
}

void GradSync::progress() {
  for (auto* list : {&chunks_.regroup, &chunks_.reverse})
    for (auto& f : *list)
      if (f.exchange) f.exchange->test();
}

void GradSync::complete(InFlight& f) {
  if (!f.exchange) return;  // nothing was posted (an aligned replica's regroup)
  PhaseScope p(clock_, Phase::Reshard);
  const auto began = pacer_.now();
  f.exchange->finish();
  const double sent = f.exchange->bytes_sent();
  f.exchange.reset();
  sent_.total += sent;
  pacer_.wait(f.link, began);
}

void GradSync::finish() {
  if (grads_ == nullptr) throw std::logic_error("GradSync::finish() without begin()");
  auto allreduce = [&](float* buf, std::size_t n) {
    PhaseScope p(clock_, Phase::DpComm);
    const auto t0 = PhaseClock::clock::now();
    slot_->allreduce_sum(buf, n);
    const int R = slot_->size();
    const double bytes = R > 1 ? 2.0 * (R - 1) / R * n * sizeof(float) : 0.0;
    sent_.total += bytes, sent_.allreduce += bytes;
    pacer_.pace_transfer(seconds_since(t0), bytes, 2 * (R - 1), Link::Dp, Traffic::Parameters);
  };
  if (uniform_) {
    allreduce(grads_, layout_.total());
    grads_ = nullptr;
    return;
  }
  const int B = static_cast<int>(chunks_.buckets.size());
  {
    PhaseScope p(clock_, Phase::Reshard);
    for (int b = 0; b < B; ++b)
      if (!chunks_.regroup[b].exchange && !chunks_.buckets[b].tensors.empty()) post_regroup(b);  // no ready call announced these
  }
  // The embedding bucket (last to be ready) goes second: see the header.
  std::vector<int> order;
  for (int b = 0; b < B - 1; ++b) {
    order.push_back(b);
    if (b == 0) order.push_back(B - 1);
  }
  std::erase_if(order, [&](int b) { return chunks_.buckets[b].tensors.empty(); });  // other stages' layers
  for (int b : order) {
    complete(chunks_.regroup[b]);
    if (slot_) {
      pack_replicated(b);
      for (const auto& [off, n] : chunks_.buckets[b].ranges)
        if (n > 0) allreduce(chunk() + off, n);
    }
    PhaseScope p(clock_, Phase::Reshard);
    chunks_.reverse[b] = post(*chunks_.from, b, false);
  }
  for (int b : order) complete(chunks_.reverse[b]);
  grads_ = nullptr;
}

void GradSync::sync(float* grads) {
  begin(grads);
  finish();
}

double GradSync::global_norm(const float* grads) { return std::sqrt(squared_norm(grads)); }

double GradSync::squared_norm(const float* grads) {
  PhaseScope p(clock_, Phase::Optimizer);
  const StageRange& stage = layout_.stage();
  // partial[i]: sharded squares of sync slot i; partial[n2]: replicated squares (slot 0 only).
  std::vector<double> partial(n2_ + 1, 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  double summed = 0;  // elements read
  if (tp_index_ < n2_) {
    for (int t = 0; t < layout_.tensor_count(); ++t) {
      const auto& s = layout_.specs()[t];
      const bool rep = s.dim == ShardDim::Replicated;
      if (rep && tp_index_ != 0) continue;
      if (!layout_.holds(t) || (s.home == Home::InputAndOutput && !stage.first_stage)) continue;
      const float* x = grads + layout_.slot(t).offset;
      long n = layout_.slot(t).elems;
      if (!uniform_ && !rep)
        x = (chunks_.aligned ? grads : chunks_.buffer.data()) + chunks_.offset[t],
        n = long(chunks_.units[shard_index(s.dim)]) * s.unit_elems;
      partial[rep ? n2_ : tp_index_] += be_.sum_squares(x, n);
      summed += double(n);
    }
  }
  pacer_.pace_pass(seconds_since(t0), summed, 2, sizeof(float));
  pacer_.wait_for_peers([&] { tp_.allreduce_sum(partial.data(), partial.size()); });
  double total = 0;
  for (double v : partial) total += v;  // fixed order: identical on every replica
  return total;
}

}  // namespace ntp
