// Tokenizers and the corpus pipeline that turns text files into llm.c shards.
//
// Two tokenizers:
//   bytes: one token per byte (0..255) and end-of-text 256; vocab 257.
//   gpt2:  GPT-2's byte-level BPE (encoder.json + vocab.bpe), pre-tokenised by
//          GPT-2's pattern; end-of-text <|endoftext|> = 50256; vocab 50257.
// A corpus is a list of documents; every document is preceded by end-of-text,
// as llm.c's data scripts do, so the token stream reads EOT doc EOT doc ...
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace qattn {

struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What repair_utf8 (or Tokenizer::make_encodable) replaced in one text.
struct Utf8Repair {
  size_t sequences = 0;  // maximal invalid subparts, one U+FFFD each
  size_t bytes = 0;      // the bytes they held
  size_t first = 0;      // byte offset of the first one in the original text (when sequences > 0)
};

// Per-thread encoding state (GPT-2 keeps its merge cache and regex match data
// here), so that threads never share anything mutable.
class Encoder {
 public:
  virtual ~Encoder() = default;
  // Appends the tokens of text[begin, end). text must have been through
  // Tokenizer::make_encodable, begin and end must be boundaries
  // (Tokenizer::is_boundary); the whole text is passed because GPT-2's
  // pattern looks one character past the end of a piece.
  virtual void encode(std::string_view text, size_t begin, size_t end,
                      std::vector<uint16_t>& out) = 0;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual const char* name() const = 0;
  virtual int vocab_size() const = 0;
  virtual uint16_t eot() const = 0;
  // Rewrites what the tokenizer cannot encode, in place, and says what it
  // replaced. gpt2: invalid UTF-8 becomes U+FFFD (see repair_utf8); bytes:
  // every byte has a token.
  virtual Utf8Repair make_encodable(std::string& text) const = 0;
  // True when encoding text in two pieces split at byte p gives the same tokens
  // as encoding it whole; 0 and text.size() always are.
  virtual bool is_boundary(std::string_view text, size_t p) const = 0;
  virtual std::unique_ptr<Encoder> make_encoder() const = 0;
  // The bytes the tokens stand for; end-of-text reads "<|endoftext|>".
  // Throws TokenizerError for an id outside the vocab.
  virtual std::string decode(std::span<const uint16_t> tokens) const = 0;

  // Convenience: the tokens of a whole text (made encodable first), no EOT.
  std::vector<uint16_t> encode(std::string text) const;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();
// vocab_dir holds encoder.json and vocab.bpe (data/prepare.sh gpt2-vocab).
// Throws TokenizerError naming the file and what is wrong.
std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& vocab_dir);
// "bytes" or "gpt2"; vocab_dir is used by gpt2 only.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir);

// Replaces each maximal invalid UTF-8 subsequence by U+FFFD (the WHATWG /
// Unicode "maximal subpart" rule, the one node and browsers decode with), so
// the GPT-2 tokens of a file equal those of the reference encoder fed the same
// file.
Utf8Repair repair_utf8(std::string& text);

// ---------------------------------------------------------------------------
// Corpus -> shards.

struct CorpusOptions {
  std::vector<std::string> files;
  std::string out_dir;
  std::string name;                  // shard names: <name>_val_000000.bin, <name>_train_000001.bin, ...
  std::string doc_separator;         // empty: each file is one document
  int64_t shard_tokens = 100'000'000;
  double val_fraction = 0.05;        // leading documents holding this fraction of the input bytes
  int64_t val_docs = -1;             // >= 0: exactly this many leading documents instead
  int threads = 0;                   // 0: all cores
  bool strict = false;               // refuse text the tokenizer would have to rewrite (invalid UTF-8 for gpt2)
};

struct CorpusStats {
  int64_t documents = 0, val_documents = 0;
  int64_t bytes = 0;
  int64_t val_tokens = 0, train_tokens = 0;
  int64_t utf8_replacements = 0;     // invalid UTF-8 sequences replaced by U+FFFD
  int64_t utf8_bytes = 0;            // the bytes they held
  int64_t utf8_files = 0;            // files that held any
  std::string utf8_first;            // "FILE at byte N": where the first one was
  int threads = 0;                   // encoding threads used
  std::vector<std::string> shards;   // paths written, in order
};

// Tokenises the files in order (documents in parallel, output deterministic)
// and writes the shards. The shards are written into a hidden folder in
// out_dir and moved into place, replacing the old shards of the same name,
// only when everything succeeded: a failure leaves out_dir as it was. Throws
// TokenizerError / DataError naming the file or option at fault.
CorpusStats tokenize_corpus(const Tokenizer& tokenizer, const CorpusOptions& options);

}  // namespace qattn
