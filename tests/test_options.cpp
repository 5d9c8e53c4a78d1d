// The option table (src/train/option_table.cpp) against the struct it describes, the command line
// derived from it and the JSON record derived from it: every option set to a value other than its
// default through the CLI reaches its field and survives the round trip through the JSON a results
// file, a replacement process and --replay read; every member of Options has its row.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.hpp"
#include "option_table.hpp"

namespace ntp {
namespace {

// How many members an aggregate has: the longest brace list of "anything" it accepts.
struct AnyMember {
  template <typename T>
  operator T() const;
};
template <typename T, typename... A>
consteval std::size_t member_count() {
  if constexpr (requires { T{A{}..., AnyMember{}}; })
    return member_count<T, A..., AnyMember>();
  else
    return sizeof...(A);
}

// A file that exists, for the flags that check for one.
std::string existing_file() {
  static const std::string path = [] {
    auto p = std::filesystem::temp_directory_path() / "ntpbench_test_options.txt";
    std::ofstream(p) << "x";
    return p.string();
  }();
  return path;
}

// A value other than the default for every flag ("" for a switch), consistent across flags (a
// Llama model whose dimensions the checks that span flags accept).
std::map<std::string, std::string> non_default_values() {
  const std::string file = existing_file();
  return {
      {"--model", "llama"}, {"--preset", "llama-tiny"}, {"--kv-heads", "2"}, {"--ffn", "96"},
      {"--rope-theta", "5000"}, {"--experts", "3"}, {"--top-k", "1"}, {"--capacity-factor", "1.5"},
      {"--router-aux-coef", "0.02"}, {"--layers", "3"}, {"--heads", "4"}, {"--hidden", "48"}, {"--seq", "24"},
      {"--context", "40"}, {"--vocab", "300"}, {"--tp", "2"}, {"--pp", "3"}, {"--micro-batch", "3"},
      {"--micro-batches", "2"}, {"--steps", "7"}, {"--seed", "99"}, {"--data", "tokens.bin"}, {"--lr", "0.001"},
      {"--beta1", "0.8"}, {"--beta2", "0.9"}, {"--eps", "1e-6"}, {"--weight-decay", "0.05"}, {"--clip", "0.5"},
      {"--warmup", "2"}, {"--lr-schedule", "cosine"}, {"--min-lr-ratio", "0.2"}, {"--out", "run.h5"},
      {"--overwrite", ""}, {"--checkpoint-every", "3"}, {"--checkpoint-dir", "ckpt"},
      {"--no-final-checkpoint", ""}, {"--init-from", file}, {"--init-weights-only", ""}, {"--replay", file},
      {"--replay-tol", "1e-4"}, {"--quiet", ""}, {"--check", ""}, {"--threads", "3"}, {"--peak-gflops", "12.5"},
      {"--backend", "cuda"}, {"--precision", "bf16"}, {"--allow-gpu-sharing", ""}, {"--schedule", file},
      {"--policy", "restart"}, {"--spares-per-host", "1"}, {"--spare-hosts", "1"}, {"--spare-use", "takeover"}, {"--kill-mode", "signal"}, {"--hang-timeout", "30"}, {"--failure-timeout", "4"}, {"--straggler-threshold", "1.5"}, {"--straggler-window", "3"}, {"--straggler-policy", "rebalance"}, {"--on-nonfinite", "skip"},
      {"--timing", "paced"}, {"--device-gflops", "20"}, {"--memory-gbps", "9"}, {"--tp-gbps", "30"}, {"--dp-gbps", "6"},
      {"--link-latency-us", "7"}, {"--boost", "1.2"}, {"--machine", "custom"}, {"--time-scale", "4"},
      {"--headroom", "3"}, {"--emulated-precision", "tf32"}, {"--emulate-shape", "gpt2"},
      {"--detect-s", "1.5"}, {"--repair-s", "3"}, {"--reinit-s", "12"}, {"--reconfigure-s", "0.25"},
      {"--replace-s", "45"}, {"--takeover-s", "0"}, {"--restart-s", "600"}, {"--checkpoint-gbps", "0.75"},
  };
}

Options parse(const std::map<std::string, std::string>& flags) {
  std::vector<std::string> args = {"ntpbench"};
  for (const auto& [flag, value] : flags) {
    args.push_back(flag);
    if (!value.empty()) args.push_back(value);
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ParseResult r = parse_options(static_cast<int>(argv.size()), argv.data(), true);
  if (!r.options) throw std::runtime_error("the command line was refused");
  return *r.options;
}

TEST(Options, EveryMemberOfOptionsHasARowInTheTable) {
  // (Each recovery figure's row is a TextField: "machine" or a number.)
  // Members whose value is derived from others, not set on their own: pacing.enabled (--timing),
  // pacing.time_scale and pacing.shape (paced_rates: --time-scale, --emulate-shape).
  constexpr std::size_t derived = 3;
  constexpr std::size_t members = member_count<Options>() - 4 /* model, opt, pacing, recovery_given: inside */ +
                                  member_count<ModelConfig>() + member_count<OptimizerConfig>() +
                                  member_count<PacingConfig>() + member_count<RecoveryOverrides>();
  std::set<const void*> fields;
  std::size_t text_rows = 0;
  Options o;
  for (const OptionSpec& s : option_table()) {
    if (std::holds_alternative<TextField>(s.field))
      ++text_rows;  // each stands for one member (the family, the lr schedule)
    else
      std::visit([&](auto f) { if constexpr (!std::is_same_v<decltype(f), TextField>) fields.insert(&f(o)); },
                 s.field);
  }
  EXPECT_EQ(fields.size() + text_rows + derived, members)
      << "Options (with its ModelConfig, OptimizerConfig and PacingConfig) has " << members
      << " members, the option table declares " << fields.size() + text_rows
      << ": declare every member in src/train/option_table.cpp";
  const auto& table = option_table();
  std::set<std::string> flags, keys;
  for (const OptionSpec& s : table) {
    if (!s.flag.empty()) {
      EXPECT_TRUE(flags.insert(s.flag).second) << "two rows declare " << s.flag;
    }
    if (!s.key.empty()) {
      EXPECT_TRUE(keys.insert(s.key).second) << "two rows record " << s.key;
    }
  }
}

TEST(Options, EveryFlagHasANonDefaultValueInThisTest) {
  const auto values = non_default_values();
  for (const OptionSpec& s : option_table())
    if (!s.flag.empty()) {
      EXPECT_TRUE(values.count(s.flag)) << s.flag << " has no value in non_default_values()";
    }
  for (const auto& [flag, value] : values) EXPECT_NO_THROW(option_spec(flag)) << flag << " is not in the table";
}

TEST(Options, EveryFlagReachesItsFieldAndSurvivesTheJsonRecord) {
  const Options o = parse(non_default_values());
  const Options defaults;
  // --machine: its other value (a named machine) refuses custom's rates, which the line above sets.
  const std::map<std::string, std::string> apart = {{"--machine", "dgx-h100"}};
  for (const OptionSpec& s : option_table()) {
    if (apart.count(s.flag)) continue;
    EXPECT_NE(field_value(s, o), field_value(s, defaults))
        << (s.flag.empty() ? s.key : s.flag) << " did not change its field from the default";
  }
  for (const auto& [flag, value] : apart) {
    const Options one = parse({{flag, value}});
    const OptionSpec& s = option_spec(flag);
    EXPECT_EQ(field_value(s, one), value) << flag;
    EXPECT_EQ(field_value(s, options_from_json(nlohmann::json::parse(to_json(one).dump()))), value) << flag;
  }
  // What is recorded comes back as it was; what concerns one invocation only is not recorded (a
  // new option is recorded unless it joins this list) and comes back as the default.
  const std::set<std::string> one_invocation = {"--overwrite", "--replay", "--replay-tol", "--quiet", "--check"};
  for (const OptionSpec& s : option_table())
    EXPECT_EQ(s.key.empty(), one_invocation.count(s.flag) == 1)
        << s.flag << (s.key.empty() ? " is not recorded in the JSON" : " is recorded, yet concerns one invocation");
  Options expected = o;
  for (const OptionSpec& s : option_table())
    if (s.key.empty()) copy_field(s, defaults, expected);
  const Options back = options_from_json(nlohmann::json::parse(to_json(o).dump()));
  EXPECT_TRUE(back == expected) << "recorded:     " << to_json(expected).dump() << "\nread back as: " << to_json(back).dump();
  for (const OptionSpec& s : option_table())
    EXPECT_EQ(field_value(s, back), field_value(s, expected)) << (s.flag.empty() ? s.key : s.flag);
}

TEST(Options, AKeyMissingFromARecordIsRequiredOrTakesItsDocumentedValue) {
  const Options o = parse(non_default_values());
  const Options defaults;
  for (const OptionSpec& s : option_table()) {
    if (s.key.empty()) continue;
    nlohmann::json j = to_json(o);
    const nlohmann::json::json_pointer at("/" + s.key);
    j.at(at.parent_pointer()).erase(at.back());
    if (s.missing == Missing::Required) {
      EXPECT_THROW(options_from_json(j), std::invalid_argument) << s.key;
      continue;
    }
    const Options back = options_from_json(j);
    const nlohmann::json want = s.missing == Missing::Legacy ? s.legacy : field_value(s, defaults);
    EXPECT_EQ(field_value(s, back), want) << s.key;
  }
}

// A record written before pipeline parallelism, Llama, real kills, paced timing, backends and
// --precision (schema 1's first files) still loads, with the values those runs had.
TEST(Options, ARecordFromTheFirstFilesStillLoads) {
  const auto j = nlohmann::json::parse(R"({
    "preset": "tiny", "model": {"vocab": 256, "context": 32, "layers": 2, "heads": 4, "hidden": 64},
    "seq": 32, "tp": 2, "micro_batch": 4, "steps": 5, "seed": 7, "data": "synthetic",
    "optimizer": {"lr": 0.0003, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0,
                  "warmup": 0, "schedule": "constant", "min_lr_ratio": 0.1, "total_steps": 5},
    "out": "r.h5", "checkpoint_every": 0, "checkpoint_dir": "", "final_checkpoint": true, "init_from": "",
    "init_weights_only": false, "threads": 1, "peak_gflops": 0.0})");
  const Options o = options_from_json(j);
  EXPECT_EQ(o.model.family, Family::Gpt2);
  EXPECT_EQ(o.pp, 1);
  EXPECT_EQ(o.micro_batches, 1);
  EXPECT_EQ(o.kill_mode, KillMode::Fence);
  EXPECT_EQ(o.policy, Policy::Ntp);
  EXPECT_EQ(o.timing, Timing::Wall);
  EXPECT_FALSE(o.pacing.enabled);
  EXPECT_EQ(o.backend, BackendKind::Cpu);
  EXPECT_EQ(o.precision, Precision::Fp32);
  EXPECT_EQ(o.tp, 2);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.opt.total_steps, 5);
}

}  // namespace
}  // namespace ntp
