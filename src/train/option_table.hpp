#pragma once
// Every option of a run, declared once: its flag, its key in the JSON record (the results file's
// `config` attribute, the join message a replacement process reads, --replay), its help text, its
// checks and the value assumed for files written before it existed. The command line and the
// --config TOML (app/cli.cpp), to_json and options_from_json (options.cpp) are all derived from
// option_table(), so an option cannot reach one of them and miss another.
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "options.hpp"

namespace ntp {

// A field of Options, reached through a plain function (a captureless lambda).
template <typename T>
using FieldRef = T& (*)(Options&);

// An option whose text is not a member's own type (the model family, the lr schedule): it reads
// and writes Options through text, and names the member it stands for.
struct TextField {
  std::string (*get)(const Options&);
  void (*set)(Options&, const std::string&);  // throws std::invalid_argument on an unknown value
};

using OptionField = std::variant<FieldRef<int>, FieldRef<std::uint64_t>, FieldRef<float>, FieldRef<double>,
                                 FieldRef<bool>, FieldRef<std::string>, TextField>;

// What the command line checks before a value is accepted (floating-point values are also
// required to be finite in their own type).
enum class Check { None, Positive, NonNegative, Range, OneOf, ExistingFile };

// Where a recorded option's value comes from when a file lacks its key.
enum class Missing {
  Required,  // the key has been recorded since the first schema: its absence is an error
  Default,   // the option is newer than some files: they ran with today's default
  Legacy,    // they ran with `legacy` (e.g. kill_mode: fence, before real kills existed)
};

struct OptionSpec {
  std::string flag{};  // "--lr"; "" for a recorded field set from others (optimizer/total_steps)
  std::string key{};   // its place in the JSON record, "/" between levels; "" = not recorded
  OptionField field{};
  std::string help{};
  Check check = Check::None;
  double lo = 0, hi = 0;             // Check::Range, inclusive
  std::vector<std::string> choices{};  // Check::OneOf
  Missing missing = Missing::Required;
  nlohmann::json legacy{};  // Missing::Legacy
  // A model dimension (or the preset itself): the preset sets it, the flag, when given, overrides
  // it; --help shows no default (it is the preset's).
  bool model_override = false;
  bool negated = false;  // a switch that sets its field false (--no-final-checkpoint)
  // The flag takes no value (a bool field): present = true, or false when negated.
  bool is_switch() const { return std::holds_alternative<FieldRef<bool>>(field); }
};

const std::vector<OptionSpec>& option_table();

// The spec of `flag` ("--lr"); throws std::out_of_range for an unknown flag.
const OptionSpec& option_spec(const std::string& flag);

// The field's value as JSON, and back (throws nlohmann::json::exception on a wrong type).
nlohmann::json field_value(const OptionSpec& s, const Options& o);
void set_field_value(const OptionSpec& s, Options& o, const nlohmann::json& v);
// Copies the field's value from `from` into `to`.
void copy_field(const OptionSpec& s, const Options& from, Options& to);

// A run's options as their JSON record (the results file's `config` attribute, the join message,
// --replay), and back: every option of option_table(), at its key.
nlohmann::json to_json(const Options& o);
Options options_from_json(const nlohmann::json& j);

}  // namespace ntp
