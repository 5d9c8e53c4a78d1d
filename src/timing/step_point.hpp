#pragma once
// A point in a training step: where the trainer tells the run it has got to (its step hook), and
// where a schedule's kill strikes (`at:` in a schedule). Start: before the step's first
// collective; Repair: in the repair of another failure of the same step; Handover: in the handover
// of a revival of the same step, once the new processes have joined the group and before the heal
// (both signal mode; the trainer reports neither).
#include <array>
#include <string_view>

namespace ntp {

enum class StepPoint { Start, Forward, Backward, Sync, Optimizer, Repair, Handover };
inline constexpr std::array<std::string_view, 7> kStepPointNames = {"start", "forward", "backward", "sync",
                                                                     "optimizer", "repair", "handover"};
// The schedule's name of a point (`at: backward`).
inline const char* step_point_name(StepPoint p) { return kStepPointNames[static_cast<int>(p)].data(); }

}  // namespace ntp
