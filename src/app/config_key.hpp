#pragma once
// A --config key that no flag takes, explained: CLI11 names the key alone ("INI was not able to
// parse micro_batch"); the user needs the file, the line and the flag that was meant.
#include <string>
#include <vector>

namespace ntp {

// CLI11's config error `what` for the TOML `files` of --config, rewritten for an unknown key as
// "FILE:LINE: unknown key 'micro_batch' (did you mean 'micro-batch'?)"; any other error unchanged.
std::string explain_config_error(const std::string& what, const std::vector<std::string>& files);

// A flag's value error ("--steps: must be above 0, not 0") whose value came from a --config file
// (not from `args`, the command line): "FILE:LINE: " before it; any other error unchanged.
std::string explain_value_error(const std::string& what, const std::vector<std::string>& files,
                                const std::vector<std::string>& args);

// The flag (without its "--") that `name` most likely meant: the same with '-' for '_' or in
// another case, or within two edits; "" when none is that close.
std::string closest_flag(const std::string& name);

}  // namespace ntp
