// GPT-2's vocabulary as bytes: encoder.json (token string -> id) and
// vocab.bpe (the merges, best first), read and checked.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace qattn::gpt2 {

struct Merge {
  uint32_t rank;    // line order in vocab.bpe: lower merges first
  uint16_t merged;  // the token the pair becomes
};

inline uint32_t pair_key(uint16_t left, uint16_t right) {
  return static_cast<uint32_t>(left) << 16 | right;
}

// (left, right) -> Merge by open addressing with Fibonacci hashing: the BPE
// loop looks pairs up millions of times a second, and this is several times
// faster than std::unordered_map.
class MergeTable {
 public:
  // False when the pair is already in the table.
  bool insert(uint16_t left, uint16_t right, Merge merge);
  const Merge* find(uint16_t left, uint16_t right) const {
    if (slots_.empty()) return nullptr;
    const uint32_t key = pair_key(left, right);
    for (uint32_t i = slot_of(key);; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (!s.used) return nullptr;
      if (s.key == key) return &s.merge;
    }
  }
  size_t size() const { return size_; }

 private:
  struct Slot {
    uint32_t key = 0;
    Merge merge{};
    bool used = false;
  };
  uint32_t slot_of(uint32_t key) const { return (key * 0x9E3779B1u) >> shift_; }
  void grow();  // doubles the capacity, keeping the load at most one half

  std::vector<Slot> slots_;
  uint32_t mask_ = 0, shift_ = 32;
  size_t size_ = 0;
};

struct Vocab {
  std::vector<std::string> token_bytes;           // id -> the bytes it stands for
  std::array<uint16_t, 256> byte_token{};          // byte -> its single-byte token
  MergeTable merges;
  uint16_t eot = 0;                                // "<|endoftext|>"
};

// Reads dir/encoder.json and dir/vocab.bpe; throws TokenizerError naming the
// file (and line) and what is wrong.
Vocab load_vocab(const std::string& dir);

}  // namespace qattn::gpt2
