#pragma once
// ntpbench's exit codes, named once. The process's status, --help's footer and README's table come
// from here. (In the lowest room, timing, because the hang watchdog there ends the process too.)
#include <stdexcept>
#include <string>

namespace ntp {

enum class ExitCode : int {
  Ok = 0,            // the run finished (a replay: AGREES)
  Failed = 1,        // an internal or MPI error on some rank (its message names it); a replay that DISAGREES
  BadInput = 2,      // refused before step 1: flags, schedule, config, data, checkpoint, launcher
  NoReplica = 3,     // failures left no replica able to train and no revival would let one again
  NonFinite = 4,     // a non-finite loss or gradient norm under --on-nonfinite stop
  Hung = 5,          // no progress within --hang-timeout, or a revival's processes did not join in time
  Interrupted = 130  // SIGINT or SIGTERM: every completed step saved
};

inline constexpr int code(ExitCode c) { return static_cast<int>(c); }

// A configuration problem every rank detects identically (rank 0 reports it; exit code 2).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Real failures left no replica able to train and no revival still scheduled would let one train
// again: the run cannot go on (exit code 3). Also thrown, with exit code 4, for a non-finite loss
// or gradient norm under --on-nonfinite stop.
struct NoProgress : std::runtime_error {
  explicit NoProgress(const std::string& what, ExitCode code = ExitCode::NoReplica)
      : std::runtime_error(what), exit_code(ntp::code(code)) {}
  int exit_code;
};

struct ExitCodeMeaning {
  ExitCode code;
  const char* meaning;
};

inline constexpr ExitCodeMeaning kExitCodeMeanings[] = {
    {ExitCode::Ok, "the run finished (a replay: AGREES)"},
    {ExitCode::Failed, "an internal or MPI error on some rank (its message names it), or a replay that DISAGREES"},
    {ExitCode::BadInput,
     "bad input, refused before step 1: flags, schedule, config, data or checkpoint, an existing --out, --backend "
     "cuda without a usable GPU, another MPI's launcher, kills without fault tolerance"},
    {ExitCode::NoReplica,
     "failures left no replica able to train and no revival is scheduled that would let one (the results file "
     "holds every step so far)"},
    {ExitCode::NonFinite, "a non-finite loss or gradient norm (--on-nonfinite stop)"},
    {ExitCode::Hung,
     "a rank made no progress within --hang-timeout, or new processes for a revival did not join within 300 s (the "
     "MPI library reported nothing: a peer stopped without dying, or the library itself hangs)"},
    {ExitCode::Interrupted, "interrupted (SIGINT, or SIGTERM from a batch system): every completed step saved"},
};

// "Exit codes: 0 ...; 1 ...; ..." for --help.
inline std::string exit_codes_help() {
  std::string s = "Exit codes:";
  for (const ExitCodeMeaning& m : kExitCodeMeanings)
    s += std::string(m.code == ExitCode::Ok ? " " : "; ") + std::to_string(code(m.code)) + " " + m.meaning;
  return s + ".";
}

}  // namespace ntp
