// What the subcommands share about bad input: the ranges of numeric options
// (finite, with bounds a person can read) and which errors are the user's
// input, answered with exit code 2.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <exception>
#include <string>

namespace qattn::cli {

// Exit code of every subcommand for bad arguments, a bad config or bad data
// that it names (also CLI11's parse errors: main maps them onto it).
constexpr int kExitBadInput = 2;
// --nproc: processes (GPUs) on one node.
constexpr int64_t kMaxProcesses = 64;

// An integer option within [lo, hi]; anything else (a fraction, a word, a
// number out of range) is refused with "VALUE is not allowed; allowed: an
// integer from LO to HI".
CLI::Validator integer_range(int64_t lo, int64_t hi);
// A finite number within [lo, hi] ([lo, hi) with hi_open); nan, inf and words
// are refused with the range in the message.
CLI::Validator number_range(double lo, double hi, bool hi_open = false);

// A file or directory path: the empty string, which names none (and would
// reach the OS as "" with a message that names nothing), is refused.
CLI::Validator nonempty_path();

// True for the errors about what the user gave: a config (ConfigError), the
// data it names (DataError) or its model.init_from (LlmcError, HfError).
bool is_input_error(const std::exception& e);

}  // namespace qattn::cli
