#pragma once
// The two things the ntpbench binary does: train (and record), or replay a recorded run.
#include "comm.hpp"
#include "options.hpp"

namespace ntp {

// A configuration problem every rank detects identically (rank 0 reports it; exit code 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int run_training(Options o, Comm& world);
int run_replay(const Options& o, Comm& world);

}  // namespace ntp
