// repair_utf8: invalid UTF-8 -> U+FFFD by the maximal-subpart rule.
#include <catch2/catch.hpp>

#include "qattn/tokenizer.hpp"

namespace {

const std::string R = "\xEF\xBF\xBD";  // U+FFFD

std::string repaired(std::string s, size_t expected_replacements) {
  CHECK(qattn::repair_utf8(s).sequences == expected_replacements);
  return s;
}

}  // namespace

TEST_CASE("repair_utf8 keeps valid UTF-8 unchanged", "[tokenizer][utf8]") {
  const std::string valid = "ascii \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 \xF4\x8F\xBF\xBF \xEF\xBF\xBF";
  CHECK(repaired(valid, 0) == valid);
  CHECK(repaired("", 0).empty());
}

TEST_CASE("repair_utf8 replaces each maximal invalid subpart once", "[tokenizer][utf8]") {
  CHECK(repaired("\xC3(", 1) == R + "(");                      // missing continuation
  CHECK(repaired("abc\xE2\x82", 1) == "abc" + R);              // truncated at the end
  CHECK(repaired("\xF0\x9F\x98 x", 1) == R + " x");            // 3 of 4 bytes: one U+FFFD
  CHECK(repaired("\xC0\xAF", 2) == R + R);                     // overlong lead: no subpart
  CHECK(repaired("\xE0\x80\x80", 3) == R + R + R);             // overlong 3-byte
  CHECK(repaired("\xED\xA0\x80", 3) == R + R + R);             // surrogate
  CHECK(repaired("\xF4\x90\x80\x80", 4) == R + R + R + R);     // above U+10FFFF
  CHECK(repaired("\x80\xBF", 2) == R + R);                     // lone continuations
  CHECK(repaired("\xFF\xFE", 2) == R + R);                     // never valid
  CHECK(repaired("\xE2\x82\xE2\x82\xAC", 1) == R + "\xE2\x82\xAC");  // resume at the breaking byte
}

TEST_CASE("repair_utf8 counts the bytes it replaced and where the first was", "[tokenizer][utf8]") {
  std::string s = "ok \xF0\x9F\x98 x \xC0\xAF \xE2\x82";  // 3 bytes as one, 2 as two, 2 at the end as one
  const qattn::Utf8Repair r = qattn::repair_utf8(s);
  CHECK(r.sequences == 4);
  CHECK(r.bytes == 7);
  CHECK(r.first == 3);
  CHECK(s == "ok " + R + " x " + R + R + " " + R);
  std::string valid = "caf\xC3\xA9";
  CHECK(qattn::repair_utf8(valid).bytes == 0);
}
