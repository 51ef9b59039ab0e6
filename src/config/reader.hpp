// A JSON object reader that validates as it reads: every key is checked for
// type and range, the value read (or its default) is copied into the effective
// config, and keys nobody asked for are reported as unknown. Errors read
// "json.path: what is wrong (value); allowed: what is allowed".
#pragma once
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace qattn {

class ObjectReader {
 public:
  // `in` may be null (section absent: every key takes its default).
  ObjectReader(const nlohmann::json* in, nlohmann::json& effective, std::string path,
               std::vector<std::string>& errors);

  bool has(const std::string& key) const;
  void integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi);
  void integer(const std::string& key, int& out, int64_t lo, int64_t hi);
  void number(const std::string& key, double& out, double lo, double hi, bool lo_open = false);
  void boolean(const std::string& key, bool& out);
  void string(const std::string& key, std::string& out);
  // A string that must be one of `allowed`, mapped onto an enum value.
  template <typename E>
  void choice(const std::string& key, E& out, const std::vector<std::pair<std::string, E>>& allowed);
  // A nested object; returns a reader for it (absent -> all defaults).
  ObjectReader object(const std::string& key);
  // The same, reading `in` in place of the key's value: a shorthand the caller
  // has expanded to its object (in must outlive the reader).
  ObjectReader object(const std::string& key, const nlohmann::json* in);
  // Marks a key read by other means as known (when absent, the effective
  // config gets nothing for it).
  void known(const std::string& key) { asked_.insert(key); }
  // Reports every key of the input that no accessor asked for.
  void finish();

  std::string path_of(const std::string& key) const;
  void error(const std::string& key, const std::string& msg);
  const nlohmann::json* raw(const std::string& key) const;

 private:
  const nlohmann::json* in_;
  nlohmann::json& eff_;
  std::string path_;
  std::vector<std::string>& errors_;
  std::set<std::string> asked_;
};

template <typename E>
void ObjectReader::choice(const std::string& key, E& out,
                          const std::vector<std::pair<std::string, E>>& allowed) {
  std::string names, current;
  for (const auto& [name, value] : allowed) {
    names += (names.empty() ? "" : " | ") + ("\"" + name + "\"");
    if (value == out) current = name;
  }
  std::string s = current;
  string(key, s);
  for (const auto& [name, value] : allowed)
    if (name == s) {
      out = value;
      return;
    }
  error(key, "\"" + s + "\" is not allowed; allowed: " + names);
}

}  // namespace qattn
