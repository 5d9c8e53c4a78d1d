#pragma once
// What the detector's verdicts (straggler.hpp) do under --straggler-policy evict or rebalance: the
// decision alone, with no communication, so every rank reaches the same one from the same verdicts
// and it is tested on its own (tests/test_stragglers.cpp). TrainingRun::act_on_stragglers carries
// it out (the reconfiguration) and records the actions.
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "straggler.hpp"

namespace ntp {

// What one verdict did: the straggler left the training groups (evict), or stayed because leaving
// would stop every replica or lose shards (evict refused), came back (rejoin), or its replica took
// layouts by speed (rebalance) and back (rebalance end).
enum class StragglerActionKind { Evict, EvictRefused, Rejoin, Rebalance, RebalanceEnd };

// Each is recorded as the /events kind of its name (RunRecord, event_kind.hpp).

// One action taken (or refused) for one verdict.
struct StragglerAction {
  int rank;
  StragglerActionKind kind;
  std::string why;  // EvictRefused: the reason
};

struct StragglerDecision {
  std::vector<char> evicted;  // per logical rank
  std::vector<double> speed;  // per logical rank; empty when every rank is at full speed
  std::vector<StragglerAction> actions;
};

// From the current membership (`alive`, `evicted`) and rank speeds (`speed`, empty: all 1), the
// verdicts' outcome. evict: a starting straggler leaves the training groups unless
// `refuse(evicted_after)` gives a reason (no replica could train, shards no live rank holds: it is
// then tolerated), an ending one rejoins; otherwise (rebalance) a starting straggler's speed becomes
// 1 / its ratio (at most 1) and an ending one's 1. Verdicts on ranks that have died since count
// for nothing.
StragglerDecision decide_straggler_actions(const std::vector<StragglerVerdict>& verdicts, bool evict,
                                           const std::vector<char>& alive, std::vector<char> evicted,
                                           std::vector<double> speed,
                                           const std::function<std::string(const std::vector<char>&)>& refuse);

}  // namespace ntp
