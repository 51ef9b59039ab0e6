// JSON as people write it: comments allowed, a key given twice in one object
// refused (the library would keep the last one silently), and errors in words
// that name the file and the JSON path instead of the library's error codes.
#pragma once
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

namespace qattn {

struct JsonError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses text; throws JsonError saying what is wrong and, where known, at
// which JSON path ("train.lr: 1e400 is out of range ...", "model: key
// \"layers\" given twice ...").
nlohmann::json parse_json(std::string_view text);

// Reads and parses a file; throws JsonError beginning with the path (a
// directory, a file that cannot be read with the OS's reason, bad JSON).
// `what` names the kind of file in the messages ("config file").
nlohmann::json read_json_file(const std::string& path, const std::string& what);

// A json exception's message without the library's "[json.exception.KIND.ID] " prefix.
std::string json_error_text(const nlohmann::json::exception& e);

}  // namespace qattn
