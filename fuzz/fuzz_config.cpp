// The --config TOML loader (CLI11 inside src/app/cli.cpp) on arbitrary text: parse_options
// returns options or an exit code (2: a message names the problem), nothing else escapes.
#include <cstddef>
#include <cstdint>

#include "cli.hpp"
#include "temp_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string path = ntp::fuzz::write_input(data, size, ".toml");
  char arg0[] = "ntpbench", flag[] = "--config";
  char* argv[] = {arg0, flag, path.data(), nullptr};
  const ntp::ParseResult r = ntp::parse_options(3, argv, /*print=*/false);
  if (!r.options && r.exit_code != 0 && r.exit_code != 2) __builtin_trap();
  return 0;
}
