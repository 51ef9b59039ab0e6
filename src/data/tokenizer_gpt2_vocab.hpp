// GPT-2's vocabulary as bytes: encoder.json (token string -> id) and
// vocab.bpe (the merges, best first), read and checked.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace qattn::gpt2 {

struct Merge {
  uint32_t rank;    // line order in vocab.bpe: lower merges first
  uint16_t merged;  // the token the pair becomes
};

struct Vocab {
  std::vector<std::string> token_bytes;           // id -> the bytes it stands for
  std::array<uint16_t, 256> byte_token{};          // byte -> its single-byte token
  std::unordered_map<uint32_t, Merge> merges;      // (left << 16 | right) -> merge
  uint16_t eot = 0;                                // "<|endoftext|>"
};

inline uint32_t pair_key(uint16_t left, uint16_t right) {
  return static_cast<uint32_t>(left) << 16 | right;
}

// Reads dir/encoder.json and dir/vocab.bpe; throws TokenizerError naming the
// file (and line) and what is wrong.
Vocab load_vocab(const std::string& dir);

}  // namespace qattn::gpt2
