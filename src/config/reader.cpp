#include "reader.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace qattn {

using nlohmann::json;

ObjectReader::ObjectReader(const json* in, json& effective, std::string path,
                           std::vector<std::string>& errors)
    : in_(in), eff_(effective), path_(std::move(path)), errors_(errors) {
  if (in_ && !in_->is_object()) {
    errors_.push_back(path_ + ": " + in_->dump() + " has the wrong type; expected an object");
    in_ = nullptr;
  }
  if (!eff_.is_object()) eff_ = json::object();
}

std::string ObjectReader::path_of(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

void ObjectReader::error(const std::string& key, const std::string& msg) {
  errors_.push_back(path_of(key) + ": " + msg);
}

bool ObjectReader::has(const std::string& key) const { return in_ && in_->contains(key); }

const json* ObjectReader::raw(const std::string& key) const {
  return has(key) ? &in_->at(key) : nullptr;
}

const ConfigKey& ObjectReader::spec(const std::string& key, std::initializer_list<KeyType> types) const {
  const ConfigKey* k = find_config_key(path_of(key));
  if (!k || (types.size() && std::find(types.begin(), types.end(), k->type) == types.end()))
    throw std::logic_error("config key table: no entry for " + path_of(key) +
                           " of the type the reader reads it as (src/config/keys.cpp)");
  return *k;
}

namespace {

// A list of allowed values as errors and docs/config.md show it: "a" | "b".
std::string alternatives(const std::vector<json>& values) {
  std::string s;
  for (const json& v : values) s += (s.empty() ? "" : " | ") + v.dump();
  return s;
}

}  // namespace

void ObjectReader::integer(const std::string& key, int64_t& out) {
  const ConfigKey& k = spec(key, {KeyType::integer});
  asked_.insert(key);
  if (const json* v = raw(key)) {
    const bool integral_float = v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                std::abs(v->get<double>()) < 9e15;
    if (!v->is_number_integer() && !integral_float) {
      error(key, v->dump() + " has the wrong type; expected an integer");
    } else if (!k.choices.empty()) {
      const json x = integral_float ? json(static_cast<int64_t>(v->get<double>())) : *v;
      if (std::find(k.choices.begin(), k.choices.end(), x) == k.choices.end())
        error(key, v->dump() + " is not allowed; allowed: " + alternatives(k.choices));
      else
        out = x.get<int64_t>();
    } else {
      const int64_t lo = k.lo.get<int64_t>();
      const int64_t hi = k.hi.is_null() ? std::numeric_limits<int64_t>::max() : k.hi.get<int64_t>();
      // Beyond int64 (a JSON number up to 2^64 - 1) is out of range too, never wrapped.
      const bool too_big = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi);
      const int64_t x = integral_float ? static_cast<int64_t>(v->get<double>()) : too_big ? hi : v->get<int64_t>();
      if (too_big || x < lo || x > hi)
        error(key, v->dump() + " is out of range; allowed: " + std::to_string(lo) + " .. " + std::to_string(hi));
      else
        out = x;
    }
  }
  eff_[key] = out;
}

void ObjectReader::integer(const std::string& key, int& out) {
  const ConfigKey& k = spec(key, {KeyType::integer});
  const auto fits = [](const json& v) { return v.get<int64_t>() <= std::numeric_limits<int>::max(); };
  if (k.choices.empty() ? k.hi.is_null() || !fits(k.hi) : !std::all_of(k.choices.begin(), k.choices.end(), fits))
    throw std::logic_error("config key table: " + path_of(key) + " allows values beyond an int");
  int64_t x = out;
  integer(key, x);
  out = static_cast<int>(x);
}

void ObjectReader::number(const std::string& key, double& out) {
  const ConfigKey& k = spec(key, {KeyType::number});
  asked_.insert(key);
  if (const json* v = raw(key)) {
    if (!v->is_number()) {
      error(key, v->dump() + " has the wrong type; expected a number");
    } else {
      const double x = v->get<double>(), lo = k.lo.get<double>();
      const double hi = k.hi.is_null() ? std::numeric_limits<double>::max() : k.hi.get<double>();
      const bool below = k.lo_open ? !(x > lo) : !(x >= lo);
      if (!std::isfinite(x) || below || x > hi) {
        std::string allowed = (k.lo_open ? "> " : ">= ") + json(lo).dump();
        if (!k.hi.is_null()) allowed += " and <= " + json(hi).dump();
        error(key, v->dump() + " is out of range; allowed: " + allowed);
      } else {
        out = x;
      }
    }
  }
  eff_[key] = out;
}

void ObjectReader::boolean(const std::string& key, bool& out) {
  spec(key, {});  // model.qk_norm, an object, may be a boolean
  asked_.insert(key);
  if (const json* v = raw(key)) {
    if (!v->is_boolean())
      error(key, v->dump() + " has the wrong type; expected true or false");
    else
      out = v->get<bool>();
  }
  eff_[key] = out;
}

void ObjectReader::string(const std::string& key, std::string& out) {
  spec(key, {});  // text, or a choice's string
  asked_.insert(key);
  if (const json* v = raw(key)) {
    if (!v->is_string())
      error(key, v->dump() + " has the wrong type; expected a string");
    else
      out = v->get<std::string>();
  }
  eff_[key] = out;
}

void ObjectReader::choice(const std::string& key, std::string& out) {
  const ConfigKey& k = spec(key, {KeyType::choice});
  std::string s = out;
  string(key, s);
  if (std::find(k.choices.begin(), k.choices.end(), json(s)) == k.choices.end())
    error(key, "\"" + s + "\" is not allowed; allowed: " + alternatives(k.choices));
  else
    out = s;
}

ObjectReader ObjectReader::object(const std::string& key) { return object(key, raw(key)); }

ObjectReader ObjectReader::object(const std::string& key, const json* in) {
  spec(key, {KeyType::object, KeyType::entries});
  asked_.insert(key);
  return ObjectReader(in, eff_[key], path_of(key), errors_);
}

void ObjectReader::known(const std::string& key) {
  spec(key, {});
  asked_.insert(key);
}

void ObjectReader::finish() {
  if (!in_) return;
  std::string allowed;
  for (const auto& k : asked_) allowed += (allowed.empty() ? "" : ", ") + k;
  for (const auto& [k, v] : in_->items())
    if (!asked_.count(k)) error(k, "unknown key; allowed keys here: " + allowed);
}

}  // namespace qattn
