// The names of an enum's values as configs, logs and file names spell them.
// One array per enum holds them (attention.hpp, qk_norm.hpp, config.hpp):
// to_string reads it, the config reader maps names to values with it, and the
// config key table (config_keys.hpp) lists it as the allowed values, so the
// three cannot disagree. Light on purpose: the CUDA kernels include qk_norm.hpp.
#pragma once
#include <cstddef>

namespace qattn {

template <typename E>
struct ValueName {
  const char* name;
  E value;
};

// The name of v in names ("?" for a value the array does not list).
template <typename E, std::size_t N>
constexpr const char* name_of(const ValueName<E> (&names)[N], E v) {
  for (const ValueName<E>& n : names)
    if (n.value == v) return n.name;
  return "?";
}

}  // namespace qattn
