// GPT-2's byte-level BPE: the text is cut into pre-tokens by GPT-2's pattern
// (PCRE2, UTF mode, JIT), each pre-token's bytes start as single-byte tokens
// and the best-ranked adjacent pair is merged until no pair is a merge.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstring>

#include "qattn/tokenizer.hpp"
#include "tokenizer_gpt2_vocab.hpp"

namespace qattn {

namespace {

// GPT-2's pattern. \s is spelled out as the whitespace of JavaScript's \s, so
// that the tokens equal those of the reference encoder (npm gpt-3-encoder);
// PCRE2's own \s differs on U+0085, U+180E and U+FEFF.
#define QATTN_WS "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
                 "\\x{202F}\\x{205F}\\x{3000}\\x{FEFF}"
constexpr char kPattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d"        // contractions (lowercase only, as GPT-2)
    "| ?\\p{L}+| ?\\p{N}+"           // words and numbers, with one leading space
    "| ?[^" QATTN_WS "\\p{L}\\p{N}]+"  // other symbols, with one leading space
    "|[" QATTN_WS "]+(?![^" QATTN_WS "])"  // spaces not before a word: all but the last
    "|[" QATTN_WS "]+";
#undef QATTN_WS

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

// The compiled pattern, shared read-only by every encoder.
struct Pattern {
  pcre2_code* code = nullptr;
  Pattern() {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                         PCRE2_UTF | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
    if (!code)
      throw TokenizerError("gpt2: the pre-tokenisation pattern does not compile at " +
                           std::to_string(offset) + ": " + pcre2_message(error));
    if (const int jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE); jit != 0) {
      pcre2_code_free(code);
      throw TokenizerError("gpt2: PCRE2 JIT is unavailable: " + pcre2_message(jit));
    }
  }
  ~Pattern() { pcre2_code_free(code); }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
};

// The merge cache, per thread: pre-token bytes -> tokens. Direct-mapped (a
// piece has one slot, chosen by its hash; a collision overwrites) in 64-byte
// slots of one 8 MB array, so a lookup touches one cache line, where a
// node-based hash map of the same pieces stalls on memory. Frequent pieces
// stay in it; the output never depends on it.
class MergeCache {
 public:
  static constexpr size_t kMaxPiece = 30, kMaxTokens = 16;
  MergeCache() : slots_(kSlots) {}

  // Appends the cached tokens of piece and returns true, or returns false.
  bool find(std::string_view piece, std::vector<uint16_t>& out) const {
    if (piece.size() > kMaxPiece) return false;
    const Slot& s = slots_[slot_of(piece)];
    if (s.piece_len != piece.size() || std::memcmp(s.piece, piece.data(), piece.size()) != 0)
      return false;
    out.insert(out.end(), s.tokens, s.tokens + s.n_tokens);
    return true;
  }

  void put(std::string_view piece, std::span<const uint16_t> tokens) {
    if (piece.size() > kMaxPiece || tokens.size() > kMaxTokens) return;
    Slot& s = slots_[slot_of(piece)];
    s.piece_len = static_cast<uint8_t>(piece.size());
    s.n_tokens = static_cast<uint8_t>(tokens.size());
    std::memcpy(s.piece, piece.data(), piece.size());
    std::copy(tokens.begin(), tokens.end(), s.tokens);
  }

 private:
  struct Slot {
    uint8_t piece_len = 0, n_tokens = 0;  // piece_len 0: empty (pieces of 1 byte skip the cache)
    char piece[kMaxPiece];
    uint16_t tokens[kMaxTokens];
  };
  static_assert(sizeof(Slot) == 64);
  static constexpr int kSlotBits = 17;
  static constexpr size_t kSlots = size_t{1} << kSlotBits;

  // FNV-1a, then Fibonacci hashing onto the slots.
  static size_t slot_of(std::string_view piece) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char c : piece) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
    return static_cast<size_t>((h * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  }

  std::vector<Slot> slots_;
};

class Gpt2Encoder final : public Encoder {
 public:
  Gpt2Encoder(const gpt2::Vocab& vocab, const Pattern& pattern) : vocab_(vocab), pattern_(pattern) {
    match_ = pcre2_match_data_create_from_pattern(pattern.code, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    // Long runs of spaces or symbols need more than the JIT's default 32 KB stack.
    stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (!match_ || !context_ || !stack_) throw TokenizerError("gpt2: out of memory for PCRE2");
    pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~Gpt2Encoder() override {
    pcre2_jit_stack_free(stack_);
    pcre2_match_context_free(context_);
    pcre2_match_data_free(match_);
  }

  void encode(std::string_view text, size_t begin, size_t end,
              std::vector<uint16_t>& out) override {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_);
    for (size_t pos = begin; pos < end;) {
      const int rc = pcre2_jit_match(pattern_.code, subject, text.size(), pos, 0, match_, context_);
      if (rc < 0)
        throw TokenizerError("gpt2: pre-tokenisation failed at byte " + std::to_string(pos) +
                             ": " + pcre2_message(rc));
      // The pattern matches at every position, so pieces tile the text.
      if (ovector[0] != pos) throw TokenizerError("gpt2: pre-tokenisation skipped a byte");
      encode_piece(text.substr(pos, ovector[1] - pos), out);
      pos = ovector[1];
    }
  }

 private:
  void encode_piece(std::string_view piece, std::vector<uint16_t>& out) {
    if (piece.size() == 1) {
      out.push_back(vocab_.byte_token[static_cast<unsigned char>(piece[0])]);
      return;
    }
    if (cache_.find(piece, out)) return;
    const size_t first = out.size();
    merge(piece, out);
    cache_.put(piece, std::span<const uint16_t>(out).subspan(first));
  }

  // BPE on one pre-token: repeatedly merge the lowest-ranked adjacent pair,
  // leftmost first. A min-heap of candidate pairs over a linked list of
  // symbols keeps this O(n log n); stale candidates are skipped when popped.
  // (Every merge's parts were made by earlier merges, so a merge never creates
  // a pair ranked before the one just merged: one-at-a-time equals GPT-2's
  // "merge every occurrence of the best pair, left to right".)
  void merge(std::string_view piece, std::vector<uint16_t>& out) {
    const int n = static_cast<int>(piece.size());
    symbols_.resize(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      symbols_[i] = {vocab_.byte_token[static_cast<unsigned char>(piece[i])], i - 1,
                     i + 1 < n ? i + 1 : -1, true};
    heap_.clear();
    const auto push = [&](int left) {
      if (left < 0 || symbols_[left].next < 0) return;
      const int right = symbols_[left].next;
      const gpt2::Merge* m = vocab_.merges.find(symbols_[left].id, symbols_[right].id);
      if (m) {
        heap_.push_back({m->rank, left, right, symbols_[left].id, symbols_[right].id, m->merged});
        std::push_heap(heap_.begin(), heap_.end(), std::greater<>{});
      }
    };
    for (int i = 0; i + 1 < n; ++i) push(i);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>{});
      const Candidate c = heap_.back();
      heap_.pop_back();
      Symbol& l = symbols_[c.left];
      Symbol& r = symbols_[c.right];
      if (!l.alive || !r.alive || l.next != c.right || l.id != c.left_id || r.id != c.right_id)
        continue;
      l.id = c.merged;
      r.alive = false;
      l.next = r.next;
      if (r.next >= 0) symbols_[r.next].prev = c.left;
      push(l.prev);
      push(c.left);
    }
    for (int i = 0; i >= 0; i = symbols_[i].next) out.push_back(symbols_[i].id);
  }

  struct Symbol {
    uint16_t id;
    int prev, next;
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    int left, right;
    uint16_t left_id, right_id, merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };

  const gpt2::Vocab& vocab_;
  const Pattern& pattern_;
  pcre2_match_data* match_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
  MergeCache cache_;
  std::vector<Symbol> symbols_;
  std::vector<Candidate> heap_;  // min-heap by (rank, position)
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  explicit Gpt2Tokenizer(gpt2::Vocab vocab) : vocab_(std::move(vocab)) {}
  const char* name() const override { return "gpt2"; }
  int vocab_size() const override { return static_cast<int>(vocab_.token_bytes.size()); }
  uint16_t eot() const override { return vocab_.eot; }
  Utf8Repair make_encodable(std::string& text) const override { return repair_utf8(text); }

  // A newline followed by a non-space ASCII byte: the newline ends a run of
  // whitespace that cannot reach into the next character, so every piece ends
  // there, and the next one starts there exactly as in a fresh text.
  bool is_boundary(std::string_view text, size_t p) const override {
    if (p == 0 || p >= text.size()) return true;
    const auto c = static_cast<unsigned char>(text[p]);
    return text[p - 1] == '\n' && c > ' ' && c < 0x80;
  }

  std::unique_ptr<Encoder> make_encoder() const override {
    return std::make_unique<Gpt2Encoder>(vocab_, pattern_);
  }

  std::string decode(std::span<const uint16_t> tokens) const override {
    std::string text;
    for (const uint16_t t : tokens) {
      if (t >= vocab_.token_bytes.size())
        throw TokenizerError("gpt2: token " + std::to_string(t) + " is outside the vocab (0.." +
                             std::to_string(vocab_.token_bytes.size() - 1) + ")");
      text += vocab_.token_bytes[t];
    }
    return text;
  }

 private:
  gpt2::Vocab vocab_;
  Pattern pattern_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_gpt2_tokenizer(const std::string& vocab_dir) {
  return std::make_unique<Gpt2Tokenizer>(gpt2::load_vocab(vocab_dir));
}

}  // namespace qattn
