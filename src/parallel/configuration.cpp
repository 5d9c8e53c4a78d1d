#include "configuration.hpp"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ntp_layout.hpp"

namespace ntp {

Topology::Topology(int world_size_, int world_rank_, int tp_, int stages_)
    : world_size(world_size_), world_rank(world_rank_), tp(tp_), stages(stages_) {
  if (stages < 1) throw std::invalid_argument(fmt::format("--pp {} must be at least 1", stages));
  if (tp < 1 || world_size % (tp * stages) != 0)
    throw std::invalid_argument(stages == 1 ? fmt::format("--tp {} does not divide the {} ranks of this job", tp,
                                                          world_size)
                                            : fmt::format("--tp {} x --pp {} does not divide the {} ranks of this job",
                                                          tp, stages, world_size));
  replicas = world_size / (tp * stages);
  replica = replica_of_rank(world_rank);
  stage = world_rank % (tp * stages) / tp;
  slot = world_rank % tp;
}

std::vector<int> Topology::replica_ranks(int r) const {
  std::vector<int> ranks(ranks_per_replica());
  std::iota(ranks.begin(), ranks.end(), r * ranks_per_replica());
  return ranks;
}

int Configuration::active_replicas() const {
  return static_cast<int>(std::count_if(replicas.begin(), replicas.end(), [](auto& r) { return r.active(); }));
}
int Configuration::live_ranks() const { return static_cast<int>(std::count(alive.begin(), alive.end(), 1)); }
long long Configuration::samples() const {
  long long n = 0;
  for (const auto& r : replicas) n += r.batch;
  return n;
}
std::vector<int> Configuration::batches() const {
  std::vector<int> b;
  for (const auto& r : replicas) b.push_back(r.batch);
  return b;
}
std::vector<int> Configuration::degrees() const {
  std::vector<int> d;
  for (const auto& r : replicas) d.push_back(r.active() ? r.degree() : 0);
  return d;
}
bool Configuration::uniform() const {
  const auto even = [this](const ShardMap& map) { return map == ShardMap::even(map.units(), n2); };
  for (const auto& r : replicas)
    if (r.active() && (r.degree() != n2 || !std::all_of(r.layout.maps.begin(), r.layout.maps.end(), even)))
      return false;
  return true;
}
int Configuration::replica_of(int world_rank) const {
  for (int q = 0; q < static_cast<int>(replicas.size()); ++q)
    if (replicas[q].active() && std::count(replicas[q].ranks.begin(), replicas[q].ranks.end(), world_rank)) return q;
  return -1;
}
int Configuration::tp_index_of(int world_rank) const {
  const int q = replica_of(world_rank);
  if (q < 0) return -1;
  const auto& rk = replicas[q].ranks;
  return static_cast<int>(std::find(rk.begin(), rk.end(), world_rank) - rk.begin()) % replicas[q].degree();
}
int Configuration::stage_of(int world_rank) const {
  const int q = replica_of(world_rank);
  if (q < 0) return -1;
  const auto& rk = replicas[q].ranks;
  return static_cast<int>(std::find(rk.begin(), rk.end(), world_rank) - rk.begin()) / replicas[q].degree();
}

Configuration plan_configuration(Policy policy, const Topology& topo, const ModelConfig& m, int B, double boost,
                                 const std::vector<char>& alive, int M) {
  Configuration c;
  c.alive = alive;
  const int t = topo.tp, P = topo.stages;
  if (M < 1 || B % M != 0)
    throw std::invalid_argument(fmt::format("a batch of {} sequences does not split into {} micro-batches", B, M));
  const bool everyone = std::all_of(alive.begin(), alive.end(), [](char a) { return a != 0; });
  c.replicas.resize(topo.replicas);
  for (int r = 0; r < topo.replicas; ++r) {
    auto& rp = c.replicas[r];
    rp.stages = P;
    // Live ranks per stage; every stage trains with the least-staffed stage's count.
    const std::vector<int> all = topo.replica_ranks(r);
    std::vector<std::vector<int>> live(P);
    for (int s = 0; s < P; ++s)
      for (int j = 0; j < t; ++j)
        if (alive[all[s * t + j]]) live[s].push_back(all[s * t + j]);
    int n = t;
    for (const auto& l : live) n = std::min(n, static_cast<int>(l.size()));
    for (const auto& l : live) rp.ranks.insert(rp.ranks.end(), l.begin(), l.begin() + n);
    bool active = false;
    switch (policy) {
      case Policy::DpDrop: active = n == t; break;
      case Policy::Restart: active = everyone; break;
      case Policy::Ntp:
      case Policy::NtpPw: active = n > 0; break;
    }
    if (!active) {
      rp.ranks.clear();
      continue;
    }
    rp.state = n == t ? ReplicaState::Healthy : ReplicaState::Degraded;
    rp.batch = B;
    rp.micro_batches = M;
    if (n < t && policy == Policy::Ntp) {
      if (M == 1)
        rp.batch = std::max(1, B * n / t);
      else
        rp.micro_batches = std::max(1, M * n / t), rp.batch = B / M * rp.micro_batches;
    }
    if (n < t && policy == Policy::NtpPw) rp.speed = boost;
  }
  for (const auto& rp : c.replicas)
    if (rp.active()) c.n2 = c.n2 == 0 ? rp.degree() : std::min(c.n2, rp.degree());
  for (auto& rp : c.replicas)
    if (rp.active()) rp.layout = core_extra_layout(m, rp.degree(), c.n2);
  return c;
}

Configuration configuration_for_degrees(const ModelConfig& m, const std::vector<int>& degrees) {
  Configuration c;
  int next = 0;
  c.n2 = *std::min_element(degrees.begin(), degrees.end());
  for (int d : degrees) {
    ReplicaPlan rp;
    for (int k = 0; k < d; ++k) rp.ranks.push_back(next++);
    rp.state = ReplicaState::Healthy;
    rp.batch = 1;
    rp.layout = core_extra_layout(m, d, c.n2);
    c.replicas.push_back(rp);
  }
  c.alive.assign(next, 1);
  return c;
}

std::string format_degrees(const std::vector<int>& degrees) { return fmt::format("{}", degrees); }

}  // namespace ntp
