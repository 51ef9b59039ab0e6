// The GPT-2 tokenizer: known answers, round trips, piece boundaries, the
// corpus pipeline, bad vocab files, and token-for-token equality with the
// reference encoder (npm gpt-3-encoder, run by node) on real and adversarial
// text. Needs data/cache/gpt2 (data/prepare.sh gpt2-vocab); skips without it.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "qattn/data.hpp"
#include "qattn/tokenizer.hpp"
#include "test_tokenizer_util.hpp"

using namespace qattn;
using namespace qattn::test;

namespace {

// Loaded once: reading the vocab takes a moment.
const Tokenizer* gpt2_or_skip() {
  static const std::unique_ptr<Tokenizer> tok =
      have_gpt2_vocab() ? make_gpt2_tokenizer(gpt2_vocab_dir().string()) : nullptr;
  if (!tok)
    WARN("skipped: no GPT-2 vocab in " << gpt2_vocab_dir() << " (run data/prepare.sh gpt2-vocab)");
  return tok.get();
}

using Ids = std::vector<uint16_t>;

// Hand-picked hard cases: many scripts' letters and digits, emoji, every
// contraction in both cases, whitespace runs, JS-vs-PCRE2 whitespace, symbol
// runs, empty and one-character documents, invalid UTF-8.
std::vector<std::string> adversarial_documents() {
  return {
      "Hello world", "", " ", "a", "\n", "'", "'s",
      "I'm you're we've they'll he'd it's don't can't",
      "I'M YOU'RE WE'VE THEY'LL HE'D IT'S DON'T 'S 'T 'RE 'VE 'M 'LL 'D",
      "'s't're've'm'll'd ''s '''t x's  's\n's",
      "a  b   c\n\n\nd \n e\t\tf \t\n  \r\n\r\n   ", "   ", "x     ", "   x", "\n\n\n\nx\n \n",
      " \t \n\t\n  \t\t  end", "tabs\tand\ttabs\t\t\t", "trailing spaces   \n   \n",
      "\xCE\x9A\xCE\xB1\xCE\xBB\xCE\xB7\xCE\xBC\xCE\xAD\xCF\x81\xCE\xB1 \xCE\xBA\xCF\x8C\xCF\x83\xCE\xBC\xCE\xB5",
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBC\xD0\xB8\xD1\x80! \xD0\x81\xD0\xB6\xD0\xB8\xD0\xBA",
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7\xD9\x84\xD9\x85 \xD9\xA1\xD9\xA2\xD9\xA3",
      "\xD7\xA9\xD7\x9C\xD7\x95\xD7\x9D \xD7\xA2\xD7\x95\xD7\x9C\xD7\x9D",
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 \xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE \xE0\xA5\xAA\xE0\xA5\xAB",
      "\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5 \xE0\xB9\x91\xE0\xB9\x92",
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9\xE3\x83\x88",
      "\xEC\x95\x88\xEB\x85\x95\xED\x95\x98\xEC\x84\xB8\xEC\x9A\x94 \xEC\x84\xB8\xEA\xB3\x84",
      "\xE1\x88\xB0\xE1\x88\x8B\xE1\x88\x9D \xE1\x83\x92\xE1\x83\x90\xE1\x83\x9B\xE1\x83\x90\xE1\x83\xA0\xE1\x83\xAF\xE1\x83\x9D\xE1\x83\x91\xE1\x83\x90",
      "\xEF\xBC\x91\xEF\xBC\x92\xEF\xBC\x93 \xE2\x91\xA0\xE2\x91\xA1 \xC2\xBD \xE2\x85\xAB \xF0\x9D\x9F\x98\xF0\x9D\x9F\x99 \xE0\xAF\xA7\xE0\xAF\xA8",
      "\xC4\x85\xC4\x87\xC4\x99 \xC3\x9F\xC3\xB8\xC3\xA5 \xC3\x87" "a va? \xC3\x86\xC3\xB0\xC3\xBE e\xCC\x81 n\xCC\x83",
      "\xF0\x9F\x98\x80\xF0\x9F\x98\x83 \xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 \xF0\x9F\x87\xBA\xF0\x9F\x87\xB8 \xE2\x9D\xA4\xEF\xB8\x8F!!",
      // whitespace where JavaScript's \s and PCRE2's differ, and zero-width characters
      "a\xC2\xA0" "b\xE2\x80\xA8" "c\xE3\x80\x80" "d\xEF\xBB\xBF" "e\xC2\x85" "f\xE1\xA0\x8E" "g\xE2\x80\x8B" "h \xC2\xA0 i",
      "\x1C\x1D\x1E\x1F \x0B\x0C x\x0B\x0Cy \x7F\x01",
      "<|endoftext|> literal <|endoftext|>",
      "\"],\"\",\"}, '\",\"' \".\",\" ...!!!??? ---- ==== .... ,,,, ''''",
      "def f(x):\n    return x**2  # comment\n\n\nclass A:\n\tpass\n",
      "12345678901234567890 3.14159 1,000,000 0x1F 1e-9 \xE2\x82\xAC" "12.50",
      "\xC3(", "abc\xE2\x82", "\xF0\x9F\x98 x", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80",
      "\x80\x80", "\xFF\xFE", "ok\xE0\x80\x80ok", "\xE2\x82\xE2\x82\xAC",
      std::string(3000, ' ') + "x", std::string(2000, '=') + "\n" + std::string(1500, '\n'),
      std::string(1500, 'a'), "x" + std::string(700, '!') + " y",
  };
}

// Random strings over a pool of troublesome characters (fixed seed).
std::vector<std::string> random_documents(int count) {
  const std::vector<std::string> pool = {
      "a", "s", "t", "re", "ve", "m", "ll", "d", "S", "T", "D", "'", "\"", ",", ".", "]", "[", "}",
      ")", " ", "  ", "\n", "\t", "\r", "\xC2\xA0", "\xC2\x85", "\xE3\x80\x80", "\xEF\xBB\xBF",
      "1", "42", "\xD9\xA3", "\xC3\xA9", "\xCC\x81", "\xD0\xB6", "\xE4\xBD\xA0", "\xF0\x9F\x98\x80",
      "\xE2\x80\x8D", "-", "_", "\xE2\x80\x94", "Ġ", "<|endoftext|>"};
  std::mt19937 rng(20240520);
  std::vector<std::string> docs;
  for (int i = 0; i < count; ++i) {
    std::string d;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) d += pool[rng() % pool.size()];
    docs.push_back(d);
  }
  return docs;
}

// Every string of up to 5 characters over the symbols whose pairs the
// reference's string-keyed merge table could confuse (pairs with commas).
std::vector<std::string> punctuation_documents() {
  const std::string alphabet = "\",}])['. ";
  std::vector<std::string> docs{""};
  for (size_t begin = 0, len = 1; len <= 5; ++len) {
    const size_t end = docs.size();
    for (size_t i = begin; i < end; ++i)
      for (const char c : alphabet) docs.push_back(docs[i] + c);
    begin = end;
  }
  docs.erase(docs.begin());
  return docs;
}

// Real English: the first 5 KB (cut after a sentence) of every State of the
// Union address and of every Moby Dick chapter that data/prepare.sh fetched.
std::vector<std::string> real_documents() {
  std::vector<std::string> docs;
  for (const char* glob : {"data/cache/npm/datasets-sotu-*/package/data/*.txt",
                           "data/cache/npm/datasets-moby-dick-*/package/data/*.txt"}) {
    std::vector<std::string> files;
    try {
      files = expand_glob(std::string(QATTN_SOURCE_DIR) + "/" + glob);
    } catch (const DataError&) {
      continue;
    }
    for (const auto& f : files) {
      const std::string text = read_file(f);
      const size_t cut = text.find(". ", 5000);
      docs.push_back(text.substr(0, cut == std::string::npos ? cut : cut + 2));
    }
  }
  return docs;
}

// Runs the reference encoder on docs; empty when node or the package is absent.
std::vector<Ids> reference_tokens(const std::vector<std::string>& docs, const std::string& label) {
  const fs::path encoder_js = gpt2_vocab_dir() / "gpt-3-encoder/Encoder.js";
  if (std::system("node --version > /dev/null 2>&1") != 0 || !fs::exists(encoder_js)) {
    WARN("skipped: the reference needs node and " << encoder_js
                                                   << " (data/prepare.sh gpt2-vocab)");
    return {};
  }
  const auto dir = tokenizer_temp_dir("reference_" + label);
  std::string joined;
  for (size_t i = 0; i < docs.size(); ++i) {
    if (i) joined.push_back('\0');
    joined += docs[i];
  }
  write_file(dir / "in.txt", joined);
  const std::string command = "node '" + std::string(QATTN_SOURCE_DIR) +
                              "/tests/unit/test_tokenizer_reference.js' '" + encoder_js.string() +
                              "' '" + (dir / "in.txt").string() + "' > '" + (dir / "out.txt").string() + "'";
  REQUIRE(std::system(command.c_str()) == 0);
  std::istringstream lines(read_file(dir / "out.txt"));
  std::vector<Ids> out;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    Ids ids;
    for (int id; words >> id;) ids.push_back(static_cast<uint16_t>(id));
    out.push_back(ids);
  }
  REQUIRE(out.size() == docs.size());
  return out;
}

std::string escaped(const std::string& s) {
  std::string out;
  for (const unsigned char c : s.substr(0, 200)) {
    if (c >= 0x20 && c < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  return out;
}

std::string joined_ids(const Ids& ids) {
  std::string s;
  for (const auto id : ids) s += std::to_string(id) + " ";
  return s.substr(0, 400);
}

void check_against_reference(const Tokenizer& tok, const std::vector<std::string>& docs,
                             const std::string& label) {
  const auto expected = reference_tokens(docs, label);
  if (expected.empty()) return;
  size_t mismatches = 0, bytes = 0, tokens = 0;
  const auto encoder = tok.make_encoder();  // one merge cache for all documents
  for (size_t i = 0; i < docs.size(); ++i) {
    std::string text = docs[i];
    tok.make_encodable(text);
    Ids ours;
    encoder->encode(text, 0, text.size(), ours);
    bytes += docs[i].size();
    tokens += ours.size();
    if (ours == expected[i]) continue;
    if (++mismatches <= 5)
      FAIL_CHECK(label << " document " << i << " \"" << escaped(docs[i]) << "\"\n  qattn:     "
                       << joined_ids(ours) << "\n  reference: " << joined_ids(expected[i]));
  }
  INFO(label << ": " << docs.size() << " documents, " << bytes << " bytes, " << tokens << " tokens");
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("gpt2: known answers", "[tokenizer][gpt2]") {
  const Tokenizer* tok = gpt2_or_skip();
  if (!tok) return;
  CHECK(tok->vocab_size() == 50257);
  CHECK(tok->eot() == 50256);
  CHECK(tok->encode("Hello world") == Ids{15496, 995});
  CHECK(tok->encode(" Hello world") == Ids{18435, 995});
  CHECK(tok->encode("I'm here, aren't you?") == Ids{40, 1101, 994, 11, 3588, 470, 345, 30});
  CHECK(tok->encode("<|endoftext|>") == Ids{27, 91, 437, 1659, 5239, 91, 29});  // plain text
  CHECK(tok->encode("  \n\n") == Ids{220, 220, 628});
  CHECK(tok->encode("\xC4\x85\xC4\x87\xC4\x99 \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80") ==
        Ids{128, 227, 38325, 128, 247, 220, 19526, 254, 25001, 121, 30325, 222});
  CHECK(tok->encode("2024-05-20") == Ids{1238, 1731, 12, 2713, 12, 1238});
  CHECK(tok->encode("").empty());
  const Ids eot{50256};
  CHECK(tok->decode(eot) == "<|endoftext|>");
  const Ids outside{50257};
  CHECK_THROWS_WITH(tok->decode(outside), Catch::Contains("token 50257 is outside the vocab"));
}

TEST_CASE("gpt2: decode(encode(text)) is the text, invalid UTF-8 repaired", "[tokenizer][gpt2]") {
  const Tokenizer* tok = gpt2_or_skip();
  if (!tok) return;
  for (auto docs : {adversarial_documents(), random_documents(500)}) {
    for (const std::string& doc : docs) {
      std::string repaired = doc;
      repair_utf8(repaired);
      INFO("\"" << escaped(doc) << "\"");
      CHECK(tok->decode(tok->encode(doc)) == repaired);
    }
  }
}

TEST_CASE("gpt2: encoding in pieces cut at boundaries equals encoding whole", "[tokenizer][gpt2]") {
  const Tokenizer* tok = gpt2_or_skip();
  if (!tok) return;
  std::string text;
  for (const auto& d : adversarial_documents()) text += d + "\n";
  for (const auto& d : random_documents(300)) text += d + (d.size() % 3 ? "\n" : "\n\n ");
  repair_utf8(text);
  const Ids whole = tok->encode(text);
  auto encoder = tok->make_encoder();
  Ids pieces;
  size_t begin = 0, cuts = 0;
  for (size_t p = 1; p <= text.size(); ++p) {
    if (p < text.size() && !tok->is_boundary(text, p)) continue;
    encoder->encode(text, begin, p, pieces);
    begin = p;
    ++cuts;
  }
  CHECK(cuts > 100);
  CHECK(pieces == whole);
  // What is not a boundary: inside a whitespace run, or before a space.
  CHECK_FALSE(tok->is_boundary("a \n\nb", 3));
  CHECK_FALSE(tok->is_boundary("a\n b", 2));
  CHECK(tok->is_boundary("a\n\nb", 3));
}

TEST_CASE("gpt2: tokenize_corpus in parallel equals the sequential encoding", "[tokenizer][gpt2]") {
  const Tokenizer* tok = gpt2_or_skip();
  if (!tok) return;
  const auto dir = tokenizer_temp_dir("gpt2_corpus");
  std::string doc;  // > 2 MB so that it is cut into several pieces
  for (int i = 0; doc.size() < (5u << 19); ++i)
    for (const auto& d : adversarial_documents()) doc += d + (i % 2 ? "\n" : "\n\n");
  write_file(dir / "a.txt", "first document");
  write_file(dir / "b.txt", doc);
  CorpusOptions o;
  o.files = {(dir / "a.txt").string(), (dir / "b.txt").string()};
  o.name = "g";
  o.val_docs = 1;
  Ids expected{50256};
  const Ids body = tok->encode(doc);
  expected.insert(expected.end(), body.begin(), body.end());
  for (const int threads : {1, 2, 4}) {
    o.threads = threads;
    o.out_dir = (dir / ("out" + std::to_string(threads))).string();
    const CorpusStats s = tokenize_corpus(*tok, o);
    REQUIRE(s.shards.size() == 2);
    CHECK(read_shard(s.shards[0]) == Ids{50256, 11085, 3188});
    CHECK(read_shard(s.shards[1]) == expected);
    CHECK(s.utf8_replacements > 0);
  }
}

TEST_CASE("gpt2: bad vocab files give clear errors", "[tokenizer][gpt2]") {
  const auto dir = tokenizer_temp_dir("bad_vocab");
  CHECK_THROWS_WITH(make_gpt2_tokenizer((dir / "nowhere").string()),
                    Catch::Contains("is not a directory") && Catch::Contains("gpt2-vocab"));
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()),
                    Catch::Contains("cannot read") && Catch::Contains("encoder.json"));
  write_file(dir / "encoder.json", "{\"a\": 0,");
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()), Catch::Contains("encoder.json: not valid JSON"));
  write_file(dir / "encoder.json", "{\"<|endoftext|>\": 0, \"a\": 1}");
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()), Catch::Contains("has no token for byte 0"));
  write_file(dir / "encoder.json", "{\"<|endoftext|>\": 0, \"a\": 7}");
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()), Catch::Contains("\"a\" has id 7"));
  if (!have_gpt2_vocab()) return;
  fs::copy_file(gpt2_vocab_dir() / "encoder.json", dir / "encoder.json",
                fs::copy_options::overwrite_existing);
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()),
                    Catch::Contains("cannot read") && Catch::Contains("vocab.bpe"));
  write_file(dir / "vocab.bpe", "#version: 0.2\n\xC4\xA0 t\nnot a merge\n");
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()),
                    Catch::Contains("vocab.bpe:3: \"not a merge\" is not a merge"));
  write_file(dir / "vocab.bpe", "#version: 0.2\n\xC4\xA0 t\nzzzq t\n");
  CHECK_THROWS_WITH(make_gpt2_tokenizer(dir.string()),
                    Catch::Contains("vocab.bpe:3: \"zzzq\" is not a token"));
}

TEST_CASE("gpt2: equals the reference encoder on adversarial text", "[tokenizer][gpt2][reference]") {
  const Tokenizer* tok = gpt2_or_skip();
  if (!tok) return;
  check_against_reference(*tok, adversarial_documents(), "adversarial");
  check_against_reference(*tok, random_documents(3000), "random");
  check_against_reference(*tok, punctuation_documents(), "punctuation");
}

TEST_CASE("gpt2: equals the reference encoder on real English (>= 1 MB)", "[tokenizer][gpt2][reference]") {
  const Tokenizer* tok = gpt2_or_skip();
  if (!tok) return;
  const auto docs = real_documents();
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  if (bytes < (1u << 20)) {
    WARN("skipped: " << bytes << " bytes of State of the Union / Moby Dick text under "
                     << QATTN_SOURCE_DIR << "/data/cache/npm (run data/prepare.sh quickstart)");
    return;
  }
  check_against_reference(*tok, docs, "real");
}

TEST_CASE("qattn tokenize | detokenize round-trips (gpt2)", "[tokenizer][gpt2][cli]") {
  if (!gpt2_or_skip()) return;
  const auto dir = tokenizer_temp_dir("cli_gpt2");
  const auto docs = adversarial_documents();
  std::string a, b;
  for (size_t i = 0; i < docs.size(); ++i) (i % 2 ? a : b) += docs[i] + "\n";
  write_file(dir / "a.txt", a);
  write_file(dir / "b.txt", b);
  repair_utf8(a);
  repair_utf8(b);
  CHECK(cli_round_trip("gpt2", {dir / "a.txt", dir / "b.txt"}, dir) ==
        "<|endoftext|>" + a + "<|endoftext|>" + b);
}
