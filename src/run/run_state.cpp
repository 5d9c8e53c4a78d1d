#include "run_state.hpp"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "machine.hpp"

namespace ntp {

RunState::RunState(Options options, Membership who, Schedule events)
    : o(std::move(options)), members(std::move(who)), schedule(std::move(events)),
      threads(configure_threads(o.threads, members.group())) {}

void RunState::set_now(double t) {
  t0 = std::chrono::steady_clock::now() -
       std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t));
}

namespace {
// Speeds all at 1 are no speeds (the even split): Trainer::set_rank_speeds' empty.
std::vector<double> unless_all_full(std::vector<double> speed) {
  if (std::all_of(speed.begin(), speed.end(), [](double x) { return x == 1.0; })) speed.clear();
  return speed;
}
}  // namespace

void RunState::forget_straggler(int r) {
  members.evicted[r] = 0;
  stragglers.forget(r);
  std::vector<double> speed = trainer->rank_speeds();
  if (r < int(speed.size()) && speed[r] != 1.0) {
    speed[r] = 1.0;
    trainer->set_rank_speeds(unless_all_full(std::move(speed)));
  }
}

RecoveryFigures RunState::figures(const Reconfiguration& rc, int steps_before) {
  double slowest[4] = {rc.detect, rc.reconfigure, rc.heal, rc.link_bytes};
  members.group().allreduce_max(slowest, 4);
  RecoveryFigures f{.rc = rc, .detect = slowest[0], .reconfigure = slowest[1], .heal = slowest[2],
                    .bytes = rc.heal_bytes, .rank_bytes = slowest[3], .steps_before = steps_before};
  members.group().allreduce_sum(&f.bytes, 1);
  return f;
}

void RunState::record_processes(const std::vector<int>& only) {
  const auto who = members.group().gather(fmt::format("{} {}", static_cast<long long>(getpid()), host_name()),
                                          members.recorder_index());
  if (root()) record->incarnations(members.in_group, who, only, now());
}

}  // namespace ntp
