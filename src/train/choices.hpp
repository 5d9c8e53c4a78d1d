#pragma once
// The options whose value is one of a few names (--policy, --kill-mode, --spare-use,
// --straggler-policy, --timing, --on-nonfinite, --backend, --precision, --emulated-precision): an enum each, parsed once from the text the
// option table reads (command line, --config TOML, the JSON record), so the code compares enums
// and each name is written once, here.
#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "backend.hpp"        // BackendKind, Precision
#include "configuration.hpp"  // Policy
#include "machine_profile.hpp"  // EmulatedPrecision

namespace ntp {

// How a scheduled kill kills (options.hpp): the process dies (SIGKILL, ULFM repair) or leaves the
// communicators and idles.
enum class KillMode { Signal, Fence };
enum class SpareUse { Revive, Takeover };
enum class StragglerPolicy { Tolerate, Evict, Rebalance };
enum class Timing { Wall, Paced };
enum class OnNonfinite { Stop, Skip };

// Each enum's names, in the order of its values.
template <typename E>
inline constexpr std::array<std::string_view, 0> kNames{};
template <> inline constexpr std::array<std::string_view, 4> kNames<Policy>{"dp-drop", "ntp", "ntp-pw", "restart"};
template <> inline constexpr std::array<std::string_view, 2> kNames<KillMode>{"signal", "fence"};
template <> inline constexpr std::array<std::string_view, 2> kNames<SpareUse>{"revive", "takeover"};
template <> inline constexpr std::array<std::string_view, 3> kNames<StragglerPolicy>{"tolerate", "evict", "rebalance"};
template <> inline constexpr std::array<std::string_view, 2> kNames<Timing>{"wall", "paced"};
template <> inline constexpr std::array<std::string_view, 2> kNames<BackendKind>{"cpu", "cuda"};
template <> inline constexpr std::array<std::string_view, 2> kNames<Precision>{"fp32", "bf16"};
template <> inline constexpr std::array<std::string_view, 2> kNames<OnNonfinite>{"stop", "skip"};
template <> inline constexpr std::array<std::string_view, 3> kNames<EmulatedPrecision>{"bf16", "tf32", "fp32"};
// True for the enums above: those with names.
template <typename E>
inline constexpr bool is_choice = std::is_enum_v<E> && !kNames<E>.empty();

template <typename E>
std::string choice_name(E e) {
  return std::string(kNames<E>.at(static_cast<std::size_t>(e)));
}

template <typename E>
std::vector<std::string> choice_names() {
  return {kNames<E>.begin(), kNames<E>.end()};
}

// The value named `text`; std::invalid_argument naming the choices otherwise.
template <typename E>
E parse_choice(std::string_view text) {
  for (std::size_t i = 0; i < kNames<E>.size(); ++i)
    if (kNames<E>[i] == text) return static_cast<E>(i);
  std::string known;
  for (std::string_view n : kNames<E>) known += (known.empty() ? "" : ", ") + std::string(n);
  throw std::invalid_argument("unknown value '" + std::string(text) + "' (" + known + ")");
}

}  // namespace ntp

// fmt prints a choice as its name ("policy {}" -> "policy ntp").
template <typename E>
struct fmt::formatter<E, char, std::enable_if_t<ntp::is_choice<E>>> : fmt::formatter<std::string_view> {
  auto format(E e, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(ntp::kNames<E>.at(static_cast<std::size_t>(e)), ctx);
  }
};
