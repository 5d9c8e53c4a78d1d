#include "handover.hpp"

#include "option_table.hpp"

namespace ntp {

// The join message as JSON: each field named once, here (nlohmann's macros); the options go
// through their own record (option_table.hpp), as in the results file.
void to_json(nlohmann::json& j, const Options& o) { j = to_json(o); }
void from_json(const nlohmann::json& j, Options& o) { o = options_from_json(j); }
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Peak, gflops, source)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(StragglerDetector::RankState, straggler, streak)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JoinState, logical_rank, alive, rank_speed, valid, lost, cursor, initial_cursor,
                                   steps, initial_steps, restore_path)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(JoinMessage, options, step, elapsed, ranks, state, recorder, hosts,
                                   peak, added_revivals, stragglers, evicted, probe_base)

nlohmann::json to_json(const JoinMessage& m) { return m; }
JoinMessage join_message_from_json(const nlohmann::json& j) { return j.get<JoinMessage>(); }

std::string to_text(const SparePlan& plan) {
  if (plan.end) return R"({"kind": "end"})";
  return nlohmann::json{{"kind", "take"}, {"assign", plan.assign}, {"join", to_json(plan.join)}}.dump();
}

SparePlan spare_plan_from_text(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  SparePlan plan;
  plan.end = j.at("kind") == "end";
  if (!plan.end) {
    plan.assign = j.at("assign").get<std::vector<std::pair<int, int>>>();
    plan.join = join_message_from_json(j.at("join"));
  }
  return plan;
}

}  // namespace ntp
