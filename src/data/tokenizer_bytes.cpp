// The byte tokenizer: token b is byte b (0..255), end-of-text is 256.
#include "qattn/tokenizer.hpp"

namespace qattn {

namespace {

constexpr uint16_t kByteEot = 256;

class ByteEncoder final : public Encoder {
 public:
  void encode(std::string_view text, size_t begin, size_t end,
              std::vector<uint16_t>& out) override {
    for (size_t i = begin; i < end; ++i) out.push_back(static_cast<unsigned char>(text[i]));
  }
};

class ByteTokenizer final : public Tokenizer {
 public:
  const char* name() const override { return "bytes"; }
  int vocab_size() const override { return 257; }
  uint16_t eot() const override { return kByteEot; }
  Utf8Repair make_encodable(std::string&) const override { return {}; }  // every byte has a token
  bool is_boundary(std::string_view, size_t) const override { return true; }
  std::unique_ptr<Encoder> make_encoder() const override { return std::make_unique<ByteEncoder>(); }

  std::string decode(std::span<const uint16_t> tokens) const override {
    std::string text;
    text.reserve(tokens.size());
    for (const uint16_t t : tokens) {
      if (t < 256) {
        text.push_back(static_cast<char>(t));
      } else if (t == kByteEot) {
        text += "<|endoftext|>";
      } else {
        throw TokenizerError("bytes tokenizer: token " + std::to_string(t) +
                             " is outside its vocab (0..255 bytes, 256 end-of-text)");
      }
    }
    return text;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace qattn
