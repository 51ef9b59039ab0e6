#include "qattn/json_file.hpp"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

namespace qattn {

using nlohmann::json;

namespace {

// Follows the parser through the document: the JSON path of the value being
// read, and the keys seen in every open object.
class PathTracker {
 public:
  bool on_event(json::parse_event_t event, const json& parsed) {
    using E = json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        open_.push_back({event == E::object_start, position(), "", 0, {}});
        break;
      case E::key: {
        Open& o = open_.back();
        o.key = parsed.get<std::string>();
        if (!o.keys.insert(o.key).second)
          throw JsonError(position() + ": given twice in one object; allowed: each key once (the JSON "
                                       "library would keep the last one silently)");
        break;
      }
      case E::value:
        element_done();
        break;
      case E::object_end:
      case E::array_end:
        open_.pop_back();
        element_done();
        break;
    }
    return true;
  }

  // "train.lr", "zip[0].train.lr"; "" at the top level.
  std::string position() const {
    if (open_.empty()) return "";
    const Open& o = open_.back();
    if (!o.object) return o.path + "[" + std::to_string(o.index) + "]";
    return o.path.empty() ? o.key : o.path + "." + o.key;
  }

 private:
  struct Open {
    bool object;
    std::string path, key;  // key: the member being read
    int64_t index;          // arrays: the element being read
    std::set<std::string> keys;
  };
  void element_done() {
    if (!open_.empty() && !open_.back().object) ++open_.back().index;
  }
  std::vector<Open> open_;
};

}  // namespace

std::string json_error_text(const json::exception& e) {
  const std::string what = e.what();
  if (what.rfind("[json.exception.", 0) == 0)
    if (const size_t end = what.find("] "); end != std::string::npos) return what.substr(end + 2);
  return what;
}

json parse_json(std::string_view text) {
  PathTracker tracker;
  try {
    return json::parse(
        text.begin(), text.end(),
        [&tracker](int, json::parse_event_t event, json& parsed) { return tracker.on_event(event, parsed); },
        /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::out_of_range& e) {
    // The one range error of the parser: a number beyond double's range (1e400).
    std::string number = json_error_text(e);
    if (const size_t q = number.find('\''); q != std::string::npos)
      number = number.substr(q + 1, number.rfind('\'') - q - 1);
    const std::string where = tracker.position();
    throw JsonError((where.empty() ? "" : where + ": ") + number +
                    " is out of range for a number; allowed: finite numbers, |x| < 1.8e308");
  } catch (const json::exception& e) {
    const std::string where = tracker.position();
    throw JsonError("not valid JSON: " + json_error_text(e) + (where.empty() ? "" : " (near " + where + ")"));
  }
}

json read_json_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw JsonError(path + ": is a directory; allowed: a " + what + " (JSON)");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw JsonError(path + ": cannot open " + what + ": " + std::strerror(errno));
  std::ostringstream text;
  text << f.rdbuf();
  if (f.bad()) throw JsonError(path + ": cannot read " + what + ": " + std::strerror(errno));
  try {
    return parse_json(text.str());
  } catch (const JsonError& e) {
    throw JsonError(path + ": " + e.what());
  }
}

}  // namespace qattn
