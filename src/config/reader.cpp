#include "reader.hpp"

#include <cmath>
#include <limits>

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

void ObjectReader::integer(const std::string& key, int64_t& out, int64_t lo, int64_t hi) {
  asked_.insert(key);
  if (const json* v = raw(key)) {
    const bool integral_float = v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
                                std::abs(v->get<double>()) < 9e15;
    if (!v->is_number_integer() && !integral_float) {
      error(key, v->dump() + " has the wrong type; expected an integer");
    } else {
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

void ObjectReader::integer(const std::string& key, int& out, int64_t lo, int64_t hi) {
  int64_t x = out;
  integer(key, x, lo, hi);
  out = static_cast<int>(x);
}

void ObjectReader::number(const std::string& key, double& out, double lo, double hi, bool lo_open) {
  asked_.insert(key);
  if (const json* v = raw(key)) {
    if (!v->is_number()) {
      error(key, v->dump() + " has the wrong type; expected a number");
    } else {
      const double x = v->get<double>();
      const bool below = lo_open ? !(x > lo) : !(x >= lo);
      if (!std::isfinite(x) || below || x > hi) {
        std::string allowed = (lo_open ? "> " : ">= ") + json(lo).dump();
        if (hi < std::numeric_limits<double>::max()) allowed += " and <= " + json(hi).dump();
        error(key, v->dump() + " is out of range; allowed: " + allowed);
      } else {
        out = x;
      }
    }
  }
  eff_[key] = out;
}

void ObjectReader::boolean(const std::string& key, bool& out) {
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
  asked_.insert(key);
  if (const json* v = raw(key)) {
    if (!v->is_string())
      error(key, v->dump() + " has the wrong type; expected a string");
    else
      out = v->get<std::string>();
  }
  eff_[key] = out;
}

ObjectReader ObjectReader::object(const std::string& key) { return object(key, raw(key)); }

ObjectReader ObjectReader::object(const std::string& key, const json* in) {
  asked_.insert(key);
  return ObjectReader(in, eff_[key], path_of(key), errors_);
}

void ObjectReader::finish() {
  if (!in_) return;
  std::string allowed;
  for (const auto& k : asked_) allowed += (allowed.empty() ? "" : ", ") + k;
  for (const auto& [k, v] : in_->items())
    if (!asked_.count(k)) error(k, "unknown key; allowed keys here: " + allowed);
}

}  // namespace qattn
