// What every tokenizer shares: choosing one by name, encoding a whole text.
#include "qattn/tokenizer.hpp"

namespace qattn {

std::vector<uint16_t> Tokenizer::encode(std::string text) const {
  make_encodable(text);
  std::vector<uint16_t> tokens;
  make_encoder()->encode(text, 0, text.size(), tokens);
  return tokens;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& vocab_dir) {
  if (kind == "bytes") return make_byte_tokenizer();
  if (kind == "gpt2") return make_gpt2_tokenizer(vocab_dir);
  throw TokenizerError("unknown tokenizer '" + kind + "' (allowed: bytes, gpt2)");
}

}  // namespace qattn
