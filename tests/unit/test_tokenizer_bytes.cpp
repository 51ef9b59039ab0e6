// The byte tokenizer, and the corpus pipeline (shards, splits, determinism,
// bad input) exercised through it.
#include <catch2/catch.hpp>

#include <cstring>

#include "qattn/data.hpp"
#include "qattn/tokenizer.hpp"
#include "test_tokenizer_util.hpp"

using namespace qattn;
using namespace qattn::test;

TEST_CASE("byte tokenizer: known answers and round trip", "[tokenizer][bytes]") {
  const auto tok = make_byte_tokenizer();
  CHECK(tok->vocab_size() == 257);
  CHECK(tok->eot() == 256);
  CHECK(tok->encode("Hi!\n") == std::vector<uint16_t>{72, 105, 33, 10});
  CHECK(tok->encode("\xC3\xA9\xFF") == std::vector<uint16_t>{0xC3, 0xA9, 0xFF});  // bytes, even invalid UTF-8
  CHECK(tok->encode("").empty());
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const auto ids = tok->encode(all);
  CHECK(tok->decode(ids) == all);
  const std::vector<uint16_t> with_eot{104, 256, 105};
  CHECK(tok->decode(with_eot) == "h<|endoftext|>i");
  const std::vector<uint16_t> outside{257};
  CHECK_THROWS_WITH(tok->decode(outside), Catch::Contains("token 257 is outside"));
}

TEST_CASE("make_tokenizer names the allowed kinds", "[tokenizer]") {
  CHECK_THROWS_WITH(make_tokenizer("bpe", ""), Catch::Contains("allowed: bytes, gpt2"));
}

namespace {

// Three documents (the second file holds two, cut by the separator).
CorpusOptions three_documents(const fs::path& dir) {
  write_file(dir / "a.txt", "first");
  write_file(dir / "b.txt", "second|third|");  // the trailing empty document is skipped
  CorpusOptions o;
  o.files = {(dir / "a.txt").string(), (dir / "b.txt").string()};
  o.out_dir = (dir / "out").string();
  o.name = "t";
  o.doc_separator = "|";
  return o;
}

std::vector<uint16_t> with_eots(const std::vector<std::string>& docs) {
  std::vector<uint16_t> tokens;
  for (const auto& d : docs) {
    tokens.push_back(256);
    for (const char c : d) tokens.push_back(static_cast<unsigned char>(c));
  }
  return tokens;
}

}  // namespace

TEST_CASE("tokenize_corpus: val shard first, EOT before every document", "[tokenizer][corpus]") {
  const auto dir = tokenizer_temp_dir("corpus");
  auto o = three_documents(dir);
  o.val_docs = 1;
  const auto tok = make_byte_tokenizer();
  const CorpusStats s = tokenize_corpus(*tok, o);
  CHECK(s.documents == 3);
  CHECK(s.val_documents == 1);
  REQUIRE(s.shards.size() == 2);
  CHECK(fs::path(s.shards[0]).filename() == "t_val_000000.bin");
  CHECK(fs::path(s.shards[1]).filename() == "t_train_000001.bin");
  CHECK(read_shard(s.shards[0]) == with_eots({"first"}));
  CHECK(read_shard(s.shards[1]) == with_eots({"second", "third"}));
  CHECK(s.val_tokens == 6);
  CHECK(s.train_tokens == 13);
  // Round trip: the shards decode to the documents behind their EOTs.
  CHECK(tok->decode(read_shard(s.shards[1])) == "<|endoftext|>second<|endoftext|>third");
  // The header is llm.c's: magic, version, count.
  const std::string raw = read_file(s.shards[1]);
  int32_t header[3];
  std::memcpy(header, raw.data(), sizeof header);
  CHECK(header[0] == 20240520);
  CHECK(header[1] == 1);
  CHECK(header[2] == 13);
  CHECK(raw.size() == 1024 + 2 * 13);
}

TEST_CASE("tokenize_corpus: shard size, val fraction, stale shards", "[tokenizer][corpus]") {
  const auto dir = tokenizer_temp_dir("shards");
  auto o = three_documents(dir);
  o.val_fraction = 0.2;  // "first" starts at byte 0 of 18: val; "second" at byte 5 >= 3.6: train
  o.shard_tokens = 5;
  fs::create_directories(o.out_dir);
  write_file(fs::path(o.out_dir) / "t_train_000009.bin", "stale");
  write_file(fs::path(o.out_dir) / "other_train_000009.bin", "kept");
  const CorpusStats s = tokenize_corpus(*make_byte_tokenizer(), o);
  CHECK(s.val_documents == 1);
  std::vector<std::string> names;
  for (const auto& p : s.shards) names.push_back(fs::path(p).filename().string());
  CHECK(names == std::vector<std::string>{"t_val_000000.bin", "t_val_000001.bin", "t_train_000002.bin",
                                          "t_train_000003.bin", "t_train_000004.bin"});
  CHECK(read_shard(s.shards[1]).size() == 1);  // "first" + EOT = 6 tokens: 5 + 1
  CHECK(!fs::exists(fs::path(o.out_dir) / "t_train_000009.bin"));
  CHECK(fs::exists(fs::path(o.out_dir) / "other_train_000009.bin"));
}

TEST_CASE("tokenize_corpus: the shards do not depend on the thread count", "[tokenizer][corpus]") {
  const auto dir = tokenizer_temp_dir("threads");
  std::string big;
  for (int i = 0; big.size() < 3u << 20; ++i) big += "line " + std::to_string(i * 7919 % 1000) + "\n";
  write_file(dir / "big.txt", big);
  CorpusOptions o;
  o.files = {(dir / "big.txt").string(), (dir / "big.txt").string()};
  o.name = "t";
  o.val_docs = 1;
  std::vector<std::vector<uint16_t>> train;
  for (const int threads : {1, 3}) {
    o.threads = threads;
    o.out_dir = (dir / ("out" + std::to_string(threads))).string();
    const CorpusStats s = tokenize_corpus(*make_byte_tokenizer(), o);
    REQUIRE(s.shards.size() == 2);
    train.push_back(read_shard(s.shards[1]));
  }
  CHECK(train[0].size() == big.size() + 1);
  CHECK(train[0] == train[1]);
}

TEST_CASE("tokenize_corpus: bad input names what is wrong", "[tokenizer][corpus]") {
  const auto dir = tokenizer_temp_dir("bad");
  const auto tok = make_byte_tokenizer();
  auto o = three_documents(dir);
  o.files.push_back((dir / "missing.txt").string());
  CHECK_THROWS_WITH(tokenize_corpus(*tok, o), Catch::Contains("missing.txt does not exist"));
  o = three_documents(dir);
  o.val_fraction = 1.5;
  CHECK_THROWS_WITH(tokenize_corpus(*tok, o), Catch::Contains("--val-fraction 1.5"));
  o = three_documents(dir);
  o.shard_tokens = 0;
  CHECK_THROWS_WITH(tokenize_corpus(*tok, o), Catch::Contains("--shard-tokens 0"));
  o = three_documents(dir);
  o.val_docs = 3;
  CHECK_THROWS_WITH(tokenize_corpus(*tok, o), Catch::Contains("validation split"));
  o = three_documents(dir);
  o.files = {(dir / "a.txt").string()};
  o.doc_separator.clear();
  CHECK_THROWS_WITH(tokenize_corpus(*tok, o), Catch::Contains("all 1 documents went to the validation"));
}

TEST_CASE("qattn tokenize | detokenize round-trips (bytes)", "[tokenizer][bytes][cli]") {
  const auto dir = tokenizer_temp_dir("cli_bytes");
  const std::string a = "caf\xC3\xA9\n\n", b = std::string("\0\xFF\x80 binary", 10);
  write_file(dir / "a.txt", a);
  write_file(dir / "b.txt", b);
  CHECK(cli_round_trip("bytes", {dir / "a.txt", dir / "b.txt"}, dir) ==
        "<|endoftext|>" + a + "<|endoftext|>" + b);
}
