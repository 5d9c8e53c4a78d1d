#include "options.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "option_table.hpp"

namespace ntp {

nlohmann::json to_json(const Options& o) {
  nlohmann::json j = nlohmann::json::object();
  for (const OptionSpec& s : option_table())
    if (!s.key.empty()) j[nlohmann::json::json_pointer("/" + s.key)] = field_value(s, o);
  return j;
}

Options options_from_json(const nlohmann::json& j) {
  Options o;
  for (const OptionSpec& s : option_table()) {
    if (s.key.empty()) continue;
    const nlohmann::json::json_pointer at("/" + s.key);
    if (j.contains(at))
      set_field_value(s, o, j.at(at));
    else if (s.missing == Missing::Legacy)
      set_field_value(s, o, s.legacy);
    else if (s.missing == Missing::Required)
      throw std::invalid_argument("the recorded configuration has no '" + s.key + "'");
    // Missing::Default: o already holds today's default.
  }
  o.pacing.enabled = o.timing == "paced";
  return o;
}

std::string checkpoint_dir_for(const Options& o) {
  if (!o.checkpoint_dir.empty()) return o.checkpoint_dir;
  std::filesystem::path p(o.out);
  return (p.parent_path() / (p.stem().string() + ".ckpt")).string();
}

}  // namespace ntp
