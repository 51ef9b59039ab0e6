// Every key a run config takes: its JSON path, the kind of value and what is
// allowed. The config reader (src/config/config.cpp) takes each key's range and
// choices from this table, and reading a key the table lacks is a bug it
// reports (std::logic_error) on the first config it reads; the docs test
// (tests/unit/test_config.cpp, [docs]) checks docs/config.md against the same
// table, so neither the validation nor the page can drift from it. Defaults are
// not here: they are the member initialisers of the config structs, and the
// effective config shows them.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace qattn {

enum class KeyType {
  integer,  // lo .. hi (hi null: no upper bound), or one of choices when it has them
  number,   // lo .. hi, > lo when lo_open (hi null: no upper bound)
  boolean,
  text,     // any string: a path, a glob, a name
  choice,   // one of choices (strings)
  object,   // an object of further keys
  entries,  // an object whose keys the user names, each value an object of keys_of's keys
};

// Every member has an initialiser, so that an entry names only the members it sets.
struct ConfigKey {
  std::string path = "";  // "train.lr"
  KeyType type = KeyType::object;
  nlohmann::json lo = nullptr, hi = nullptr;  // integer, number
  bool lo_open = false;                       // number
  std::vector<nlohmann::json> choices = {};
  // object: a further table path whose keys this object takes too (attention.sage.softmax
  // takes attention.kinterval's); entries: the keys of each entry's object.
  std::string keys_of = "";
  // A default that is no constant, as docs/config.md states it: "required", or how the
  // reader finds it ("log₂(T² − T), T = model.seq_len").
  std::string default_doc = "";
};

// The table, parents before their keys.
const std::vector<ConfigKey>& config_keys();

// The table's entry of a JSON path in a config: the path itself, or through an
// attention.layers entry or attention.sage.softmax the key whose keys it takes
// ("attention.layers.0-3.sage.softmax.K" is attention.kinterval.K). Null when a
// config has no such key.
const ConfigKey* find_config_key(const std::string& path);

}  // namespace qattn
