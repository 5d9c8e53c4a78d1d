#include "reshard.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace ntp {

ReshardPlan::ReshardPlan(const std::vector<int>& src_owner, const std::vector<int>& dst_owner, int my_rank,
                         int comm_size, const std::vector<int>* src_rows)
    : send_units_(comm_size), recv_units_(comm_size) {
  if (src_owner.size() != dst_owner.size()) throw std::invalid_argument("reshard: placements differ in unit count");
  const int units = static_cast<int>(src_owner.size());
  segment_begin_ = {0, units};
  src_index_.assign(units, -1);
  dst_index_.assign(units, -1);
  for (int u = 0; u < units; ++u) {
    const int s = src_owner[u], d = dst_owner[u];
    if (s >= comm_size || d >= comm_size) throw std::invalid_argument("reshard: owner outside the communicator");
    if (s == my_rank) {
      src_index_[u] = src_rows ? (*src_rows)[u] : src_count_;
      if (src_index_[u] < 0) throw std::invalid_argument("reshard: source rank does not hold unit " + std::to_string(u));
      ++src_count_;
    }
    if (d == my_rank) dst_index_[u] = dst_count_++;
    if (d == kNowhere) continue;
    if (s == kNowhere) throw std::runtime_error("reshard: unit " + std::to_string(u) + " is held by no live rank");
    if (s == d) {
      if (s == my_rank) kept_units_.push_back(u);
    } else if (s == my_rank) {
      send_units_[d].push_back(u);
    } else if (d == my_rank) {
      recv_units_[s].push_back(u);
    }
  }
}

ReshardPlan ReshardPlan::combine(const std::vector<ReshardPlan>& parts) {
  if (parts.empty()) throw std::invalid_argument("reshard: nothing to combine");
  ReshardPlan c;
  const std::size_t P = parts[0].send_units_.size();
  c.send_units_.assign(P, {});
  c.recv_units_.assign(P, {});
  c.segment_begin_ = {0};
  for (const auto& part : parts) {
    if (part.send_units_.size() != P) throw std::invalid_argument("reshard: plans over different groups");
    if (part.segments() != 1) throw std::invalid_argument("reshard: combine takes single-segment plans");
    const int off = c.segment_begin_.back();
    for (std::size_t p = 0; p < P; ++p) {
      for (int u : part.send_units_[p]) c.send_units_[p].push_back(off + u);
      for (int u : part.recv_units_[p]) c.recv_units_[p].push_back(off + u);
    }
    for (int u : part.kept_units_) c.kept_units_.push_back(off + u);
    c.src_index_.insert(c.src_index_.end(), part.src_index_.begin(), part.src_index_.end());
    c.dst_index_.insert(c.dst_index_.end(), part.dst_index_.begin(), part.dst_index_.end());
    c.src_count_ += part.src_count_;
    c.dst_count_ += part.dst_count_;
    c.segment_begin_.push_back(off + static_cast<int>(part.src_index_.size()));
  }
  return c;
}

long ReshardPlan::units_moved_out() const {
  long n = 0;
  for (const auto& s : send_units_) n += static_cast<long>(s.size());
  return n;
}

namespace {
// The units of `list` (ascending) that fall in the tensor's segment.
std::pair<const int*, const int*> in_segment(const std::vector<int>& list, const ReshardPlan& plan,
                                             const ReshardTensor& t) {
  const int* b = std::lower_bound(list.data(), list.data() + list.size(), plan.segment_begin(t.segment));
  const int* e = std::lower_bound(b, list.data() + list.size(), plan.segment_end(t.segment));
  return {b, e};
}
// Calls copy(first unit, count) for each run of units in [b, e) that one copy can move: each next
// unit follows on from the one before (`follows(prev, next)`: consecutive storage indices).
template <typename Follows, typename Copy>
void for_each_run(const int* b, const int* e, Follows follows, Copy copy) {
  for (const int* u = b; u != e;) {
    const int* r = u + 1;
    while (r != e && follows(r[-1], *r)) ++r;
    copy(*u, long(r - u));
    u = r;
  }
}
}  // namespace

ReshardExchange::ReshardExchange(Comm& comm, const ReshardPlan& plan, std::vector<ReshardTensor> tensors,
                                 Backend* be)
    : plan_(plan), tensors_(std::move(tensors)), be_(be) {
  const int P = comm.size();
  for (const auto& t : tensors_) {
    if (t.segment < 0 || t.segment >= plan.segments()) throw std::invalid_argument("reshard: no such segment");
    src_device_.push_back(be && t.src && be->is_device_memory(t.src));
    dst_device_.push_back(be && t.dst && be->is_device_memory(t.dst));
  }
  std::vector<int> scount(P), sdispl(P), rdispl(P);
  rcount_.assign(P, 0);
  long stotal = 0, rtotal = 0;
  for (int p = 0; p < P; ++p) {
    long s = 0, r = 0;
    for (const auto& t : tensors_) {
      auto [sb, se] = in_segment(plan.sends()[p], plan, t);
      auto [rb, re] = in_segment(plan.recvs()[p], plan, t);
      s += long(se - sb) * t.unit_elems;
      r += long(re - rb) * t.unit_elems;
    }
    if (stotal + s > INT32_MAX || rtotal + r > INT32_MAX)
      throw std::runtime_error("reshard: exchange exceeds 2^31 floats; split the tensors into several calls");
    scount[p] = static_cast<int>(s), sdispl[p] = static_cast<int>(stotal), stotal += s;
    rcount_[p] = static_cast<int>(r), rdispl[p] = static_cast<int>(rtotal), rtotal += r;
  }
  sendbuf_.resize(stotal);
  recvbuf_.resize(rtotal);

  // Pack peer by peer, tensor by tensor, in runs of units stored consecutively; finish() unpacks
  // in the same order.
  auto src_follows = [&](int prev, int next) { return plan.src_index(next) == plan.src_index(prev) + 1; };
  auto both_follow = [&](int prev, int next) {
    return src_follows(prev, next) && plan.dst_index(next) == plan.dst_index(prev) + 1;
  };
  float* out = sendbuf_.data();
  for (int p = 0; p < P; ++p)
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      const auto& t = tensors_[k];
      auto [b, e] = in_segment(plan.sends()[p], plan, t);
      for_each_run(b, e, src_follows, [&](int u, long units) {
        move(src_device_[k], out, t.src + long(plan.src_index(u)) * t.unit_elems, units * t.unit_elems);
        out += units * t.unit_elems;
      });
    }
  for (std::size_t k = 0; k < tensors_.size(); ++k) {
    const auto& t = tensors_[k];
    auto [b, e] = in_segment(plan.kept(), plan, t);
    for_each_run(b, e, both_follow, [&](int u, long units) {
      float* to = t.dst + long(plan.dst_index(u)) * t.unit_elems;
      const float* from = t.src + long(plan.src_index(u)) * t.unit_elems;
      if (to != from) move(src_device_[k] || dst_device_[k], to, from, units * t.unit_elems);
    });
  }
  request_ = comm.ialltoallv(sendbuf_.data(), scount, sdispl, recvbuf_.data(), rcount_, rdispl);
}

void ReshardExchange::move(bool device, float* dst, const float* src, std::size_t n) const {
  if (device)
    be_->copy(dst, src, n);
  else
    std::memcpy(dst, src, n * sizeof(float));
}

ReshardExchange::~ReshardExchange() {
  // The buffers must outlive the exchange; no unpacking. Destroying the request waits for it (and,
  // on a group where a peer died, swallows the error the unwinding code is already handling).
  request_.reset();
}

bool ReshardExchange::test() { return request_ == nullptr || request_->test(); }

void ReshardExchange::finish() {
  if (!request_) return;
  request_->wait();
  request_.reset();
  const float* in = recvbuf_.data();
  for (std::size_t p = 0; p < rcount_.size(); ++p)
    for (std::size_t k = 0; k < tensors_.size(); ++k) {
      const auto& t = tensors_[k];
      auto [b, e] = in_segment(plan_.recvs()[p], plan_, t);
      auto dst_follows = [&](int prev, int next) { return plan_.dst_index(next) == plan_.dst_index(prev) + 1; };
      for_each_run(b, e, dst_follows, [&](int u, long units) {
        move(dst_device_[k], t.dst + long(plan_.dst_index(u)) * t.unit_elems, in, units * t.unit_elems);
        in += units * t.unit_elems;
      });
    }
}

ReshardBytes reshard(Comm& comm, const ReshardPlan& plan, const std::vector<ReshardTensor>& tensors, Backend* be) {
  ReshardExchange x(comm, plan, tensors, be);
  x.finish();
  return {x.bytes_sent(), x.bytes_received()};
}

}  // namespace ntp
