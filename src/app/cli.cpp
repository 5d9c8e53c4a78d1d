#include "cli.hpp"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <type_traits>

#include "config_key.hpp"
#include "exit_codes.hpp"
#include "option_table.hpp"
#include "tp_layout.hpp"

namespace ntp {

namespace {

// Every floating-point flag (and its --config key) must be a finite number that stays finite in the
// field's own type: CLI11's ranges compare, and NaN compares false, so `--lr nan` would pass them.
template <typename T>
CLI::Validator finite() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        long double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return "'" + in + "' is not a number";
        if (!std::isfinite(v)) return in + " is not a finite number";
        if (!std::isfinite(static_cast<T>(v)))
          return in + " is not a finite number in " + (sizeof(T) == 4 ? "single" : "double") + " precision";
        return {};
      },
      "", "FINITE");
}

// A number above 0 (or 0 and above): CLI11's own checks print the whole range up to DBL_MAX.
CLI::Validator at_least(bool zero) {
  return CLI::Validator(
      [zero](std::string& in) -> std::string {
        long double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return "'" + in + "' is not a number";
        if (zero ? v < 0 : v <= 0) return std::string("must be ") + (zero ? "0 or more" : "above 0") + ", not " + in;
        return {};
      },
      zero ? "NONNEGATIVE" : "POSITIVE", "");
}

// Text typed for a TextField option (the model family, the lr schedule), by flag.
using TextValues = std::map<std::string, std::string>;

// The flag's own type on the command line: a switch for a bool, a value otherwise (floating-point
// values finite first).
CLI::Option* add_field(CLI::App& app, const OptionSpec& s, Options& o, TextValues& text) {
  return std::visit(
      [&](auto f) -> CLI::Option* {
        using F = decltype(f);
        if constexpr (std::is_same_v<F, TextField>) {
          std::string& t = text[s.flag];
          t = s.model_override ? std::string() : f.get(o);
          return app.add_option(s.flag, t, s.help);
        } else {
          using T = std::remove_reference_t<decltype(f(o))>;
          if constexpr (std::is_same_v<T, bool>) return app.add_flag((s.negated ? "!" : "") + s.flag, f(o), s.help);
          CLI::Option* opt = app.add_option(s.flag, f(o), s.help);
          if constexpr (std::is_floating_point_v<T>) opt->check(finite<T>());
          if constexpr (std::is_arithmetic_v<T>)  // a range in the field's own type, as --help shows it
            if (s.check == Check::Range) opt->check(CLI::Range(static_cast<T>(s.lo), static_cast<T>(s.hi)));
          return opt;
        }
      },
      s.field);
}

// One row of the option table as a CLI11 option, with its checks.
void add_spec(CLI::App& app, const OptionSpec& s, Options& o, TextValues& text) {
  CLI::Option* opt = add_field(app, s, o, text);
  switch (s.check) {
    case Check::None: break;
    case Check::Positive: opt->check(at_least(false)); break;
    case Check::NonNegative: opt->check(at_least(true)); break;
    case Check::Range: break;  // add_field, in the field's type
    case Check::OneOf: opt->check(CLI::IsMember(s.choices)); break;
    case Check::ExistingFile: opt->check(CLI::ExistingFile); break;
  }
  if (s.model_override) opt->default_str("");  // the preset's
}

// The preset and family from --preset and --model, refusing a preset of the other family and
// Llama-only flags on GPT-2. Sets o.preset and o.model (the preset's dimensions).
void resolve_family(const CLI::App& app, const std::string& model, Options& o) {
  const std::string preset_flag = app.count("--preset") ? o.preset : std::string();
  if (!preset_flag.empty() && !model.empty() && model != family_name(preset_family(preset_flag))) {
    std::string same;
    for (const std::string& p : preset_names())
      if (family_name(preset_family(p)) == model) same += (same.empty() ? "" : ", ") + p;
    throw CLI::ValidationError("--model", "--preset " + preset_flag + " is a " +
                                              family_name(preset_family(preset_flag)) + " model, but --model is " +
                                              model + " (the " + model + " presets: " + same + ")");
  }
  o.preset = !preset_flag.empty() ? preset_flag : model == "llama" ? "llama-small" : "small";
  o.model = preset(o.preset);
  if (o.model.family == Family::Llama) return;
  for (const char* flag :
       {"--kv-heads", "--ffn", "--rope-theta", "--experts", "--top-k", "--capacity-factor", "--router-aux-coef"})
    if (app.count(flag))
      throw CLI::ValidationError(flag, std::string(flag) + " applies to --model llama only (this run trains " +
                                           o.preset + ", a gpt2 model)");
}

// The model: the preset's dimensions, then every model flag given over them; --seq defaults to
// the context, which grows to it. Llama's KV heads and SwiGLU width are recorded resolved.
void resolve_model(const CLI::App& app, const TextValues& text, Options& o) {
  const Options given = o;
  resolve_family(app, text.at("--model"), o);
  for (const OptionSpec& s : option_table())
    if (s.model_override && s.flag != "--model" && s.flag != "--preset" && app.count(s.flag))
      copy_field(s, given, o);
  if (!app.count("--seq")) o.seq = o.model.context;
  if (o.seq > o.model.context) {
    if (app.count("--context"))
      throw CLI::ValidationError("--seq", "--seq " + std::to_string(o.seq) + " exceeds --context " +
                                              std::to_string(o.model.context));
    o.model.context = o.seq;
  }
  if (o.model.hidden % o.model.heads != 0)
    throw CLI::ValidationError("--hidden", "hidden size " + std::to_string(o.model.hidden) +
                                               " is not a multiple of the head count " +
                                               std::to_string(o.model.heads));
  try {
    validate_model(o.model);
  } catch (const std::invalid_argument& e) {
    throw CLI::ValidationError("--model", e.what());
  }
  if (o.model.family == Family::Llama) o.model.kv_heads = o.model.kv(), o.model.ffn = o.model.mlp();
}

// A --tp too large for the model, and also for the ranks of a job of `world_size` processes
// (0: unknown) that has no spares: both problems in one message.
CLI::ValidationError tp_error(const Options& o, std::string why, int world_size) {
  if (world_size > 0 && o.spares_per_host == 0 && o.spare_hosts == 0 && world_size % (o.tp * o.pp) != 0)
    why += " (and this job has " + std::to_string(world_size) + " ranks, which --tp " + std::to_string(o.tp) +
           (o.pp > 1 ? " x --pp " + std::to_string(o.pp) : std::string()) + " does not divide)";
  return CLI::ValidationError("--tp", why);
}

// After parsing: the model from the preset and its overrides, the text options, and the checks
// that span flags. Throws CLI::ValidationError naming the flag.
// Paced timing's machine: a custom rate implies --machine custom (a named machine has its own);
// --time-scale is auto or a factor above 0, 1 by default for custom (its rates are taken as given).
void resolve_machine(const CLI::App& app, Options& o) {
  std::string custom;
  for (const char* f : {"--device-gflops", "--memory-gbps", "--tp-gbps", "--dp-gbps", "--link-latency-us"})
    if (app.count(f) && custom.empty()) custom = f;
  if (!custom.empty()) {
    if (app.count("--machine") && !o.custom_machine())
      throw CLI::ValidationError(custom, custom + " is a rate of --machine custom, but --machine " + o.machine +
                                             " has its own: drop one of them");
    o.machine = "custom";
  }
  if (!app.count("--time-scale") && o.custom_machine()) o.time_scale = 1;
  if (o.emulates_shape() && o.timing != Timing::Paced)
    throw CLI::ValidationError("--emulate-shape", "--emulate-shape charges paced time: it needs --timing paced");
  for (const RecoveryPart& part : recovery_parts())
    if (o.recovery_given.*part.given && o.timing != Timing::Paced)
      throw CLI::ValidationError(part.flag, std::string(part.flag) +
                                                " is charged on the emulated machine's clock: it needs --timing paced");
}

void resolve(const CLI::App& app, const TextValues& text, Options& o, int world_size) {
  resolve_model(app, text, o);
  for (const OptionSpec& s : option_table())
    if (const auto* f = std::get_if<TextField>(&s.field); f && !s.model_override) try {
        f->set(o, text.at(s.flag));
      } catch (const std::invalid_argument& e) {
        throw CLI::ValidationError(s.flag, e.what());
      }
  if (o.tp > o.model.heads)
    throw tp_error(o, "TP degree " + std::to_string(o.tp) + " exceeds the head count " + std::to_string(o.model.heads),
                   world_size);
  if (!tp_degree_problem(o.model, o.tp).empty()) throw tp_error(o, tp_degree_problem(o.model, o.tp), world_size);
  if (o.pp > o.model.layers)
    throw CLI::ValidationError("--pp", "--pp " + std::to_string(o.pp) + " stages for a model of " +
                                           std::to_string(o.model.layers) + " layers: every stage needs a layer");
  if (o.init_weights_only && o.init_from.empty()) throw CLI::ValidationError("--init-weights-only", "needs --init-from");
  if (o.precision != Precision::Fp32 && o.backend != BackendKind::Cuda)
    throw CLI::ValidationError("--precision", "--precision " + choice_name(o.precision) +
                                                  " needs --backend cuda; --backend " + choice_name(o.backend) +
                                                  " computes in fp32 only");
  o.opt.total_steps = o.steps;
  o.pacing.enabled = o.timing == Timing::Paced;
  resolve_machine(app, o);
}

}  // namespace

ParseResult parse_options(int argc, char** argv, bool print, int world_size) {
  CLI::App app{
      "ntpbench: a real GPT-2 or Llama training step (forward, backward, AdamW) under tensor x pipeline x data "
      "parallelism on MPI ranks.\nLaunch with mpirun/srun; DP = ranks / (--tp x --pp). Results go to an HDF5 file (see results/README.md)."};
  app.option_defaults()->always_capture_default();
  Options o;
  TextValues text;
  for (const OptionSpec& s : option_table())
    if (!s.flag.empty()) add_spec(app, s, o, text);
  app.set_config("--config", "", "Read any of these flags from a TOML file (CLI11 syntax: name = value)");
  app.allow_config_extras(false);  // a misspelt key in a config file is an error, not a silent default
  app.footer(exit_codes_help());
  try {
    app.parse(argc, argv);
    resolve(app, text, o, world_size);
  } catch (const CLI::CallForHelp& e) {
    if (print) app.exit(e);
    return {std::nullopt, 0};
  } catch (const CLI::ExtrasError& e) {
    // CLI11 lists what it did not expect; a misspelt flag gets the one it most likely meant.
    if (print) {
      std::string hint;
      for (const std::string& a : app.remaining())
        if (a.rfind("--", 0) == 0)
          if (const std::string f = closest_flag(a.substr(2, a.find('=') - 2)); !f.empty())
            hint += " (" + a + ": did you mean --" + f + "?)";
      std::fprintf(stderr, "%s%s\nRun with --help for more information.\n", e.what(), hint.c_str());
    }
    return {std::nullopt, 2};
  } catch (const CLI::ConfigError& e) {
    if (print) app.exit(CLI::ConfigError(explain_config_error(e.what(), app.get_config_ptr()->results())));
    return {std::nullopt, 2};
  } catch (const CLI::ParseError& e) {
    // A bad value read from a --config file: its file and line before the flag's message.
    const std::string what =
        explain_value_error(e.what(), app.get_config_ptr()->results(), std::vector<std::string>(argv, argv + argc));
    if (print && what != e.what())
      std::fprintf(stderr, "%s\nRun with --help for more information.\n", what.c_str());
    else if (print)
      app.exit(e);
    return {std::nullopt, 2};
  }
  return {o, 0};
}

}  // namespace ntp
