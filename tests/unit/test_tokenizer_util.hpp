// Helpers shared by the tokenizer tests: scratch directories, files, and the
// GPT-2 vocab that data/prepare.sh gpt2-vocab leaves in data/cache/gpt2.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <cstdlib>
#include <string>
#include <vector>

namespace qattn::test {

namespace fs = std::filesystem;

// A fresh, empty directory under the system temp dir, unique to this process.
inline fs::path tokenizer_temp_dir(const std::string& name) {
  const fs::path d =
      fs::temp_directory_path() / ("qattn_tok_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

inline void write_file(const fs::path& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

inline std::string read_file(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

inline fs::path gpt2_vocab_dir() { return fs::path(QATTN_SOURCE_DIR) / "data/cache/gpt2"; }

inline bool have_gpt2_vocab() {
  return fs::exists(gpt2_vocab_dir() / "encoder.json") && fs::exists(gpt2_vocab_dir() / "vocab.bpe");
}

}  // namespace qattn::test

namespace qattn::test {

// Runs `qattn tokenize` then `qattn detokenize` on files, through the shell as
// a user would; returns the decoded text of all shards (val first).
inline std::string cli_round_trip(const std::string& tokenizer, const std::vector<fs::path>& files,
                                  const fs::path& dir) {
  std::string command = std::string("'") + QATTN_BINARY + "' tokenize --tokenizer " + tokenizer +
                        " --vocab '" + gpt2_vocab_dir().string() + "' --val-docs 1 --out '" +
                        (dir / "cli").string() + "'";
  for (const auto& f : files) command += " '" + f.string() + "'";
  if (std::system((command + " > /dev/null 2>&1").c_str()) != 0) return "tokenize failed: " + command;
  command = std::string("'") + QATTN_BINARY + "' detokenize --tokenizer " + tokenizer +
            " --vocab '" + gpt2_vocab_dir().string() + "' --out '" + (dir / "decoded.txt").string() +
            "' '" + (dir / "cli/cli_val_000000.bin").string() + "' '" +
            (dir / "cli/cli_train_000001.bin").string() + "'";
  if (std::system(command.c_str()) != 0) return "detokenize failed: " + command;
  return read_file(dir / "decoded.txt");
}

}  // namespace qattn::test
