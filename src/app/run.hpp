#pragma once
// What the ntpbench binary does: train (and record) or replay a recorded run, and the checks of
// the input both make before they start (exit code 2 on every rank together).
#include "comm.hpp"
#include "exit_codes.hpp"
#include "options.hpp"

namespace ntp {


int run_training(Options o, Comm& world);
// --data: refuses a bad data file with UsageError on every rank, after one check on rank 0
// (run_training.cpp).
void validate_data_file(const Options& o, Comm& world);
// --backend: refuses, with UsageError on every rank, a backend some rank cannot run (under cuda:
// no GPU of its own), after every rank has asked (run_training.cpp).
void check_backend(const Options& o, Comm& world);
int run_replay(const Options& o, Comm& world);
// A process spawned to replace a dead rank (--kill-mode signal): `parent` is the survivors' group
// with it appended (join_parent()); it learns the run's state from them and trains to the end.
int run_joined(Comm& parent);

}  // namespace ntp
