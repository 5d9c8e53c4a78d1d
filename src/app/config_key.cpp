#include "config_key.hpp"

#include <algorithm>
#include <cctype>
#include <fstream>

#include "option_table.hpp"

namespace ntp {

namespace {

// Edit distance: insertions, deletions, substitutions and swaps of two neighbours ("stesp" is one
// edit from "steps"), each counting 1 (optimal string alignment).
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string trim(const std::string& s, const char* chars = " \t\r") {
  const auto begin = s.find_first_not_of(chars);
  if (begin == std::string::npos) return {};
  return s.substr(begin, s.find_last_not_of(chars) - begin + 1);
}

// "FILE:LINE" of the first line of `files` that sets `key` ("section.name" inside [section]) or
// opens it ("[section]"), or `otherwise` when no line does (the first file, when not given).
std::string where(const std::vector<std::string>& files, const std::string& key,
                  const std::string* otherwise = nullptr) {
  for (const std::string& file : files) {
    std::ifstream in(file);
    std::string line, section;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string text = trim(line);
      if (text.size() > 1 && text.front() == '[' && text.back() == ']') {
        if (text == key) return file + ":" + std::to_string(n);
        section = trim(text.substr(1, text.size() - 2), " \t[]") + ".";
        continue;
      }
      const auto eq = text.find('=');
      if (eq == std::string::npos) continue;
      const std::string name = trim(trim(text.substr(0, eq)), "\"'");
      if (name == key || section + name == key) return file + ":" + std::to_string(n);
    }
  }
  if (otherwise) return *otherwise;
  return files.empty() ? std::string("--config") : files.front();
}

}  // namespace

std::string explain_value_error(const std::string& what, const std::vector<std::string>& files,
                                const std::vector<std::string>& args) {
  if (what.rfind("--", 0) != 0 || files.empty()) return what;
  const std::string flag = what.substr(0, what.find_first_of(": "));
  for (const std::string& a : args)
    if (a == flag || a.rfind(flag + "=", 0) == 0) return what;  // given on the command line
  const std::string none;
  const std::string line = where(files, flag.substr(2), &none);
  return line.empty() ? what : line + ": " + what;
}

std::string closest_flag(const std::string& name) {
  std::string wanted = name;
  for (char& c : wanted) c = c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string best;
  std::size_t best_distance = 3;  // more than two edits away is no suggestion
  for (const OptionSpec& s : option_table()) {
    if (s.flag.size() < 3) continue;
    const std::string flag = s.flag.substr(2);
    const std::size_t d = edit_distance(wanted, flag);
    // Within half the flag's length, and one edit always counts (`tpp` for `tp`).
    if (d < best_distance && d < std::max<std::size_t>(flag.size() / 2, 2)) best = flag, best_distance = d;
  }
  return best;
}

std::string explain_config_error(const std::string& what, const std::vector<std::string>& files) {
  static const std::string unknown = "INI was not able to parse ";
  if (what.rfind(unknown, 0) != 0) return what;
  const std::string key = what.substr(unknown.size());
  // CLI11 marks where a [section] opens ("model.++") and closes ("model.--"): no flag has a section.
  if (key.size() > 3 && (key.compare(key.size() - 3, 3, ".++") == 0 || key.compare(key.size() - 3, 3, ".--") == 0)) {
    const std::string section = key.substr(0, key.size() - 3);
    return where(files, "[" + section + "]") + ": unknown section [" + section +
           "] (flags are top-level keys: name = value, the flag without its --)";
  }
  const std::string flag = closest_flag(key);
  return where(files, key) + ": unknown key '" + key + "'" +
         (flag.empty() ? std::string(" (no flag of that name: ntpbench --help lists them)")
                       : " (did you mean '" + flag + "'?)");
}

}  // namespace ntp
