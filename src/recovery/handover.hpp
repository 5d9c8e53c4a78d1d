#pragma once
// What the survivors tell the processes that take dead ranks over (spawned, or spares from the
// pool): the run's state in one message, and the plan the pool hears. Both travel as JSON.
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "options.hpp"
#include "run_record.hpp"
#include "straggler.hpp"
#include "trainer.hpp"

namespace ntp {

// What a replacement process is told when it joins (TrainingRun's joining constructor).
struct JoinMessage {
  Options options;
  int step = 0;
  double elapsed = 0;              // the survivors' clock
  std::vector<int> ranks;          // logical ranks taken by the new processes, in spawn order
  JoinState state;                 // logical_rank filled by each joiner
  int recorder = 0;                // logical rank holding the results file
  std::vector<std::string> hosts;  // each logical rank's host at job start
  Peak peak;                       // the run's MFU denominator, fixed at its start
  std::vector<std::pair<int, int>> added_revivals;  // Schedule::added(): (step, rank)
  std::vector<StragglerDetector::RankState> stragglers;  // the survivors' detector (same on every rank)
  std::vector<int> evicted;        // logical ranks evicted as stragglers (--straggler-policy evict)
  double probe_base = 0;           // ... and the job's healthy probe time (StragglerWatch::measure_probe_base)
};

// What the trainers tell the spares waiting in the pool (SparePool::exchange): take these ranks,
// joining as `join` says, or the run is over and they may leave.
struct SparePlan {
  bool end = false;
  std::vector<std::pair<int, int>> assign;  // (spare key, logical rank)
  JoinMessage join;
};

nlohmann::json to_json(const JoinMessage& m);
JoinMessage join_message_from_json(const nlohmann::json& j);
std::string to_text(const SparePlan& plan);
SparePlan spare_plan_from_text(const std::string& text);

}  // namespace ntp
