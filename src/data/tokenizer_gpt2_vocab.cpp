// Loading GPT-2's encoder.json and vocab.bpe. Both spell bytes with GPT-2's
// printable alphabet (bytes_to_unicode): bytes '!'..'~', 0xA1..0xAC and
// 0xAE..0xFF stand for themselves, the other 68 bytes for U+0100.. in order.
#include "tokenizer_gpt2_vocab.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "qattn/json_file.hpp"
#include "qattn/tokenizer.hpp"

namespace qattn::gpt2 {

namespace {

constexpr int kMaxVocab = 65536;  // shards store uint16 tokens

// Code point -> byte for GPT-2's alphabet; -1 where a code point is not in it.
std::vector<int> unicode_to_byte() {
  std::vector<int> table(512, -1);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    table[printable ? b : next++] = b;
  }
  return table;
}

// Decodes one token string (UTF-8 of alphabet characters) to its bytes.
bool to_bytes(const std::string& spelled, const std::vector<int>& alphabet, std::string& bytes) {
  bytes.clear();
  for (size_t i = 0; i < spelled.size();) {
    const auto c0 = static_cast<unsigned char>(spelled[i]);
    uint32_t cp;
    if (c0 < 0x80) {
      cp = c0;
      i += 1;
    } else if ((c0 & 0xE0) == 0xC0 && i + 1 < spelled.size()) {
      cp = (c0 & 0x1Fu) << 6 | (static_cast<unsigned char>(spelled[i + 1]) & 0x3Fu);
      i += 2;
    } else {
      return false;  // alphabet characters are all below U+0800
    }
    if (cp >= alphabet.size() || alphabet[cp] < 0) return false;
    bytes.push_back(static_cast<char>(alphabet[cp]));
  }
  return !bytes.empty();
}

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  if (!f || std::filesystem::is_directory(path))
    throw TokenizerError("gpt2 vocab: cannot read " + path.string() + ": " +
                         (f ? "is a directory" : std::strerror(errno)) + " (" + what +
                         "; data/prepare.sh gpt2-vocab puts it in data/cache/gpt2/)");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void load_encoder(const std::filesystem::path& path, const std::vector<int>& alphabet,
                  Vocab& vocab, std::unordered_map<std::string, uint16_t>& id_of) {
  nlohmann::json j;
  try {
    j = parse_json(read_file(path, "GPT-2's token -> id map"));
  } catch (const JsonError& e) {
    throw TokenizerError("gpt2 vocab: " + path.string() + ": " + e.what());
  }
  if (!j.is_object() || j.empty() || j.size() > kMaxVocab)
    throw TokenizerError("gpt2 vocab: " + path.string() +
                         " must be a JSON object of 1..65536 token strings -> ids");
  vocab.token_bytes.assign(j.size(), {});
  std::vector<bool> seen(j.size(), false);
  bool have_eot = false;
  std::string bytes;
  for (const auto& [spelled, id_json] : j.items()) {
    if (!id_json.is_number_integer() || id_json.get<int64_t>() < 0 ||
        id_json.get<int64_t>() >= static_cast<int64_t>(j.size()))
      throw TokenizerError("gpt2 vocab: " + path.string() + ": \"" + spelled + "\" has id " +
                           id_json.dump() + "; ids must be integers 0.." +
                           std::to_string(j.size() - 1));
    const auto id = id_json.get<uint16_t>();
    if (seen[id])
      throw TokenizerError("gpt2 vocab: " + path.string() + ": id " + std::to_string(id) +
                           " is given to two tokens (the second is \"" + spelled + "\")");
    seen[id] = true;
    if (spelled == "<|endoftext|>") {
      vocab.eot = id;
      have_eot = true;
      vocab.token_bytes[id] = spelled;
      continue;
    }
    if (!to_bytes(spelled, alphabet, bytes))
      throw TokenizerError("gpt2 vocab: " + path.string() + ": token \"" + spelled +
                           "\" has a character outside GPT-2's byte alphabet");
    vocab.token_bytes[id] = bytes;
    id_of.emplace(bytes, id);
  }
  if (!have_eot)
    throw TokenizerError("gpt2 vocab: " + path.string() + " has no \"<|endoftext|>\" token");
  for (int b = 0; b < 256; ++b) {
    const auto it = id_of.find(std::string(1, static_cast<char>(b)));
    if (it == id_of.end())
      throw TokenizerError("gpt2 vocab: " + path.string() + " has no token for byte " +
                           std::to_string(b) + "; byte-level BPE needs all 256");
    vocab.byte_token[b] = it->second;
  }
}

void load_merges(const std::filesystem::path& path, const std::vector<int>& alphabet,
                 Vocab& vocab, const std::unordered_map<std::string, uint16_t>& id_of) {
  std::istringstream lines(read_file(path, "GPT-2's merges"));
  std::string line;
  std::string parts[2];
  for (int line_no = 1; std::getline(lines, line); ++line_no) {
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto where = [&] { return path.string() + ":" + std::to_string(line_no) + ": "; };
    const size_t space = line.find(' ');
    if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos)
      throw TokenizerError("gpt2 vocab: " + where() + "\"" + line +
                           "\" is not a merge (two tokens separated by one space)");
    uint16_t ids[2];
    for (int k = 0; k < 2; ++k) {
      const std::string spelled = k == 0 ? line.substr(0, space) : line.substr(space + 1);
      const auto it = to_bytes(spelled, alphabet, parts[k]) ? id_of.find(parts[k]) : id_of.end();
      if (it == id_of.end())
        throw TokenizerError("gpt2 vocab: " + where() + "\"" + spelled +
                             "\" is not a token of encoder.json");
      ids[k] = it->second;
    }
    const auto merged = id_of.find(parts[0] + parts[1]);
    if (merged == id_of.end())
      throw TokenizerError("gpt2 vocab: " + where() + "the merge of \"" + line +
                           "\" is not a token of encoder.json");
    const auto rank = static_cast<uint32_t>(vocab.merges.size());
    if (!vocab.merges.insert(ids[0], ids[1], Merge{rank, merged->second}))
      throw TokenizerError("gpt2 vocab: " + where() + "the merge \"" + line +
                           "\" appears twice");
  }
  if (vocab.merges.size() == 0)
    throw TokenizerError("gpt2 vocab: " + path.string() + " has no merges");
}

}  // namespace

bool MergeTable::insert(uint16_t left, uint16_t right, Merge merge) {
  if (2 * (size_ + 1) > slots_.size()) grow();
  const uint32_t key = pair_key(left, right);
  uint32_t i = slot_of(key);
  for (; slots_[i].used; i = (i + 1) & mask_)
    if (slots_[i].key == key) return false;
  slots_[i] = {key, merge, true};
  ++size_;
  return true;
}

void MergeTable::grow() {
  std::vector<Slot> old = std::move(slots_);
  const size_t capacity = old.empty() ? 1024 : 2 * old.size();
  slots_.assign(capacity, Slot{});
  mask_ = static_cast<uint32_t>(capacity - 1);
  shift_ = 32 - static_cast<uint32_t>(std::countr_zero(capacity));
  for (const Slot& s : old) {
    if (!s.used) continue;
    uint32_t i = slot_of(s.key);
    while (slots_[i].used) i = (i + 1) & mask_;
    slots_[i] = s;
  }
}

Vocab load_vocab(const std::string& dir) {
  if (!std::filesystem::is_directory(dir))
    throw TokenizerError("gpt2 vocab: '" + dir +
                         "' is not a directory (it should hold encoder.json and vocab.bpe; "
                         "data/prepare.sh gpt2-vocab makes data/cache/gpt2)");
  const std::vector<int> alphabet = unicode_to_byte();
  Vocab vocab;
  std::unordered_map<std::string, uint16_t> id_of;
  load_encoder(std::filesystem::path(dir) / "encoder.json", alphabet, vocab, id_of);
  load_merges(std::filesystem::path(dir) / "vocab.bpe", alphabet, vocab, id_of);
  return vocab;
}

}  // namespace qattn::gpt2
