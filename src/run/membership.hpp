#pragma once
// Who is in the run, as one rank sees it: the live group (a communicator over the live processes,
// in logical order), each logical rank alive or not and evicted (a straggler out of the training
// groups) or not, each one's host at job start, and which rank holds the results file. A repair
// or a revival changes it by adopting a new group; the straggler policy by evicting.
#include <memory>
#include <string>
#include <vector>

#include "comm.hpp"
#include "comm_counting.hpp"

namespace ntp {

class Membership {
 public:
  // The launcher's world: every rank alive, rank 0 the recorder.
  Membership(Comm& world, std::vector<std::string> hosts);
  // A replacement process joining as logical rank `me` over `group`, with the survivors' view
  // (in_group is empty until gather_order, the joining's first collective).
  Membership(std::unique_ptr<Comm> group, int me, std::vector<std::string> hosts, std::vector<char> alive, int recorder);

  // The live group, seen through the control plane's counter (comm_counting.hpp).
  Comm& group() const { return *counted_; }
  // The calls and payload bytes on the group so far, every group this rank has had together.
  const CommTally& control() const { return *control_; }
  int size() const { return static_cast<int>(alive.size()); }
  // This rank holds the results file.
  bool records() const { return me == recorder; }
  // The recorder's index in the group.
  int recorder_index() const;
  // Logical ranks with no live process.
  std::vector<int> dead() const;
  // The ranks that train: alive and not evicted (by default, as `evicted` says).
  std::vector<char> training(const std::vector<char>& evicted_ranks) const;
  std::vector<char> training() const { return training(evicted); }
  // `group` (after a shrink or a spawn) becomes the live group: in_group and alive follow it.
  void adopt(std::unique_ptr<Comm> group);
  // in_group from the group (collective).
  void gather_order() { in_group = group().allgather(me); }

  const int me;                           // logical rank
  const std::vector<std::string> hosts;   // each logical rank's host at job start
  std::vector<int> in_group;              // logical rank of each group member
  std::vector<char> alive;                // per logical rank
  std::vector<char> evicted;              // per logical rank: out of the training groups (evict)
  int recorder = 0;  // logical rank 0 at the start; then the lowest live one when it dies (it keeps it)

 private:
  void count_calls_on(Comm& group) { counted_ = std::make_unique<CountingComm>(group, control_); }

  std::shared_ptr<CommTally> control_ = std::make_shared<CommTally>();
  std::unique_ptr<Comm> owned_;                 // once the launcher's world has been shrunk or grown
  std::unique_ptr<Comm> counted_;               // the live group through the counter
  std::vector<std::unique_ptr<Comm>> retired_;  // earlier groups, never freed: see adopt()
};

}  // namespace ntp
