#include "schedule.hpp"

#include <algorithm>
#include <limits>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <tuple>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <yaml-cpp/yaml.h>

namespace ntp {

namespace {

struct Ctx {
  std::string name;
  [[noreturn]] void fail(const YAML::Node& n, const std::string& msg) const {
    const auto m = n.Mark();
    if (m.line >= 0) throw ScheduleError(fmt::format("{}:{}: {}", name, m.line + 1, msg));
    throw ScheduleError(fmt::format("{}: {}", name, msg));
  }
  long long integer(const YAML::Node& n, const std::string& what) const {
    if (!n.IsScalar()) fail(n, what + " must be an integer");
    const std::string s = n.Scalar();
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used != s.size() || s.empty()) fail(n, fmt::format("{} must be an integer, got '{}'", what, s));
    return v;
  }
  double number(const YAML::Node& n, const std::string& what) const {
    if (!n.IsScalar()) fail(n, what + " must be a number");
    std::size_t used = 0;
    double v = 0;
    try {
      v = std::stod(n.Scalar(), &used);
    } catch (...) {
      used = 0;
    }
    if (used != n.Scalar().size()) fail(n, fmt::format("{} must be a number, got '{}'", what, n.Scalar()));
    return v;
  }
  void only_keys(const YAML::Node& map, std::initializer_list<const char*> keys, const std::string& where) const {
    for (const auto& kv : map) {
      const std::string k = kv.first.Scalar();
      if (std::find_if(keys.begin(), keys.end(), [&](const char* a) { return k == a; }) == keys.end()) {
        std::string known;
        for (auto a : keys) known += (known.empty() ? "" : ", ") + std::string(a);
        fail(kv.first, fmt::format("unknown key '{}' in {} (known: {})", k, where, known));
      }
    }
  }
};

}  // namespace

Schedule Schedule::load(const std::string& path, int world_size, int steps, const std::vector<std::string>& hosts) {
  std::ifstream f(path);
  if (!f) throw ScheduleError("cannot open schedule file '" + path + "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse(ss.str(), path, world_size, steps, hosts);
}

namespace {

// One kill or revive of one rank, as written in the file.
struct RawEvent {
  int step;
  bool kill;
  int rank;
  YAML::Node node;
  StepPoint at = StepPoint::Start;
  std::string host;  // the kill_node / revive_node it came from, else empty
  bool hang = false;  // a `hang:` entry: a kill whose process stops instead of dying
};

constexpr int kStepPhases = 5;  // the phases of a step; "repair" and "handover" strike in a repair or a revival

// An `at:` value: one of kStepPointNames (or, where any_ok, "any": one of the step's phases, drawn per kill,
// returned as -1; the generator's kills do not strike in repairs).
int read_phase(const Ctx& c, const YAML::Node& n, bool any_ok) {
  const std::string s = n.IsScalar() ? n.Scalar() : "";
  const int points = any_ok ? kStepPhases : static_cast<int>(kStepPointNames.size());
  for (int k = 0; k < points; ++k)
    if (s == kStepPointNames[k]) return k;
  if (any_ok && s == "any") return -1;
  c.fail(n, fmt::format("'at' must be one of start, forward, backward, sync, optimizer, {}, got '{}'",
                        any_ok ? "any" : "repair, handover", s));
}

// The logical ranks on host `n` (a kill_node / revive_node value), at least one.
std::vector<int> ranks_on(const Ctx& c, const YAML::Node& n, const std::vector<std::string>& hosts, int world_size) {
  const std::string host = n.IsScalar() ? n.Scalar() : "";
  if (host.empty()) c.fail(n, "a node is named by its host name, e.g. kill_node: node2");
  if (static_cast<int>(hosts.size()) != world_size)
    c.fail(n, "kill_node / revive_node need the hosts of the job's ranks, which are known only inside a run");
  std::vector<int> ranks;
  for (int r = 0; r < world_size; ++r)
    if (hosts[r] == host) ranks.push_back(r);
  if (ranks.empty()) {
    std::set<std::string> known(hosts.begin(), hosts.end());
    c.fail(n, fmt::format("no rank of this job runs on host '{}' (its hosts: {})", host, fmt::join(known, ", ")));
  }
  return ranks;
}

// The ranks one event names under `kind` (kill, revive) and node_kind (kill_node, revive_node).
void read_targets(const Ctx& c, const YAML::Node& e, int step, StepPoint at, const std::vector<std::string>& hosts,
                  int world_size, std::vector<RawEvent>& raw) {
  for (const std::string kind : {"kill", "hang", "revive"}) {
    const auto list = e[kind];
    if (!list) continue;
    if (!list.IsSequence()) c.fail(list, fmt::format("'{}' must be a list of ranks, e.g. [3]", kind));
    for (const auto& r : list) {
      const long long rank = c.integer(r, "rank");
      if (rank < 0 || rank >= world_size)
        c.fail(r, fmt::format("rank {} does not exist (this job has ranks 0..{})", rank, world_size - 1));
      raw.push_back({step, kind != "revive", int(rank), r, at, "", kind == "hang"});
    }
  }
  for (const char* kind : {"kill_node", "revive_node"}) {
    const auto n = e[kind];
    if (!n) continue;
    for (int rank : ranks_on(c, n, hosts, world_size))
      raw.push_back({step, std::string(kind) == "kill_node", rank, n, at, n.Scalar()});
  }
}

// A `slow` event: its ranks, `factor` (required) and `link_factor` (default 1), each at least 1.
void read_slowdowns(const Ctx& c, const YAML::Node& e, int step, int world_size,
                    std::map<int, std::vector<Slowdown>>& slow) {
  for (const char* k : {"kill", "hang", "revive", "kill_node", "revive_node", "at"})
    if (e[k]) c.fail(e[k], fmt::format("a slow event has no '{}': give it an event of its own", k));
  if (!e["factor"]) c.fail(e, "a slow event needs 'factor' (how many times slower: 2 is half speed, 1 ends it)");
  const double factor = c.number(e["factor"], "factor");
  const double link = e["link_factor"] ? c.number(e["link_factor"], "link_factor") : 1.0;
  if (!(factor >= 1 && factor <= 1000)) c.fail(e["factor"], "factor must be from 1 (full speed) to 1000");
  if (!(link >= 1 && link <= 1000)) c.fail(e["link_factor"], "link_factor must be from 1 (full speed) to 1000");
  const auto list = e["slow"];
  if (!list.IsSequence()) c.fail(list, "'slow' must be a list of ranks, e.g. [3]");
  for (const auto& r : list) {
    const long long rank = c.integer(r, "rank");
    if (rank < 0 || rank >= world_size)
      c.fail(r, fmt::format("rank {} does not exist (this job has ranks 0..{})", rank, world_size - 1));
    auto& at = slow[step];
    if (std::any_of(at.begin(), at.end(), [&](const Slowdown& d) { return d.rank == rank; }))
      c.fail(r, fmt::format("rank {} has two slow events at step {}", rank, step));
    at.push_back({int(rank), factor, link});
  }
}

// The 'events' list, checked entry by entry (keys, step range, rank range, hosts).
std::vector<RawEvent> read_events(const Ctx& c, const YAML::Node& ev, int world_size, int steps,
                                  const std::vector<std::string>& hosts, std::map<int, std::vector<Slowdown>>& slow) {
  std::vector<RawEvent> raw;
  if (!ev.IsSequence())
    c.fail(ev, "'events' must be a list of {step: N, kill: [...]} / {step: N, hang: [...]} / {step: N, revive: [...]}");
  for (const auto& e : ev) {
    if (!e.IsMap()) c.fail(e, "each event is a mapping like {step: 10, kill: [3]}");
    c.only_keys(e, {"step", "kill", "hang", "revive", "kill_node", "revive_node", "at", "slow", "factor", "link_factor"},
                "an event");
    if (!e["step"]) c.fail(e, "event without 'step'");
    const long long step = c.integer(e["step"], "step");
    if (step < 1 || step > steps) c.fail(e["step"], fmt::format("step {} is outside the run (steps 1..{})", step, steps));
    if (!e["kill"] && !e["hang"] && !e["revive"] && !e["kill_node"] && !e["revive_node"] && !e["slow"])
      c.fail(e, "event has none of 'kill', 'hang', 'revive', 'kill_node', 'revive_node', 'slow'");
    if (e["slow"]) {
      read_slowdowns(c, e, int(step), world_size, slow);
      continue;
    }
    for (const char* k : {"factor", "link_factor"})
      if (e[k]) c.fail(e[k], fmt::format("'{}' belongs to a slow event, e.g. {{step: 5, slow: [3], factor: 2}}", k));
    if (e["at"] && !e["kill"] && !e["hang"] && !e["kill_node"]) c.fail(e["at"], "'at' belongs to a kill or a hang");
    const StepPoint at = e["at"] ? StepPoint(read_phase(c, e["at"], false)) : StepPoint::Start;
    if ((at == StepPoint::Repair || at == StepPoint::Handover) && e["hang"])
      c.fail(e["at"], fmt::format("'at: {}' belongs to a kill (a hang there is not modelled)", step_point_name(at)));
    read_targets(c, e, int(step), at, hosts, world_size, raw);
  }
  return raw;
}

// Replays the explicit events in step order, refusing impossible ones (a kill of a dead rank, a
// revive of a live one, two events for one rank at one step), into `events`.
void apply_events(const Ctx& c, std::vector<RawEvent> raw, int world_size, std::map<int, StepEvents>& events) {
  std::stable_sort(raw.begin(), raw.end(), [](const RawEvent& a, const RawEvent& b) { return a.step < b.step; });
  std::vector<bool> alive(world_size, true);
  for (std::size_t i = 0; i < raw.size();) {
    const int step = raw[i].step;
    std::set<int> touched;
    for (; i < raw.size() && raw[i].step == step; ++i) {
      const auto& r = raw[i];
      if (!touched.insert(r.rank).second) c.fail(r.node, fmt::format("rank {} has two events at step {}", r.rank, step));
      if (r.kill && !alive[r.rank]) c.fail(r.node, fmt::format("step {}: kill of rank {}, which is already dead", step, r.rank));
      if (!r.kill && alive[r.rank]) c.fail(r.node, fmt::format("step {}: revive of rank {}, which is alive", step, r.rank));
      alive[r.rank] = !r.kill;
      auto& se = events[step];
      (r.kill ? se.kill : se.revive).push_back(r.rank);
      if (r.kill) se.kill_at.push_back(r.at), se.kill_hangs.push_back(r.hang);
      auto& nodes = r.kill ? se.nodes_killed : se.nodes_revived;
      if (!r.host.empty() && std::find(nodes.begin(), nodes.end(), r.host) == nodes.end()) nodes.push_back(r.host);
    }
    // A kill in a repair needs a failure of its step to repair.
    const auto& se = events[step];
    const auto in_repair = [](StepPoint a) { return a == StepPoint::Repair; };
    if (std::any_of(se.kill_at.begin(), se.kill_at.end(), in_repair) &&
        std::all_of(se.kill_at.begin(), se.kill_at.end(), in_repair))
      for (std::size_t j = i; j-- > 0 && raw[j].step == step;)
        if (raw[j].kill) c.fail(raw[j].node, fmt::format("step {}: a kill 'at: repair' strikes in the repair of another "
                                                         "kill of the same step, and this step has none",
                                                         step));
    // A kill in a handover needs a revival of its step to hand over.
    if (se.revive.empty())
      for (std::size_t j = i; j-- > 0 && raw[j].step == step;)
        if (raw[j].kill && raw[j].at == StepPoint::Handover)
          c.fail(raw[j].node, fmt::format("step {}: a kill 'at: handover' strikes in the handover of a revival of the "
                                          "same step, and this step revives no rank",
                                          step));
  }
}

// The generator's slow episodes (`slow_mtbf_steps`, `slow_steps`, `slow_factor`, all three or none):
// each rank without explicit events starts one with probability 1/slow_mtbf_steps per step while at
// full speed; it runs at 1/slow_factor for slow_steps steps. From a stream of its own, so adding them
// leaves the failures as they were.
void add_random_slowdowns(const Ctx& c, const YAML::Node& rnd, const std::set<int>& explicit_ranks, int world_size,
                          int steps, std::uint64_t seed, std::map<int, StepEvents>& events) {
  const int given = !!rnd["slow_mtbf_steps"] + !!rnd["slow_steps"] + !!rnd["slow_factor"];
  if (given == 0) return;
  if (given != 3) c.fail(rnd, "slow episodes need all of 'slow_mtbf_steps', 'slow_steps' and 'slow_factor'");
  const double mtbf = c.number(rnd["slow_mtbf_steps"], "slow_mtbf_steps");
  if (!(mtbf > 0)) c.fail(rnd["slow_mtbf_steps"], "slow_mtbf_steps must be positive");
  const long long length = c.integer(rnd["slow_steps"], "slow_steps");
  if (length < 1) c.fail(rnd["slow_steps"], "slow_steps must be at least 1");
  const double factor = c.number(rnd["slow_factor"], "slow_factor");
  if (!(factor > 1 && factor <= 1000)) c.fail(rnd["slow_factor"], "slow_factor must be above 1 (2: half speed), at most 1000");
  std::mt19937_64 rng(seed ^ 0x165667b19e3779f9ULL);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int r = 0; r < world_size; ++r) {
    if (explicit_ranks.count(r)) continue;
    for (int step = 1; step <= steps; ++step) {
      if (u(rng) >= 1.0 / mtbf) continue;
      events[step].slow.push_back({r, factor, 1});
      const long long back = step + length;
      if (back > steps) break;
      events[int(back)].slow.push_back({r, 1, 1});
      step = int(back);
    }
  }
}

// The 'random' generator: each rank without explicit events, while alive, fails at each step with
// probability 1/mtbf (exponential inter-arrival in steps) and comes back repair_steps later.
// Returns repair_steps (capped to an int).
int add_random_failures(const Ctx& c, const YAML::Node& rnd, const std::set<int>& explicit_ranks, int world_size,
                        int steps, std::map<int, StepEvents>& events) {
  if (!rnd.IsMap()) c.fail(rnd, "'random' must be a mapping {mtbf_steps: ..., repair_steps: ..., seed: ...}");
  c.only_keys(rnd, {"mtbf_steps", "repair_steps", "seed", "at", "hang_fraction", "slow_mtbf_steps", "slow_steps",
                    "slow_factor"},
              "'random'");
  for (const char* k : {"mtbf_steps", "repair_steps", "seed"})
    if (!rnd[k]) c.fail(rnd, fmt::format("'random' needs '{}'", k));
  const double mtbf = c.number(rnd["mtbf_steps"], "mtbf_steps");
  if (!(mtbf > 0)) c.fail(rnd["mtbf_steps"], "mtbf_steps must be positive");
  const long long repair = c.integer(rnd["repair_steps"], "repair_steps");
  if (repair < 1) c.fail(rnd["repair_steps"], "repair_steps must be at least 1");
  const long long seed = c.integer(rnd["seed"], "seed");
  if (seed < 0) c.fail(rnd["seed"], "seed must not be negative");
  const int phase = rnd["at"] ? read_phase(c, rnd["at"], true) : 0;
  const double hang_fraction = rnd["hang_fraction"] ? c.number(rnd["hang_fraction"], "hang_fraction") : 0;
  if (!(hang_fraction >= 0 && hang_fraction <= 1))
    c.fail(rnd["hang_fraction"], "hang_fraction is a share of the failures, from 0 to 1");
  std::mt19937_64 rng(static_cast<std::uint64_t>(seed));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // The phases come from a stream of their own, so adding `at` leaves the failure times as they were.
  std::mt19937_64 phase_rng(static_cast<std::uint64_t>(seed) ^ 0x9e3779b97f4a7c15ULL);
  std::mt19937_64 hang_rng(static_cast<std::uint64_t>(seed) ^ 0xc2b2ae3d27d4eb4fULL);  // likewise for hangs
  for (int r = 0; r < world_size; ++r) {
    if (explicit_ranks.count(r)) continue;
    for (int step = 1; step <= steps; ++step) {
      if (u(rng) >= 1.0 / mtbf) continue;
      events[step].kill.push_back(r);
      events[step].kill_at.push_back(StepPoint(phase >= 0 ? phase : int(phase_rng() % 5)));
      events[step].kill_hangs.push_back(hang_fraction > 0 && u(hang_rng) < hang_fraction);
      const long long back = step + repair;
      if (back > steps) break;  // down for the rest of the run (repair_steps may exceed any int)
      events[int(back)].revive.push_back(r);
      step = int(back);  // alive again from `back`; the loop's ++ moves past it
    }
  }
  add_random_slowdowns(c, rnd, explicit_ranks, world_size, steps, static_cast<std::uint64_t>(seed), events);
  return static_cast<int>(std::min<long long>(repair, std::numeric_limits<int>::max()));
}

}  // namespace

Schedule Schedule::parse(const std::string& text, const std::string& name, int world_size, int steps,
                         const std::vector<std::string>& hosts) {
  Ctx c{name};
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ScheduleError(fmt::format("{}:{}: malformed YAML: {}", name, e.mark.line + 1, e.msg));
  }
  Schedule s;
  // A schedule that says nothing (an empty file, a YAML null, `events: []` without `random`) is
  // most likely a mistake: no failures is the run without --schedule.
  const auto empty = [&] {
    throw ScheduleError(fmt::format("{}: the schedule is empty: it has no events and no 'random' generator "
                                    "(for a run without failures, leave out --schedule)",
                                    name));
  };
  if (root.IsNull()) empty();
  if (!root.IsMap()) c.fail(root, "a schedule is a mapping with 'events' and/or 'random'");
  c.only_keys(root, {"events", "random"}, "the schedule");
  const auto events = root["events"];
  if (!root["random"] && (!events || events.IsNull() || (events.IsSequence() && events.size() == 0))) empty();
  // Explicit events first; random failures only touch ranks that have none.
  std::set<int> explicit_ranks;
  if (const auto ev = root["events"]) {
    std::map<int, std::vector<Slowdown>> slow;
    std::vector<RawEvent> raw = read_events(c, ev, world_size, steps, hosts, slow);
    for (auto& [step, list] : slow) {
      for (const Slowdown& d : list) explicit_ranks.insert(d.rank);  // the generator leaves them alone too
      s.events_[step].slow = std::move(list);
    }
    for (const auto& r : raw) explicit_ranks.insert(r.rank);
    apply_events(c, std::move(raw), world_size, s.events_);
  }
  if (const auto rnd = root["random"])
    s.repair_steps_ = add_random_failures(c, rnd, explicit_ranks, world_size, steps, s.events_);
  for (auto& [step, e] : s.events_) {
    std::vector<std::tuple<int, StepPoint, char>> kills;
    for (std::size_t i = 0; i < e.kill.size(); ++i) kills.emplace_back(e.kill[i], e.kill_at[i], e.kill_hangs[i]);
    std::sort(kills.begin(), kills.end());
    for (std::size_t i = 0; i < kills.size(); ++i) std::tie(e.kill[i], e.kill_at[i], e.kill_hangs[i]) = kills[i];
    std::sort(e.revive.begin(), e.revive.end());
    std::sort(e.nodes_killed.begin(), e.nodes_killed.end());
    std::sort(e.nodes_revived.begin(), e.nodes_revived.end());
    std::sort(e.slow.begin(), e.slow.end(), [](const Slowdown& a, const Slowdown& b) { return a.rank < b.rank; });
  }
  return s;
}

const StepEvents& Schedule::at(int step) const {
  static const StepEvents none;
  auto it = events_.find(step);
  return it == events_.end() ? none : it->second;
}

bool Schedule::revival_after(int step) const {
  for (auto it = events_.upper_bound(step); it != events_.end(); ++it)
    if (!it->second.revive.empty()) return true;
  return false;
}

std::vector<int> Schedule::revived_after(int step) const {
  std::set<int> ranks;
  for (auto it = events_.upper_bound(step); it != events_.end(); ++it) ranks.insert(it->second.revive.begin(), it->second.revive.end());
  return {ranks.begin(), ranks.end()};
}

int Schedule::repair_unscheduled(int step, int rank, int steps) {
  if (repair_steps_ == 0 || step > steps - repair_steps_) return 0;
  const auto& killed = at(step).kill;
  if (std::find(killed.begin(), killed.end(), rank) != killed.end()) return 0;  // a scheduled death
  const int back = step + repair_steps_;
  for (auto it = events_.upper_bound(step); it != events_.end() && it->first <= back; ++it)
    if (std::find(it->second.revive.begin(), it->second.revive.end(), rank) != it->second.revive.end()) return 0;
  add_revival(back, rank);
  return back;
}

void Schedule::add_revival(int step, int rank) {
  auto& revive = events_[step].revive;
  revive.insert(std::upper_bound(revive.begin(), revive.end(), rank), rank);
  added_.emplace_back(step, rank);
}

int Schedule::kills() const {
  int n = 0;
  for (const auto& [s, e] : events_) n += static_cast<int>(e.kill.size());
  return n;
}

int Schedule::revives() const {
  int n = 0;
  for (const auto& [s, e] : events_) n += static_cast<int>(e.revive.size());
  return n;
}

}  // namespace ntp
