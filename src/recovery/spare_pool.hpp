#pragma once
// Spare processes. A job started with more processes than TP x PP x DP keeps the extra ones as
// spares: the last K processes of every host (--spares-per-host) and every process of the last H
// hosts (--spare-hosts). Trainers keep the logical ranks 0..N-1 that schedules, rows and
// checkpoints name, whatever the placement; spares are numbered 0..S-1 in job order. A spare holds
// no training state: it waits in the pool (trainers and spares together, the fault-tolerant group
// every repair goes through) until the trainers hand it a dead rank, then joins them as a
// replacement process does (Recovery::join) and trains to the end.
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "comm.hpp"
#include "options.hpp"

namespace ntp {

// Who each process of the job is.
struct JobLayout {
  int trainers = 0;
  std::vector<int> key;                    // per world rank: logical rank, or trainers + spare number
  std::vector<std::string> trainer_hosts;  // per logical rank: its host at job start
  std::vector<std::string> spare_hosts;    // per spare: its host
  std::set<std::string> whole_spare_hosts; // hosts whose every process is a spare (--spare-hosts)
  int spares() const { return static_cast<int>(spare_hosts.size()); }
};

// The layout of a job on `hosts` (each world rank's host). Throws UsageError when the spares leave
// no trainer on a host that has processes, or ask for more hosts than the job has.
JobLayout layout_job(const std::vector<std::string>& hosts, int spares_per_host, int spare_hosts);

// The pool: trainers and spares in one fault-tolerant group, ordered by key (trainers first, by
// logical rank, so the pool's rank 0 is the lowest live trainer). Every member makes the same
// calls in the same order: repair() after a failure, exchange() and regroup() when spares are
// used, exchange() once more at the end.
class SparePool {
 public:
  SparePool(std::unique_ptr<Comm> pool, const JobLayout& layout, int my_key);
  int my_key() const { return my_key_; }
  bool is_trainer() const { return my_key_ < trainers_; }
  // Keys of the live spares, in pool order.
  std::vector<int> live_spares() const;
  bool any_trainer() const;
  int spare_number(int key) const { return key - trainers_; }
  const std::string& host_of_spare(int key) const { return spare_hosts_.at(key - trainers_); }
  // A trainer's part of a repair, before its own group's: wakes the spares waiting in the pool.
  void revoke();
  // Agree and shrink over the survivors, then learn who is left. Returns the spares lost (keys).
  std::vector<int> repair();
  // `plan` from the pool's rank 0 (the lowest live trainer) to every member.
  std::string exchange(const std::string& plan);
  // After a plan that gives spare `key`s logical ranks: the trainers' group, in logical order
  // (nullptr on a spare that stays one), and the pool re-keyed. Collective over the pool.
  std::unique_ptr<Comm> regroup(const std::vector<std::pair<int, int>>& key_to_rank);
  // A live spare for each of `ranks` (whose hosts at job start are `rank_hosts`) the pool can serve:
  // one on the rank's own host; else, when `ranks` hold every rank of their host (a whole host
  // lost), spares of one whole spare host for all of them, so that TP groups stay inside a host (a
  // host that lost only some ranks gets none: its groups would span two hosts). Returns (spare
  // key, logical rank) pairs, for the ranks served (maybe none).
  std::vector<std::pair<int, int>> choose(const std::vector<int>& ranks,
                                          const std::vector<std::string>& rank_hosts) const;
  Comm& comm() { return *pool_; }

 private:
  std::unique_ptr<Comm> pool_;
  std::vector<std::unique_ptr<Comm>> retired_;  // never freed while the job runs (TrainingRun::adopt says why)
  int trainers_;
  std::vector<std::string> spare_hosts_;
  std::set<std::string> whole_spare_hosts_;
  int my_key_;
  std::vector<int> keys_;  // every live member's key, in pool order
};


}  // namespace ntp
