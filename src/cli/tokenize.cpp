// qattn tokenize: text files -> llm.c shards; qattn detokenize: shards or ids -> text.
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/atomic_file.hpp"
#include "qattn/data.hpp"
#include "qattn/tokenizer.hpp"

namespace qattn::cli {

namespace {

void add_tokenizer_options(CLI::App* cmd, std::string& kind, std::string& vocab) {
  cmd->add_option("--tokenizer", kind, "bytes (vocab 257) or gpt2 (vocab 50257)")
      ->required()
      ->check(CLI::IsMember({"bytes", "gpt2"}));
  cmd->add_option("--vocab", vocab, "gpt2: directory with encoder.json and vocab.bpe")
      ->check(nonempty_path())
      ->capture_default_str();
}

// Paths listed one per line in list ("-": standard input).
std::vector<std::string> read_file_list(const std::string& list) {
  std::ifstream file;
  if (list != "-") {
    // An ifstream opens a directory and reads it as an empty list.
    if (std::filesystem::is_directory(list))
      throw TokenizerError("tokenize: --files-from " + list +
                           ": is a directory; allowed: a file that lists the "
                           "input paths, one per line, or - (standard input)");
    file.open(list);
    if (!file)
      throw TokenizerError("tokenize: cannot read --files-from " + list + ": " +
                           std::strerror(errno));
  }
  std::istream& in = list == "-" ? std::cin : file;
  std::vector<std::string> paths;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) paths.push_back(line);
  return paths;
}

// "15496 995" or "15496,995" -> ids, each checked to fit a token.
std::vector<uint16_t> parse_ids(const std::string& list) {
  std::string spaced = list;
  for (char& c : spaced)
    if (c == ',') c = ' ';
  std::istringstream in(spaced);
  std::vector<uint16_t> ids;
  for (std::string word; in >> word;) {
    size_t used = 0;
    long value = -1;
    try {
      value = std::stol(word, &used);
    } catch (const std::exception&) {
    }
    if (used != word.size() || value < 0 || value > 65535)
      throw std::invalid_argument("detokenize: --ids: '" + word + "' is not a token id (0..65535)");
    ids.push_back(static_cast<uint16_t>(value));
  }
  // A list of separators only would decode to nothing and exit 0, as if it had worked.
  if (ids.empty())
    throw std::invalid_argument(
        "detokenize: --ids: '" + list +
        "' holds no token id; allowed: ids 0..65535 separated by spaces or commas");
  return ids;
}

// CPU seconds this process has used (all threads), to tell encoding speed
// from time spent waiting for a busy machine.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  struct Args {
    std::string kind, vocab = "data/cache/gpt2", files_from;
    CorpusOptions corpus;
  };
  auto args = std::make_shared<Args>();
  CorpusOptions& c = args->corpus;
  CLI::App* cmd = app.add_subcommand(
      "tokenize",
      "Text files -> llm.c token shards (<name>_val_000000.bin, <name>_train_000001.bin, ...)");
  add_tokenizer_options(cmd, args->kind, args->vocab);
  cmd->add_option("files", c.files,
                  "input text files, in order; each is one document unless "
                  "--doc-separator cuts it")
      ->check(nonempty_path());
  cmd->add_option("--files-from", args->files_from,
                  "also read input paths from this file, one per "
                  "line ('-': standard input)")
      ->check(nonempty_path());
  cmd->add_option("--out", c.out_dir, "output directory")->required()->check(nonempty_path());
  cmd->add_option("--name", c.name, "shard name prefix (default: the output directory's name)");
  cmd->add_option("--doc-separator", c.doc_separator,
                  "cut files into documents at this exact string (e.g. $'\\n\\n\\n')");
  cmd->add_option("--shard-tokens", c.shard_tokens, "tokens per shard")
      ->check(integer_range(1, 0x7FFFFFFF))
      ->capture_default_str();
  auto* fraction = cmd->add_option("--val-fraction", c.val_fraction,
                                   "validation split: the leading documents that start within "
                                   "this fraction of the input bytes")
                       ->check(number_range(0.0, 1.0, /*hi_open=*/true))
                       ->capture_default_str();
  cmd->add_option("--val-docs", c.val_docs, "validation split: the first N documents")
      ->check(integer_range(0, std::numeric_limits<int64_t>::max()))
      ->excludes(fraction);
  cmd->add_option("--threads", c.threads, "encoding threads (0: all cores)")
      ->check(integer_range(0, 1024))
      ->capture_default_str();
  cmd->add_flag(
      "--strict", c.strict,
      "refuse input the tokenizer would rewrite (gpt2: invalid UTF-8, else replaced by U+FFFD)");
  cmd->callback([args] {
    CorpusOptions& o = args->corpus;
    if (!args->files_from.empty()) {
      const auto listed = read_file_list(args->files_from);
      o.files.insert(o.files.end(), listed.begin(), listed.end());
    }
    if (o.name.empty()) {
      const auto dir = std::filesystem::absolute(o.out_dir).lexically_normal();
      o.name = (dir.has_filename() ? dir : dir.parent_path()).filename().string();
    }
    const auto tokenizer = make_tokenizer(args->kind, args->vocab);
    const auto start = std::chrono::steady_clock::now();
    const double cpu_start = cpu_seconds();
    const CorpusStats s = tokenize_corpus(*tokenizer, o);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double cpu = cpu_seconds() - cpu_start;
    if (s.utf8_replacements > 0)
      spdlog::warn(
          "tokenize: replaced {} invalid UTF-8 sequences ({} bytes) by U+FFFD in {} of {} files "
          "(the first: {}); --strict refuses such input",
          s.utf8_replacements, s.utf8_bytes, s.utf8_files, o.files.size(), s.utf8_first);
    for (const auto& shard : s.shards)
      spdlog::info("wrote {} ({} tokens)", shard, validate_shard(shard));
    std::cout << "tokenize: " << tokenizer->name() << ", " << s.documents << " documents ("
              << s.val_documents << " val), " << s.bytes << " bytes -> " << s.val_tokens
              << " val tokens + " << s.train_tokens << " train tokens in " << s.shards.size()
              << " shards\n";
    std::printf(
        "tokenize: %.3f MB in %.3f s = %.2f MB/s with %d threads (%.2f MB per CPU-second)\n",
        s.bytes / 1e6, seconds, s.bytes / 1e6 / seconds, s.threads, s.bytes / 1e6 / cpu);
  });
}

void add_detokenize_command(CLI::App& app) {
  struct Args {
    std::string kind, vocab = "data/cache/gpt2", ids, out;
    std::vector<std::string> shards;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "detokenize", "Shards or token ids -> text (end-of-text reads <|endoftext|>)");
  add_tokenizer_options(cmd, args->kind, args->vocab);
  cmd->add_option("shards", args->shards, "llm.c token shards, decoded in order")
      ->check(nonempty_path());
  cmd->add_option("--ids", args->ids,
                  "token ids instead of shards: \"15496 995\" or \"15496,995\"");
  cmd->add_option("--out", args->out, "write the text here instead of standard output")
      ->check(nonempty_path());
  cmd->callback([args] {
    if (args->shards.empty() == args->ids.empty())
      throw std::invalid_argument("detokenize: give either shard files or --ids");
    const auto tokenizer = make_tokenizer(args->kind, args->vocab);
    // Everything is decoded before --out is touched: an id or shard that does
    // not decode leaves an existing --out as it was, and a new one uncreated.
    std::string text;
    if (!args->ids.empty()) {
      const auto ids = parse_ids(args->ids);
      try {
        text = tokenizer->decode(ids);
      } catch (const TokenizerError& e) {
        throw std::invalid_argument(std::string("detokenize: --ids: ") + e.what());
      }
    }
    for (const auto& shard : args->shards) text += tokenizer->decode(read_shard(shard));
    if (!args->out.empty()) {
      try {
        write_file_atomically(
            args->out, [&](std::ostream& out) { out << text; }, /*binary=*/true);
      } catch (const std::runtime_error& e) {
        throw TokenizerError(std::string("detokenize: --out ") + e.what());
      }
      return;
    }
    std::cout << text << std::flush;
    if (!std::cout) throw TokenizerError("detokenize: cannot write the text to standard output");
  });
}

}  // namespace qattn::cli
