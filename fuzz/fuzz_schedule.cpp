// The failure-schedule parser (src/resilience/schedule.cpp) on arbitrary text: it returns a
// schedule or throws ScheduleError, nothing else. Each input is parsed for a small job and a
// large one, so both the range checks and the random generator's loops get exercised.
#include <cstddef>
#include <cstdint>
#include <string>

#include "schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const struct {
    int world, steps;
  } jobs[] = {{1, 1}, {8, 200}};
  for (const auto& job : jobs) {
    try {
      const auto s = ntp::Schedule::parse(text, "fuzz.yaml", job.world, job.steps);
      // What the trainer reads of a schedule must hold: events inside the run, on existing ranks.
      for (const auto& [step, e] : s.events()) {
        if (step < 1 || step > job.steps || e.kill.size() != e.kill_at.size()) __builtin_trap();
        for (int r : e.kill) if (r < 0 || r >= job.world) __builtin_trap();
        for (int r : e.revive) if (r < 0 || r >= job.world) __builtin_trap();
      }
    } catch (const ntp::ScheduleError&) {
    }
  }
  return 0;
}
