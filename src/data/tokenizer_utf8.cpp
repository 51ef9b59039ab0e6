// Invalid UTF-8 -> U+FFFD by the "maximal subpart" rule (Unicode ch. 3, U+FFFD
// substitution; WHATWG's UTF-8 decoder): a lead byte and the continuation
// bytes that were still valid become one U+FFFD, and decoding resumes at the
// first byte that broke the sequence.
#include "qattn/tokenizer.hpp"

namespace qattn {

namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// The length of the sequence a lead byte starts (0: not a lead byte) and the
// allowed range of its first continuation byte (excluding overlongs,
// surrogates and code points above U+10FFFF).
struct Lead {
  int length;
  unsigned char lo, hi;
};

Lead classify(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// How many bytes from s[i] form a valid sequence (> 0), or minus the length
// of the maximal invalid subpart to replace (< 0).
int scan(std::string_view s, size_t i) {
  const Lead lead = classify(static_cast<unsigned char>(s[i]));
  if (lead.length == 0) return -1;
  for (int k = 1; k < lead.length; ++k) {
    if (i + k >= s.size()) return -k;
    const auto c = static_cast<unsigned char>(s[i + k]);
    const unsigned char lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) return -k;
  }
  return lead.length;
}

}  // namespace

Utf8Repair repair_utf8(std::string& text) {
  std::string out;          // built only when something is replaced
  Utf8Repair r;
  size_t copied = 0;
  for (size_t i = 0; i < text.size();) {
    const int n = scan(text, i);
    if (n > 0) {
      i += static_cast<size_t>(n);
      continue;
    }
    if (r.sequences == 0) r.first = i;
    out.append(text, copied, i - copied).append(kReplacement);
    i += static_cast<size_t>(-n);
    copied = i;
    ++r.sequences;
    r.bytes += static_cast<size_t>(-n);
  }
  if (r.sequences > 0) {
    out.append(text, copied, std::string::npos);
    text = std::move(out);
  }
  return r;
}

}  // namespace qattn
