#include "checks.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>

#include "qattn/config.hpp"
#include "qattn/data.hpp"
#include "qattn/hf_model.hpp"
#include "qattn/llmc_model.hpp"

namespace qattn::cli {

CLI::Validator integer_range(int64_t lo, int64_t hi) {
  const std::string allowed = fmt::format("an integer from {} to {}", lo, hi);
  return CLI::Validator(
      [lo, hi, allowed](std::string& text) -> std::string {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
        if (ec != std::errc() || end != text.data() + text.size() || x < lo || x > hi)
          return "'" + text + "' is not allowed; allowed: " + allowed;
        return "";
      },
      fmt::format("INT in [{} - {}]", lo, hi));
}

CLI::Validator number_range(double lo, double hi, bool hi_open) {
  const std::string allowed = fmt::format("a number >= {} and {} {}", lo, hi_open ? "<" : "<=", hi);
  return CLI::Validator(
      [lo, hi, hi_open, allowed](std::string& text) -> std::string {
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        const bool below_hi = hi_open ? x < hi : x <= hi;
        if (text.empty() || *end != '\0' || !std::isfinite(x) || !(x >= lo) || !below_hi)
          return "'" + text + "' is not allowed; allowed: " + allowed;
        return "";
      },
      fmt::format("FLOAT in [{} - {}{}", lo, hi, hi_open ? ")" : "]"));
}

CLI::Validator nonempty_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        return text.empty() ? "'' is not allowed; allowed: a file or directory path (not empty)" : "";
      },
      "PATH");
}

bool is_input_error(const std::exception& e) {
  return dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const DataError*>(&e) ||
         dynamic_cast<const LlmcError*>(&e) || dynamic_cast<const HfError*>(&e);
}

}  // namespace qattn::cli
