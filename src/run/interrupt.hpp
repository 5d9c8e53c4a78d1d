#pragma once
// An interrupt (Ctrl-C to mpirun, which passes SIGINT or SIGTERM to the ranks; scancel; the batch
// system's time limit) ends the recorder's rank with one line saying where the run stopped and
// what its results file holds (every completed step: rows are flushed as they are written),
// and exit status 130.
#include <string>

namespace ntp {

// On the recorder's rank: from now on, SIGINT and SIGTERM print the line for `results` and end
// the process with status 130.
void report_interrupts(const std::string& results);
// After each row: the step the run is at and the rows the file holds.
void note_progress(int step, int rows);

}  // namespace ntp
