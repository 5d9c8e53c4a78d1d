#pragma once
// The command line (and --config TOML): every flag, its help text and its checks, resolved into
// Options.
#include <optional>

#include "options.hpp"

namespace ntp {

// Parses argv. Returns the options, or an exit code when the program should stop (after --help:
// 0; on an error: 2, with the message already printed on rank 0). `world_size`: the job's
// processes, named beside a --tp too large for the model when it is wrong for them too (0: unknown).
struct ParseResult {
  std::optional<Options> options;
  int exit_code = 0;
};
ParseResult parse_options(int argc, char** argv, bool print, int world_size = 0);

}  // namespace ntp
