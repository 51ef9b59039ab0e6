// Bad input through the command line as a user gives it: every answer names
// the file, key or argument and what is allowed, carries no raw library or OS
// exception text, exits with a documented code, and leaves nothing behind.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include "qattn/checkpoint.hpp"
#include "run_helpers.hpp"

using namespace qattn::test;
using nlohmann::json;

namespace {

// A tiny corpus and config in d: d/cfg.json trains 4 steps into d/runs/tiny.
fs::path tiny_setup(const fs::path& d) {
  make_corpus(d);
  return write_json(d / "cfg.json", tiny_config(d, "tiny", 4));
}

void check_clean(const Outcome& r) {
  INFO(r.output);
  CHECK(raw_library_text(r.output).empty());
}

}  // namespace

TEST_CASE(
    "export to an existing folder or a missing one fails with the reason and leaves no temporary",
    "[cli][errors]") {
  const auto d = scratch_dir("cli_export");
  const auto cfg = tiny_setup(d);
  REQUIRE(exit_code(run_qattn({"train", cfg.string()}, {}, d / "train.log")) == 0);
  const std::string run = (d / "runs" / "tiny").string();
  fs::create_directories(d / "out" / "taken");
  const auto before = listing(d / "out");

  auto r = qattn_outcome({"export", "--checkpoint", run, "--out", (d / "out" / "taken").string()},
                         d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("taken: is a directory"));
  check_clean(r);
  CHECK(listing(d / "out") == before);

  r = qattn_outcome({"export", "--checkpoint", run, "--out", (d / "out" / "no" / "m.bin").string()},
                    d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("m.bin: cannot create a file in") &&
                           Catch::Contains("No such file or directory"));
  check_clean(r);
  CHECK(listing(d / "out") == before);

  // A run whose newest checkpoint is damaged: export and sample take the one
  // before it and say which they passed over and why; with none left, the error says why.
  const std::string two = (d / "two").string();
  REQUIRE(exit_code(
              run_qattn({"train", cfg.string(), "--out", two, "--set", "train.checkpoint_every=2"},
                        {}, d / "train.log")) == 0);
  fs::resize_file(fs::path(two) / "checkpoints" / "step_00000004" / "params.bin", 100);
  const std::string damaged = two + "/checkpoints/step_00000004: params.bin holds 100 bytes";
  r = qattn_outcome({"export", "--checkpoint", two, "--out", (d / "out" / "m.bin").string()},
                    d / "log");
  CHECK(r.code == 0);
  CHECK_THAT(r.output,
             Catch::Contains("passed over invalid checkpoint " + damaged + "; the manifest says") &&
                 Catch::Contains("using " + two + "/checkpoints/step_00000002"));
  r = qattn_outcome({"sample", "--checkpoint", two, "--tokens", "2"}, d / "log");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("passed over invalid checkpoint " + damaged));
  fs::resize_file(fs::path(two) / "checkpoints" / "step_00000002" / "params.bin", 100);
  r = qattn_outcome({"sample", "--checkpoint", two, "--tokens", "2"}, d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains(two + ": the run has no valid checkpoint") &&
                           Catch::Contains("passed over " + damaged) &&
                           Catch::Contains("step_00000002: params.bin holds 100 bytes"));
}

TEST_CASE("a directory as config, 1e400 and duplicate keys are refused naming the file and key",
          "[cli][errors]") {
  const auto d = scratch_dir("cli_config");
  const auto cfg = tiny_setup(d);

  auto r = qattn_outcome({"validate", d.string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains(d.string() + ": is a directory"));
  check_clean(r);

  r = qattn_outcome({"validate", cfg.string(), "--set", "train.lr=1e400"}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("--set train.lr=1e400: 1e400 is out of range"));
  check_clean(r);

  std::string text = read_text(cfg);
  const auto lr = text.find("\"lr\": 0.01");
  REQUIRE(lr != std::string::npos);
  std::ofstream(d / "big.json") << text.substr(0, lr) + "\"lr\": 1e400" + text.substr(lr + 10);
  r = qattn_outcome({"validate", (d / "big.json").string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("big.json: train.lr: 1e400 is out of range"));
  check_clean(r);

  // The library keeps the last of two equal keys; qattn refuses both, naming the key.
  std::ofstream(d / "twice.json") << text.substr(0, lr) + "\"lr\": 0.5, " + text.substr(lr);
  r = qattn_outcome({"validate", (d / "twice.json").string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("twice.json: train.lr: given twice"));
  check_clean(r);
  std::ofstream(d / "sweep.json") << R"({"name": "s", "base": "cfg.json", "name": "t"})";
  r = qattn_outcome({"sweep", (d / "sweep.json").string(), "--dry-run"}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("sweep.json: name: given twice"));
  // Other subcommands that read a config answer the same way.
  r = qattn_outcome({"probe", "causality", (d / "twice.json").string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("twice.json: invalid config") &&
                           Catch::Contains("train.lr: given twice"));
  r = qattn_outcome({"bench", "attention", "--shape", "1,2,64,64", "--set", "attention.kind=bogus"},
                    d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("attention.kind: \"bogus\" is not allowed"));
}

TEST_CASE(
    "validate checks the data as train does: globs, directories, unreadable shards, token ids",
    "[cli][errors]") {
  const auto d = scratch_dir("cli_data");
  const auto cfg = tiny_setup(d);
  const std::string train_glob = (d / "s_train_*").string();
  const auto outcome = [&](const std::string& set) {
    return qattn_outcome({"validate", cfg.string(), "--set", set}, d / "log");
  };
  CHECK(qattn_outcome({"validate", cfg.string()}, d / "log").code == 0);

  // A glob that matches nothing: validate says so (train would, before step 0).
  auto r = outcome("data.val=" + (d / "nothing_*.bin").string());
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("data.val") && Catch::Contains("no shard matches"));
  check_clean(r);

  fs::create_directories(d / "s_train_dir");
  r = outcome("data.train=" + train_glob);
  CHECK(r.code == 2);
  CHECK_THAT(r.output,
             Catch::Contains("data.train") && Catch::Contains("s_train_dir: is a directory"));
  check_clean(r);
  fs::remove(d / "s_train_dir");

  fs::create_symlink(d / "gone.bin",
                     d / "s_train_000002.bin");  // matched by the glob, opens with ENOENT
  r = outcome("data.train=" + train_glob);
  CHECK(r.code == 2);
  CHECK_THAT(r.output,
             Catch::Contains("s_train_000002.bin: cannot open: No such file or directory"));
  check_clean(r);
  fs::remove(d / "s_train_000002.bin");

  // The second shard of a glob holds a token id beyond model.vocab: that shard is named.
  const std::vector<uint16_t> bad = {1, 2, 300, 4};
  qattn::write_shard((d / "s_train_000002.bin").string(), bad.data(), bad.size());
  r = outcome("data.train=" + train_glob);
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("shard " + (d / "s_train_000002.bin").string() +
                                       " holds token id 300") &&
                           Catch::Contains("model.vocab = 257"));
  check_clean(r);

  // train refuses the same data before it writes anything.
  r = qattn_outcome({"train", cfg.string()}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("s_train_000002.bin holds token id 300"));
  CHECK(!fs::exists(d / "runs" / "tiny"));
}

TEST_CASE("eval.batches beyond the val split is refused before step 0, not read twice",
          "[cli][errors]") {
  // The val shard's 3,000 tokens are 187 windows of 16 + 1 tokens: 46 batches
  // of 4. A 47th batch started the split over, and the first batches counted
  // twice in the val loss.
  const auto d = scratch_dir("cli_eval_batches");
  const auto cfg = tiny_setup(d);
  const std::string refused =
      "eval.batches: 47 is more than data.val = \"" + (d / "s_val_*.bin").string() +
      "\" holds (3000 tokens: 46 batches of micro_batch = 4 sequences of 16+1 tokens); a "
      "batch read twice would count twice in the val loss; allowed: at most 46";
  for (const std::string command : {"validate", "train"}) {
    const auto r = qattn_outcome({command, cfg.string(), "--set", "eval.batches=47"}, d / "log");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains(refused));
    check_clean(r);
  }
  CHECK_FALSE(fs::exists(d / "runs" / "tiny"));
  std::ofstream(d / "sweep.json")
      << R"({"name": "s", "base": "cfg.json", "grid": {"eval.batches": [46, 47]}})";
  auto r = qattn_outcome({"sweep", (d / "sweep.json").string(), "--dry-run"}, d / "log");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("run batches=47: " + refused));
  CHECK_THAT(r.output, !Catch::Contains("run batches=46"));
  CHECK(qattn_outcome({"validate", cfg.string(), "--set", "eval.batches=46"}, d / "log").code == 0);
}

TEST_CASE("sample draws only ids its tokenizer can decode from a model with a larger vocab",
          "[cli][errors]") {
  // A model of vocab 1000 sampled with the byte tokenizer (257 ids): nearly
  // every draw at temperature 100 over all ids was one of ids 257..999, and
  // sample stopped with "token N is outside its vocab" after part of the text.
  const auto d = scratch_dir("cli_sample_vocab");
  const auto cfg = tiny_setup(d);
  REQUIRE(exit_code(run_qattn({"train", cfg.string(), "--set", "model.vocab=1000"}, {},
                              d / "train.log")) == 0);
  const std::string run = (d / "runs" / "tiny").string();
  const std::vector<std::string> args = {"sample", "--checkpoint", run,   "--tokenizer",
                                         "bytes",  "--tokens",     "200", "--temperature",
                                         "100",    "--top-k",      "0"};
  auto r = qattn_outcome(args, d / "log");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, !Catch::Contains("outside its vocab"));
  auto with_ids = args;
  with_ids.push_back("--ids");
  r = qattn_outcome(with_ids, d / "log");
  REQUIRE(r.code == 0);
  std::istringstream ids(r.output);
  int count = 0, largest = -1;
  for (int id; ids >> id; ++count) largest = std::max(largest, id);
  CHECK(count == 200);
  CHECK(largest <= 256);
  CHECK(largest > 127);  // the draws reach across the byte tokenizer's ids, not only a few
}

TEST_CASE(
    "options refuse nan, inf, out-of-range numbers, empty paths and unknown subcommands with what "
    "is allowed",
    "[cli][errors]") {
  const auto d = scratch_dir("cli_numbers");
  const auto cfg = tiny_setup(d);
  struct Case {
    std::vector<std::string> args;
    std::string allowed;
  };
  const std::vector<Case> cases = {
      {{"sample", "--checkpoint", d.string(), "--temperature", "nan"}, "a number >= 0 and <= 100"},
      {{"sample", "--checkpoint", d.string(), "--temperature", "inf"}, "a number >= 0 and <= 100"},
      {{"sample", "--checkpoint", d.string(), "--tokens", "0"}, "an integer from 1 to 1048576"},
      {{"sample", "--checkpoint", d.string(), "--top-k", "1e9"}, "an integer from 0 to 65536"},
      {{"sample", "--checkpoint", d.string(), "--seed", "-1"}, "an integer from 0 to"},
      {{"train", cfg.string(), "--nproc", "0"}, "an integer from 1 to 64"},
      {{"validate", cfg.string(), "--nproc", "2.5"}, "an integer from 1 to 64"},
      {{"sweep", cfg.string(), "--jobs", "0"}, "an integer from 1 to 1024"},
      {{"tokenize", "--tokenizer", "bytes", "--out", d.string(), "--val-fraction", "nan"},
       "a number >= 0 and < 1"},
      {{"tokenize", "--tokenizer", "bytes", "--out", d.string(), "--val-fraction", "1"},
       "a number >= 0 and < 1"},
      {{"tokenize", "--tokenizer", "bytes", "--out", d.string(), "--shard-tokens", "-5"},
       "an integer from 1 to"},
      {{"tokenize", "--tokenizer", "bytes", "--out", d.string(), "--threads", "x"},
       "an integer from 0 to 1024"},
      {{"probe", "causality", cfg.string(), "--sigma", "nan"}, "a number >= 0.001 and <= 1000"},
      {{"bench", "attention", "--shape", "1,1,64,64", "--reps", "0"}, "an integer from 1 to 10000"},
      {{"validate", ""}, "a file or directory path (not empty)"},
      {{"train", cfg.string(), "--out", ""}, "a file or directory path (not empty)"},
      {{"export", "--checkpoint", d.string(), "--out", ""}, "a file or directory path (not empty)"},
      {{"sample", "--checkpoint", ""}, "a file or directory path (not empty)"},
      {{"tokenize", "--tokenizer", "bytes", "", "--out", d.string()},
       "a file or directory path (not empty)"},
      {{"detokenize", "--tokenizer", "bytes", "--ids", "1", "--out", ""},
       "a file or directory path (not empty)"},
      {{"trian", cfg.string()},
       "train, validate, info, probe, bench, tokenize, detokenize, sweep, sample, export"},
      {{"bench", "attn"}, "attention"},
  };
  for (const auto& c : cases) {
    const auto r = qattn_outcome(c.args, d / "log");
    INFO(fmt::format("{}\n{}", fmt::join(c.args, " "), r.output));
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains("allowed: " + c.allowed));
    CHECK(r.output.size() < 400);  // no bound of 300 digits
    CHECK(raw_library_text(r.output).empty());
  }
}

namespace {

// A GPT-2 vocab of the 256 byte tokens, one merge ("t" "h") and end-of-text,
// spelled with GPT-2's printable byte alphabet: enough to run the gpt2
// tokenizer without data/cache/gpt2.
fs::path tiny_gpt2_vocab(const fs::path& dir) {
  fs::create_directories(dir);
  const auto utf8 = [](int cp) {
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
  };
  json encoder = json::object();
  int extra = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable =
        (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    encoder[utf8(printable ? b : 0x100 + extra++)] = b;
  }
  encoder["th"] = 256;
  encoder["<|endoftext|>"] = 257;
  std::ofstream(dir / "encoder.json") << encoder.dump();
  std::ofstream(dir / "vocab.bpe") << "#version: 0.2\nt h\n";
  return dir;
}

}  // namespace

TEST_CASE(
    "tokenize that fails leaves the output folder as it was; gpt2 counts or refuses invalid UTF-8",
    "[cli][errors][tokenizer]") {
  const auto d = scratch_dir("cli_tokenize");
  std::ofstream(d / "one.txt") << "a single document";
  // One file: every document goes to the validation split, an error; no _val_ shard stays.
  auto r = qattn_outcome(
      {"tokenize", "--tokenizer", "bytes", (d / "one.txt").string(), "--out", (d / "new").string()},
      d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("all 1 documents went to the validation split"));
  CHECK(!fs::exists(d / "new"));
  fs::create_directories(d / "old");
  std::ofstream(d / "old" / "old_val_000000.bin") << "earlier shards";
  const auto before = listing(d / "old");
  r = qattn_outcome(
      {"tokenize", "--tokenizer", "bytes", (d / "one.txt").string(), "--out", (d / "old").string()},
      d / "log");
  CHECK(r.code == 1);
  CHECK(listing(d / "old") == before);
  check_clean(r);
  // detokenize decodes everything before it writes --out: an id beyond the
  // vocab leaves an existing file as it was (it was truncated) and makes no new one.
  std::ofstream(d / "kept.txt") << "earlier text";
  for (const auto& out : {d / "kept.txt", d / "new.txt"}) {
    r = qattn_outcome(
        {"detokenize", "--tokenizer", "bytes", "--ids", "72 300", "--out", out.string()},
        d / "log");
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains(
                             "detokenize: --ids: bytes tokenizer: token 300 is outside its vocab"));
    check_clean(r);
  }
  CHECK(read_text(d / "kept.txt") == "earlier text");
  CHECK_FALSE(fs::exists(d / "new.txt"));
  // An --ids list of separators only printed nothing and exited 0.
  for (const char* ids : {" ", ",", " , "}) {
    r = qattn_outcome({"detokenize", "--tokenizer", "bytes", "--ids", ids}, d / "log");
    INFO("--ids '" << ids << "': " << r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output,
               Catch::Contains(
                   "' holds no token id; allowed: ids 0..65535 separated by spaces or commas"));
    check_clean(r);
  }
  REQUIRE(qattn_outcome({"detokenize", "--tokenizer", "bytes", "--ids", "72,105", "--out",
                         (d / "kept.txt").string()},
                        d / "log")
              .code == 0);
  CHECK(read_text(d / "kept.txt") == "Hi");

  const fs::path vocab = tiny_gpt2_vocab(d / "vocab");
  std::ofstream(d / "bad.txt", std::ios::binary)
      << "then \xC3( and \xE2\x82 the end";  // 1 + 2 invalid bytes
  std::ofstream(d / "good.txt") << "the second document";
  const std::vector<std::string> gpt2 = {"tokenize",
                                         "--tokenizer",
                                         "gpt2",
                                         "--vocab",
                                         vocab.string(),
                                         (d / "bad.txt").string(),
                                         (d / "good.txt").string()};
  auto args = gpt2;
  args.insert(args.end(), {"--out", (d / "strict").string(), "--strict"});
  r = qattn_outcome(args, d / "log");
  CHECK(r.code == 1);
  CHECK_THAT(r.output,
             Catch::Contains(
                 "bad.txt at byte 5: invalid UTF-8 (2 invalid sequences, 3 bytes in this file)"));
  CHECK(!fs::exists(d / "strict"));
  check_clean(r);
  args = gpt2;
  args.insert(args.end(), {"--out", (d / "lenient").string()});
  r = qattn_outcome(args, d / "log");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains(
                           "replaced 2 invalid UTF-8 sequences (3 bytes) by U+FFFD in 1 of 2 files "
                           "(the first: " +
                           (d / "bad.txt").string() + " at byte 5)"));
  CHECK(listing(d / "lenient") ==
        std::vector<std::string>{"lenient_train_000001.bin", "lenient_val_000000.bin"});
}

TEST_CASE("tokenize --files-from names a list that is a directory or cannot be read",
          "[cli][errors][tokenizer]") {
  // A directory opened as the list read as no paths: with input files beside
  // it the corpus silently lacked every file it was meant to list.
  const auto d = scratch_dir("cli_files_from");
  std::ofstream(d / "one.txt") << "the first document";
  std::ofstream(d / "two.txt") << "the second document";
  fs::create_directories(d / "lists");
  const auto tokenize = [&](const std::string& list) {
    return qattn_outcome(
        {"tokenize", "--tokenizer", "bytes", (d / "one.txt").string(), (d / "two.txt").string(),
         "--files-from", list, "--out", (d / "out").string()},
        d / "log");
  };
  auto r = tokenize((d / "lists").string());
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains(
                           "--files-from " + (d / "lists").string() +
                           ": is a directory; allowed: a "
                           "file that lists the input paths, one per line, or - (standard input)"));
  CHECK_FALSE(fs::exists(d / "out"));
  r = tokenize((d / "none.txt").string());
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("cannot read --files-from " + (d / "none.txt").string() +
                                       ": No such file or directory"));
  check_clean(r);
}

TEST_CASE(
    "train into a run directory that cannot be created or written names the path and starts "
    "nothing",
    "[cli][errors]") {
  const auto d = scratch_dir("cli_train_out");
  const auto cfg = tiny_setup(d);
  const auto log = d.parent_path() / ("qattn_cli_train_out_" + std::to_string(::getpid()) + ".log");
  const auto train = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"train", cfg.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return qattn_outcome(argv, log);
  };
  // Root ignores permission bits, so what refuses the writes here is a regular
  // file where a folder must be (ENOTDIR) or a folder where a file must be (EISDIR).
  SECTION("a parent of the run directory is a regular file: nothing is created") {
    std::ofstream(d / "plain") << "a regular file";
    const auto before = listing(d);
    const std::string plain = (d / "plain").string();
    for (const auto& [args, named] : std::vector<std::pair<std::vector<std::string>, std::string>>{
             {{"--out", plain + "/run"}, plain + "/run: Not a directory"},
             {{"--out", plain}, plain + ": Not a directory"},
             {{"--set", "log.out=" + plain}, plain + "/tiny: Not a directory"}}) {
      const auto r = train(args);
      INFO(fmt::format("{}\n{}", fmt::join(args, " "), r.output));
      CHECK(r.code == 1);
      CHECK_THAT(r.output, Catch::Contains("cannot create the run directory " + named));
      check_clean(r);
      CHECK(listing(d) == before);
    }
  }
  SECTION("a file the run writes is a directory: the error names it, the run never starts") {
    const fs::path run = d / "runs" / "tiny";
    for (const char* file : {"config.json", "events.log", "metrics.csv"}) {
      fs::remove_all(run);
      fs::create_directories(run / file / "inside");
      const auto r = train({});
      INFO(fmt::format("{}\n{}", file, r.output));
      CHECK(r.code == 1);
      CHECK_THAT(r.output,
                 Catch::Contains((run / file).string() + ": ") && Catch::Contains("s a directory"));
      check_clean(r);
      CHECK(fs::is_directory(run / file / "inside"));
      CHECK_FALSE(fs::exists(run / "status.json"));
      CHECK_FALSE(fs::exists(run / "checkpoints"));
    }
  }
}
