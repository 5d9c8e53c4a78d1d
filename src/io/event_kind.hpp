#pragma once
// What an /events row records: every kind a run writes, named once (results/README.md lists each;
// tests/integration/test_schema_doc.py holds the two together).
#include <array>
#include <cstddef>

namespace ntp {

enum class EventKind {
  Kill, Revive, NodeDown, NodeUp,                       // a schedule's (or an unscheduled) death and return
  Lost, Notice, Repair, Detect, Reconfigure, Heal,      // a recovery's parts
  Spawn, Spare, Takeover, NoSpare, SpareLost,           // the processes of revivals
  Restore, Rollback, Recompute,                         // restart and dp-drop's way back
  Hang, Slow, Straggler, StragglerEnd,                  // slow and stopped ranks
  Evict, EvictRefused, Rejoin, Rebalance, RebalanceEnd, // --straggler-policy's actions
  Recorder, Nonfinite, Checkpoint,
  Count
};

// Each kind's name in the file, in the order of the values.
inline constexpr std::array<const char*, static_cast<std::size_t>(EventKind::Count)> kEventKindNames{
    "kill",   "revive",        "node_down", "node_up",   "lost",       "notice",    "repair",    "detect",
    "reconfigure", "heal",     "spawn",     "spare",     "takeover",   "no_spare",  "spare_lost", "restore",
    "rollback", "recompute",   "hang",      "slow",      "straggler",  "straggler_end",
    "evict",  "evict_refused", "rejoin",    "rebalance", "rebalance_end",
    "recorder", "nonfinite",   "checkpoint"};
static_assert(kEventKindNames.back() != nullptr, "a name for every kind");

inline const char* name(EventKind k) { return kEventKindNames.at(static_cast<std::size_t>(k)); }

// The parts of a recovery: paced, their emulated seconds are the next row's recovery_seconds.
inline bool is_recovery(EventKind k) {
  switch (k) {
    case EventKind::Notice: case EventKind::Repair: case EventKind::Detect: case EventKind::Reconfigure:
    case EventKind::Heal: case EventKind::Restore: case EventKind::Spawn: case EventKind::Spare:
    case EventKind::Takeover:
      return true;
    default:
      return false;
  }
}

}  // namespace ntp
