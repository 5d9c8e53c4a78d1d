#include "spare_pool.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "fault.hpp"
#include "exit_codes.hpp"

namespace ntp {

JobLayout layout_job(const std::vector<std::string>& hosts, int spares_per_host, int spare_hosts) {
  std::vector<std::string> order;  // hosts in order of their first process
  std::map<std::string, std::vector<int>> procs;
  for (int w = 0; w < static_cast<int>(hosts.size()); ++w) {
    if (procs[hosts[w]].empty()) order.push_back(hosts[w]);
    procs[hosts[w]].push_back(w);
  }
  if (spare_hosts >= static_cast<int>(order.size()) && spare_hosts > 0)
    throw UsageError(fmt::format("--spare-hosts {} leaves no host to train on: this job has {} host(s)", spare_hosts,
                                 order.size()));
  JobLayout l;
  std::vector<char> spare(hosts.size(), 0);
  for (std::size_t h = 0; h < order.size(); ++h) {
    const auto& on = procs[order[h]];
    const bool whole = static_cast<int>(h) >= static_cast<int>(order.size()) - spare_hosts;
    if (whole) l.whole_spare_hosts.insert(order[h]);
    if (!whole && spares_per_host >= static_cast<int>(on.size()))
      throw UsageError(fmt::format("--spares-per-host {} leaves no trainer on host {}, which runs {} process(es)",
                                   spares_per_host, order[h], on.size()));
    const std::size_t first_spare = whole ? 0 : on.size() - spares_per_host;
    for (std::size_t k = first_spare; k < on.size(); ++k) spare[on[k]] = 1;
  }
  for (int w = 0; w < static_cast<int>(hosts.size()); ++w)
    if (!spare[w]) l.trainer_hosts.push_back(hosts[w]);
  l.trainers = static_cast<int>(l.trainer_hosts.size());
  int logical = 0;
  for (int w = 0; w < static_cast<int>(hosts.size()); ++w) {
    if (spare[w]) {
      l.key.push_back(l.trainers + l.spares());
      l.spare_hosts.push_back(hosts[w]);
    } else {
      l.key.push_back(logical++);
    }
  }
  return l;
}

SparePool::SparePool(std::unique_ptr<Comm> pool, const JobLayout& layout, int my_key)
    : pool_(std::move(pool)), trainers_(layout.trainers), spare_hosts_(layout.spare_hosts),
      whole_spare_hosts_(layout.whole_spare_hosts), my_key_(my_key) {
  keys_ = pool_->allgather(my_key_);
}

std::vector<int> SparePool::live_spares() const {
  std::vector<int> out;
  for (int k : keys_)
    if (k >= trainers_) out.push_back(k);
  return out;
}

void SparePool::revoke() { pool_->revoke(); }

std::vector<int> SparePool::repair() {
  const std::vector<int> before = live_spares();
  pool_->agree(false);
  retired_.push_back(std::move(pool_));
  pool_ = retired_.back()->shrink();
  keys_ = pool_->allgather(my_key_);
  const std::vector<int> after = live_spares();
  std::vector<int> lost;
  std::set_difference(before.begin(), before.end(), after.begin(), after.end(), std::back_inserter(lost));
  return lost;
}

std::string SparePool::exchange(const std::string& plan) { return pool_->post(plan, 0); }

std::unique_ptr<Comm> SparePool::regroup(const std::vector<std::pair<int, int>>& key_to_rank) {
  for (const auto& [key, rank] : key_to_rank)
    if (key == my_key_) my_key_ = rank;
  auto group = pool_->split(is_trainer() ? 0 : -1, my_key_);
  retired_.push_back(std::move(pool_));
  pool_ = retired_.back()->split(0, my_key_);
  keys_ = pool_->allgather(my_key_);
  return group;
}

std::vector<std::pair<int, int>> SparePool::choose(const std::vector<int>& ranks,
                                                   const std::vector<std::string>& rank_hosts) const {
  std::vector<int> free = live_spares();
  std::vector<std::pair<int, int>> out;
  const auto take = [&](auto pred) {
    auto it = std::find_if(free.begin(), free.end(), pred);
    if (it == free.end()) return -1;
    const int key = *it;
    free.erase(it);
    return key;
  };
  std::map<std::string, std::vector<int>> homeless;  // by host: ranks with no spare slot there
  for (int r : ranks) {
    const std::string& h = rank_hosts.at(r);
    const int key = take([&](int k) { return host_of_spare(k) == h && !whole_spare_hosts_.count(h); });
    if (key >= 0)
      out.emplace_back(key, r);
    else
      homeless[h].push_back(r);
  }
  // The hosts that lost the most ranks first (a dead node before a rank that died with it
  // elsewhere), so a spare host goes to a whole scale-up domain rather than to a stray rank.
  std::vector<std::pair<std::string, std::vector<int>>> by_size(homeless.begin(), homeless.end());
  std::stable_sort(by_size.begin(), by_size.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  for (const auto& [host, on] : by_size) {
    // One whole spare host takes every rank of this host, and only of a host wholly lost: its TP
    // groups stay inside a host. (The deaths of one node can reach the survivors in two repairs; the
    // ranks of the first wait, dead, for the rest: Recovery::hand_over_to_spares asks again with them all.)
    const auto on_host = std::count(rank_hosts.begin(), rank_hosts.end(), host);
    if (static_cast<long>(on.size()) < on_host) continue;
    std::string into;
    for (const auto& s : whole_spare_hosts_) {
      const auto n = std::count_if(free.begin(), free.end(), [&](int k) { return host_of_spare(k) == s; });
      if (n >= static_cast<long>(on.size())) {
        into = s;
        break;
      }
    }
    if (into.empty()) continue;  // these ranks stay without a spare
    for (int r : on) out.emplace_back(take([&](int k) { return host_of_spare(k) == into; }), r);
  }
  return out;
}

bool SparePool::any_trainer() const {
  return std::any_of(keys_.begin(), keys_.end(), [&](int k) { return k < trainers_; });
}

}  // namespace ntp
