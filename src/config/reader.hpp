// A JSON object reader that validates as it reads: every key is checked for
// type and range, the value read (or its default) is copied into the effective
// config, and keys nobody asked for are reported as unknown. Ranges and choices
// come from the config key table (config_keys.hpp), where every key read must
// be. Errors read "json.path: what is wrong (value); allowed: what is allowed".
#pragma once
#include <nlohmann/json.hpp>
#include <algorithm>
#include <initializer_list>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "qattn/config_keys.hpp"
#include "qattn/value_names.hpp"

namespace qattn {

class ObjectReader {
 public:
  // `in` may be null (section absent: every key takes its default).
  ObjectReader(const nlohmann::json* in, nlohmann::json& effective, std::string path,
               std::vector<std::string>& errors);

  bool has(const std::string& key) const;
  void integer(const std::string& key, int64_t& out);
  void integer(const std::string& key, int& out);
  void number(const std::string& key, double& out);
  void boolean(const std::string& key, bool& out);
  void string(const std::string& key, std::string& out);
  // A string that must be one of the key's choices.
  void choice(const std::string& key, std::string& out);
  // The same, mapped onto an enum value by its names.
  template <typename E, std::size_t N>
  void choice(const std::string& key, E& out, const ValueName<E> (&names)[N]);
  // A nested object; returns a reader for it (absent -> all defaults).
  ObjectReader object(const std::string& key);
  // The same, reading `in` in place of the key's value: a shorthand the caller
  // has expanded to its object (in must outlive the reader).
  ObjectReader object(const std::string& key, const nlohmann::json* in);
  // Marks a key read by other means as known (when absent, the effective
  // config gets nothing for it).
  void known(const std::string& key);
  // Reports every key of the input that no accessor asked for.
  void finish();

  std::string path_of(const std::string& key) const;
  // The key's table entry, of one of these types (none given: any type); a key
  // the table lacks is a bug of the reader or the table (std::logic_error).
  const ConfigKey& spec(const std::string& key, std::initializer_list<KeyType> types) const;
  void error(const std::string& key, const std::string& msg);
  const nlohmann::json* raw(const std::string& key) const;

 private:
  const nlohmann::json* in_;
  nlohmann::json& eff_;
  std::string path_;
  std::vector<std::string>& errors_;
  std::set<std::string> asked_;
};

template <typename E, std::size_t N>
void ObjectReader::choice(const std::string& key, E& out, const ValueName<E> (&names)[N]) {
  std::string s = name_of(names, out);
  choice(key, s);
  const std::vector<nlohmann::json>& allowed = spec(key, {KeyType::choice}).choices;
  if (std::find(allowed.begin(), allowed.end(), s) == allowed.end()) return;  // reported by choice()
  for (const ValueName<E>& n : names)
    if (s == n.name) {
      out = n.value;
      return;
    }
  throw std::logic_error("config key table: " + path_of(key) + " allows \"" + s + "\", which names no value");
}

}  // namespace qattn
