// Text files -> llm.c shards. Files are read in order and cut into documents;
// a batch of documents is cut into pieces at tokenizer boundaries, the pieces
// are encoded in parallel (one Encoder per thread), and the tokens are written
// in input order, so the shards do not depend on the thread count.
#include <omp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "qattn/data.hpp"
#include "qattn/tokenizer.hpp"

namespace qattn {

namespace {

namespace fs = std::filesystem;

constexpr size_t kBatchBytes = 64u << 20;  // text encoded per parallel round
constexpr size_t kPieceBytes = 1u << 20;   // target size of one thread's piece

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw TokenizerError("tokenize: cannot read input file " + path + ": " + std::strerror(errno));
  std::ostringstream s;
  s << f.rdbuf();
  if (f.bad()) throw TokenizerError("tokenize: error while reading " + path + ": " + std::strerror(errno));
  return s.str();
}

// Accumulates tokens into shards of shard_tokens in dir; val shards come
// first, and the split changes at most once, from val to train.
class ShardWriter {
 public:
  ShardWriter(const CorpusOptions& o, const fs::path& dir, CorpusStats& stats)
      : dir_(dir), name_(o.name), shard_tokens_(static_cast<size_t>(o.shard_tokens)), stats_(stats) {}

  void append(bool val, std::span<const uint16_t> tokens) {
    if (!val && val_) {
      flush();
      val_ = false;
    }
    (val ? stats_.val_tokens : stats_.train_tokens) += static_cast<int64_t>(tokens.size());
    while (!tokens.empty()) {
      const size_t take = std::min(tokens.size(), shard_tokens_ - buffer_.size());
      buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + static_cast<long>(take));
      tokens = tokens.subspan(take);
      if (buffer_.size() == shard_tokens_) flush();
    }
  }

  void flush() {
    if (buffer_.empty()) return;
    char file[64];
    std::snprintf(file, sizeof file, "_%s_%06d.bin", val_ ? "val" : "train", index_++);
    const std::string path = (dir_ / (name_ + file)).string();
    write_shard(path, buffer_.data(), buffer_.size());
    stats_.shards.push_back(path);
    buffer_.clear();
  }

 private:
  fs::path dir_;
  std::string name_;
  size_t shard_tokens_;
  CorpusStats& stats_;
  std::vector<uint16_t> buffer_;
  bool val_ = true;
  int index_ = 0;
};

void check_options(const CorpusOptions& o) {
  if (o.files.empty()) throw TokenizerError("tokenize: no input files");
  if (o.out_dir.empty()) throw TokenizerError("tokenize: --out is required");
  if (o.name.empty() || o.name.find('/') != std::string::npos)
    throw TokenizerError("tokenize: --name '" + o.name + "' must be a non-empty file name prefix");
  if (o.shard_tokens < 1 || o.shard_tokens > 0x7FFFFFFF)
    throw TokenizerError("tokenize: --shard-tokens " + std::to_string(o.shard_tokens) +
                         " is out of range (1..2147483647)");
  if (!(o.val_fraction >= 0.0 && o.val_fraction < 1.0))
    throw TokenizerError("tokenize: --val-fraction " + std::to_string(o.val_fraction) +
                         " is out of range ([0, 1))");
  if (o.threads < 0)
    throw TokenizerError("tokenize: --threads " + std::to_string(o.threads) + " must be >= 0");
  for (const auto& f : o.files)
    if (!fs::is_regular_file(f))
      throw TokenizerError("tokenize: input file " + f + " does not exist or is not a file");
}

// NAME_val_NNNNNN.bin or NAME_train_NNNNNN.bin.
bool is_shard_of(const std::string& file, const std::string& name) {
  if (file.rfind(name, 0) != 0) return false;
  const std::string_view rest = std::string_view(file).substr(name.size());
  for (const std::string_view split : {"_val_", "_train_"}) {
    if (rest.size() != split.size() + 10 || rest.substr(0, split.size()) != split ||
        rest.substr(split.size() + 6) != ".bin")
      continue;
    const std::string_view digits = rest.substr(split.size(), 6);
    if (std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return true;
  }
  return false;
}

// Moves the shards written into staging to out_dir. Shards from an earlier
// run with the same name go first: they would otherwise mix into the data globs.
void publish_shards(const CorpusOptions& o, CorpusStats& stats) {
  std::error_code ec;
  const auto fail = [&](const fs::path& p) {
    throw TokenizerError("tokenize: cannot replace " + p.string() + ": " + ec.message());
  };
  for (const auto& entry : fs::directory_iterator(o.out_dir))
    if (is_shard_of(entry.path().filename().string(), o.name) && !fs::remove(entry.path(), ec)) fail(entry.path());
  for (auto& shard : stats.shards) {
    const fs::path target = fs::path(o.out_dir) / fs::path(shard).filename();
    if (fs::rename(shard, target, ec); ec) fail(target);
    shard = target.string();
  }
}

// The text of one input file, made encodable; invalid UTF-8 is counted, or
// refused under --strict.
std::string encodable_text(const Tokenizer& tokenizer, const std::string& file, bool strict, CorpusStats& stats) {
  std::string text = read_text(file);
  const Utf8Repair r = tokenizer.make_encodable(text);
  if (r.sequences == 0) return text;
  const std::string where = file + " at byte " + std::to_string(r.first);
  if (strict)
    throw TokenizerError("tokenize: " + where + ": invalid UTF-8 (" + std::to_string(r.sequences) +
                         " invalid sequences, " + std::to_string(r.bytes) +
                         " bytes in this file); --strict refuses it (without --strict each becomes U+FFFD)");
  if (stats.utf8_files++ == 0) stats.utf8_first = where;
  stats.utf8_replacements += static_cast<int64_t>(r.sequences);
  stats.utf8_bytes += static_cast<int64_t>(r.bytes);
  return text;
}

struct Document {
  std::string_view text;
  bool val;
};

struct Piece {
  size_t document;
  size_t begin, end;
};

// Cuts a batch's documents into pieces of about kPieceBytes at boundaries.
std::vector<Piece> cut_pieces(const Tokenizer& tokenizer, const std::vector<Document>& docs) {
  std::vector<Piece> pieces;
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::string_view text = docs[d].text;
    for (size_t begin = 0; begin < text.size();) {
      size_t end = std::min(text.size(), begin + kPieceBytes);
      while (end < text.size() && !tokenizer.is_boundary(text, end)) ++end;
      pieces.push_back({d, begin, end});
      begin = end;
    }
  }
  return pieces;
}

// Encodes one batch in parallel and writes it in order: EOT, then the document.
void encode_batch(const Tokenizer& tokenizer, std::vector<std::unique_ptr<Encoder>>& encoders,
                  const std::vector<Document>& docs, ShardWriter& writer) {
  const std::vector<Piece> pieces = cut_pieces(tokenizer, docs);
  std::vector<std::vector<uint16_t>> tokens(pieces.size());
  std::vector<std::exception_ptr> errors(pieces.size());  // exceptions cannot leave an OpenMP loop
  const int n = static_cast<int>(pieces.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(static_cast<int>(encoders.size()))
  for (int i = 0; i < n; ++i) {
    const Piece& p = pieces[i];
    try {
      encoders[omp_get_thread_num()]->encode(docs[p.document].text, p.begin, p.end, tokens[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  const uint16_t eot = tokenizer.eot();
  size_t next_piece = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    writer.append(docs[d].val, {&eot, 1});
    for (; next_piece < pieces.size() && pieces[next_piece].document == d; ++next_piece)
      writer.append(docs[d].val, tokens[next_piece]);
  }
}

CorpusStats tokenize_into(const Tokenizer& tokenizer, const CorpusOptions& o, const fs::path& dir) {
  const auto start = std::chrono::steady_clock::now();

  int64_t total_bytes = 0;
  for (const auto& f : o.files) total_bytes += static_cast<int64_t>(fs::file_size(f));
  // Documents that start within the first val_fraction of the input bytes
  // (or the first val_docs documents) form the validation split.
  const double val_bytes = o.val_fraction * static_cast<double>(total_bytes);
  const auto is_val = [&](int64_t doc_index, int64_t doc_start) {
    return o.val_docs >= 0 ? doc_index < o.val_docs : static_cast<double>(doc_start) < val_bytes;
  };

  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  std::vector<std::unique_ptr<Encoder>> encoders;
  for (int t = 0; t < threads; ++t) encoders.push_back(tokenizer.make_encoder());

  CorpusStats stats;
  stats.threads = threads;
  ShardWriter writer(o, dir, stats);
  std::deque<std::string> texts;  // the files of the current batch (stable addresses)
  std::vector<Document> docs;
  size_t batch_bytes = 0;
  int64_t file_start = 0;
  const auto run_batch = [&] {
    encode_batch(tokenizer, encoders, docs, writer);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    spdlog::info("tokenize: {:.1f} / {:.1f} MB, {} documents, {:.1f} MB/s", stats.bytes / 1e6,
                 total_bytes / 1e6, stats.documents, stats.bytes / 1e6 / s);
    texts.clear();
    docs.clear();
    batch_bytes = 0;
  };
  for (const auto& file : o.files) {
    const auto file_bytes = static_cast<int64_t>(fs::file_size(file));
    texts.push_back(encodable_text(tokenizer, file, o.strict, stats));
    const std::string& text = texts.back();
    const std::string_view all = text;
    const std::string_view sep = o.doc_separator;
    for (size_t begin = 0; begin <= all.size();) {
      const size_t found = sep.empty() ? std::string_view::npos : all.find(sep, begin);
      const size_t end = found == std::string_view::npos ? all.size() : found;
      if (end > begin) {  // empty documents carry no text and are skipped
        const bool val = is_val(stats.documents, file_start + static_cast<int64_t>(begin));
        docs.push_back({all.substr(begin, end - begin), val});
        stats.documents += 1;
        stats.val_documents += val ? 1 : 0;
        stats.bytes += static_cast<int64_t>(end - begin);
      }
      if (found == std::string_view::npos) break;
      begin = found + sep.size();
    }
    file_start += file_bytes;
    batch_bytes += text.size();
    if (batch_bytes >= kBatchBytes) run_batch();
  }
  if (!docs.empty()) run_batch();
  writer.flush();

  if (stats.documents == 0) throw TokenizerError("tokenize: the input files hold no text");
  if (stats.train_tokens == 0)
    throw TokenizerError("tokenize: all " + std::to_string(stats.documents) +
                         " documents went to the validation split; give more documents "
                         "(more files, or --doc-separator) or a smaller --val-fraction / --val-docs");
  return stats;
}

}  // namespace

CorpusStats tokenize_corpus(const Tokenizer& tokenizer, const CorpusOptions& o) {
  check_options(o);
  std::error_code ec;
  const bool made_out_dir = !fs::exists(o.out_dir, ec);
  if (fs::create_directories(o.out_dir, ec); ec)
    throw TokenizerError("tokenize: cannot create --out " + o.out_dir + ": " + ec.message());
  const fs::path staging = fs::path(o.out_dir) / ("." + o.name + ".tokenize.tmp");
  fs::remove_all(staging, ec);
  if (fs::create_directory(staging, ec); ec)
    throw TokenizerError("tokenize: cannot write into --out " + o.out_dir + ": " + ec.message());
  try {
    CorpusStats stats = tokenize_into(tokenizer, o, staging);
    publish_shards(o, stats);
    fs::remove(staging, ec);
    return stats;
  } catch (...) {
    fs::remove_all(staging, ec);
    if (made_out_dir) fs::remove(o.out_dir, ec);  // only when empty
    throw;
  }
}

}  // namespace qattn
