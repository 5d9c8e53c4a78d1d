#include "reshard.hpp"

#include <cstring>
#include <stdexcept>
#include <string>

namespace ntp {

ReshardPlan::ReshardPlan(const std::vector<int>& src_owner, const std::vector<int>& dst_owner, int my_rank,
                         int comm_size, const std::vector<int>* src_rows)
    : send_units_(comm_size), recv_units_(comm_size) {
  if (src_owner.size() != dst_owner.size()) throw std::invalid_argument("reshard: placements differ in unit count");
  const int units = static_cast<int>(src_owner.size());
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

long ReshardPlan::units_moved_out() const {
  long n = 0;
  for (const auto& s : send_units_) n += static_cast<long>(s.size());
  return n;
}

double reshard(Comm& comm, const ReshardPlan& plan, const std::vector<ReshardTensor>& tensors) {
  const int P = comm.size();
  long elems_per_unit_set = 0;  // floats of one unit across all tensors
  for (const auto& t : tensors) elems_per_unit_set += t.unit_elems;

  std::vector<int> scount(P), sdispl(P), rcount(P), rdispl(P);
  long stotal = 0, rtotal = 0;
  for (int p = 0; p < P; ++p) {
    const long s = static_cast<long>(plan.sends()[p].size()) * elems_per_unit_set;
    const long r = static_cast<long>(plan.recvs()[p].size()) * elems_per_unit_set;
    if (stotal + s > INT32_MAX || rtotal + r > INT32_MAX)
      throw std::runtime_error("reshard: exchange exceeds 2^31 floats; split the tensors into several calls");
    scount[p] = static_cast<int>(s), sdispl[p] = static_cast<int>(stotal), stotal += s;
    rcount[p] = static_cast<int>(r), rdispl[p] = static_cast<int>(rtotal), rtotal += r;
  }
  std::vector<float> sendbuf(stotal), recvbuf(rtotal);

  // Pack peer by peer, tensor by tensor, unit by unit; unpack in the same order.
  float* out = sendbuf.data();
  for (int p = 0; p < P; ++p)
    for (const auto& t : tensors)
      for (int u : plan.sends()[p]) {
        std::memcpy(out, t.src + long(plan.src_index(u)) * t.unit_elems, t.unit_elems * sizeof(float));
        out += t.unit_elems;
      }
  for (const auto& t : tensors)
    for (int u : plan.kept())
      std::memcpy(t.dst + long(plan.dst_index(u)) * t.unit_elems, t.src + long(plan.src_index(u)) * t.unit_elems,
                   t.unit_elems * sizeof(float));

  comm.alltoallv(sendbuf.data(), scount, sdispl, recvbuf.data(), rcount, rdispl);

  const float* in = recvbuf.data();
  for (int p = 0; p < P; ++p)
    for (const auto& t : tensors)
      for (int u : plan.recvs()[p]) {
        std::memcpy(t.dst + long(plan.dst_index(u)) * t.unit_elems, in, t.unit_elems * sizeof(float));
        in += t.unit_elems;
      }
  return double(stotal) * sizeof(float);
}

}  // namespace ntp
