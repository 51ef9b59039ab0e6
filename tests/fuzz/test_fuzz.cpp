// The fuzz suite: bad configs, sweeps, shards, checkpoints and command-line
// numbers, made from the real ones by a fixed-seed random mutator, through the
// qattn binary as a user would run it. For every command it asserts that
//   - the exit code is a documented one (0 done, 1 error, 2 bad input),
//   - the output holds no raw library or OS exception text, and a refusal
//     names the file, key or argument,
//   - a failed command leaves nothing in its output folders (nor in its
//     working directory),
//   - a refusal comes within seconds (a bound far above any refusal's work,
//     so that a command that trains or hangs instead of refusing is caught).
// QATTN_FUZZ_SEED=N runs another seed than the fixed one CI runs.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fmt/format.h>
#include <random>
#include <tuple>

#include "qattn/json_file.hpp"
#include "run_helpers.hpp"

using namespace qattn::test;
using nlohmann::json;

namespace {

constexpr uint64_t kSeed = 20241202;  // CI's seed
constexpr double kRefusalSeconds = 10;

uint64_t fuzz_seed() {
  const char* s = std::getenv("QATTN_FUZZ_SEED");
  return s ? std::strtoull(s, nullptr, 10) : kSeed;
}

struct Run {
  int code;
  std::string output;
  double seconds;
};

// Runs `qattn ARGS...` in `cwd`, output to a log; killed after 120 s.
Run run_in(const fs::path& cwd, const std::vector<std::string>& args) {
  const fs::path log = cwd.parent_path() / "fuzz_log.txt";
  const auto start = std::chrono::steady_clock::now();
  fs::remove(log);
  const pid_t pid = spawn_qattn(args, {}, log, cwd);
  int status = 0;
  for (int i = 0; i < 12000 && ::waitpid(pid, &status, WNOHANG) == 0; ++i) ::usleep(10000);
  if (::waitpid(pid, &status, WNOHANG) == 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log), seconds};
}

// The checks every command gets; `names` is what a refusal must mention.
void check_run(const Run& r, const std::string& what, std::initializer_list<int> allowed,
               const std::vector<std::string>& names) {
  INFO(what << "\nexit " << r.code << " after " << r.seconds << " s:\n" << r.output);
  CHECK(std::find(allowed.begin(), allowed.end(), r.code) != allowed.end());
  CHECK(raw_library_text(r.output).empty());
  if (r.code != 0) {
    CHECK(r.seconds < kRefusalSeconds);
    bool named = false;
    for (const auto& n : names) named = named || r.output.find(n) != std::string::npos;
    CHECK(named);
  }
}

// ---------------------------------------------------------------------------
// A JSON mutator: structural edits on the parsed document, and edits of its
// text for what no document can hold (broken syntax, a key twice, 1e400).

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t pick(size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }
  template <class T>
  const T& pick(const std::vector<T>& v) { return v[pick(v.size())]; }

  // The text of a mutation of j, and what was done.
  std::pair<std::string, std::string> mutate(const json& j) {
    json m = j;
    std::vector<json::json_pointer> members = leaves_and_members(m);
    const json::json_pointer at = pick(members);
    switch (pick(7)) {
      case 0:  // delete a key
        if (!at.empty()) m[at.parent_pointer()].erase(at.back());
        return {m.dump(2), "delete " + at.to_string()};
      case 1: {  // another type
        m[at] = pick(odd_values());
        return {m.dump(2), "retype " + at.to_string() + " = " + m[at].dump()};
      }
      case 2: {  // an extreme number, written as text: some have no double
        const std::string number = pick(extreme_numbers());
        m[at] = "@@number@@";
        return {replace_marker(m.dump(2), number), "set " + at.to_string() + " = " + number};
      }
      case 3: {  // a key given twice
        const json::json_pointer object = at.empty() ? at : at.parent_pointer();
        if (!m[object].is_object() || m[object].empty()) return {m.dump(2), "unchanged"};
        const std::string key = m[object].items().begin().key();
        m[object]["@@twice@@"] = m[object][key];
        std::string text = m.dump(2);
        const std::string marker = "\"@@twice@@\"";
        text.replace(text.find(marker), marker.size(), json(key).dump());
        return {text, "key " + (object / key).to_string() + " twice"};
      }
      case 4: {  // an unknown key
        const json::json_pointer object = at.empty() || !m[at].is_object() ? json::json_pointer() : at;
        m[object]["bogus_key"] = 1;
        return {m.dump(2), "unknown key in " + object.to_string()};
      }
      case 5:  // broken text
        return broken_text(m.dump(2));
      default: {  // a section replaced by a scalar or a list
        const std::vector<std::string> keys = section_keys(m);
        if (keys.empty()) return {m.dump(2), "unchanged"};
        const std::string key = pick(keys);
        m[key] = pick(odd_values());
        return {m.dump(2), "section " + key + " = " + m[key].dump()};
      }
    }
  }

  // bytes with one bit flipped in [from, to) (to = 0: the end).
  std::pair<std::string, std::string> flip(std::string bytes, size_t from = 0, size_t to = 0) {
    if (to == 0 || to > bytes.size()) to = bytes.size();
    if (from >= to) return {bytes, "unchanged"};
    const size_t i = from + pick(to - from);
    const int bit = static_cast<int>(pick(8));
    bytes[i] = static_cast<char>(bytes[i] ^ (1 << bit));
    return {bytes, fmt::format("bit {} of byte {} flipped", bit, i)};
  }

  // A copy of bytes with one of: a bit flipped, a cut, bytes appended.
  std::pair<std::string, std::string> damage(std::string bytes) {
    switch (pick(3)) {
      case 0:
        return flip(std::move(bytes));
      case 1: {
        const size_t n = pick(bytes.size() + 1);
        return {bytes.substr(0, n), fmt::format("cut to {} bytes", n)};
      }
      default: {
        const size_t n = 1 + pick(64);
        for (size_t k = 0; k < n; ++k) bytes.push_back(static_cast<char>(pick(256)));
        return {bytes, fmt::format("{} bytes appended", n)};
      }
    }
  }

 private:
  static std::vector<json::json_pointer> leaves_and_members(const json& j) {
    std::vector<json::json_pointer> out;
    const json flat = j.flatten();
    for (const auto& [path, v] : flat.items()) {
      json::json_pointer p(path);
      out.push_back(p);
      if (!p.empty()) out.push_back(p.parent_pointer());
    }
    if (out.empty()) out.push_back(json::json_pointer());
    return out;
  }
  static std::vector<std::string> section_keys(const json& j) {
    std::vector<std::string> keys;
    if (j.is_object())
      for (const auto& [k, v] : j.items()) keys.push_back(k);
    return keys;
  }
  static const std::vector<json>& odd_values() {
    static const std::vector<json> v = {"text", "", 0, -1, 1.5, -0.0, true, false, nullptr, json::array(),
                                        json::object(), json::array({1, 2}), "*", "../../etc",
                                        std::numeric_limits<int64_t>::max(), std::numeric_limits<uint64_t>::max()};
    return v;
  }
  static const std::vector<std::string>& extreme_numbers() {
    static const std::vector<std::string> v = {"1e400", "-1e400", "1e-400", "1e308", "-1e308", "0", "-0", "-1",
                                               "9223372036854775807", "9223372036854775808", "18446744073709551616",
                                               "-9223372036854775809", "9007199254740993", "0.5", "2147483648",
                                               "4294967297", "1e18", "65536", "65537", "1048577"};
    return v;
  }
  static std::string replace_marker(std::string text, const std::string& number) {
    const std::string marker = "\"@@number@@\"";
    text.replace(text.find(marker), marker.size(), number);
    return text;
  }
  std::pair<std::string, std::string> broken_text(std::string text) {
    static const std::string specials = "{}[],:\"\\ x0\n";
    const size_t i = pick(text.size() + 1);
    switch (pick(6)) {
      case 0: return {text.substr(0, i), fmt::format("cut at byte {}", i)};
      case 1:
        if (i < text.size()) text.erase(i, 1);
        return {text, fmt::format("byte {} deleted", i)};
      case 2: return {text.insert(i, 1, specials[pick(specials.size())]), fmt::format("byte inserted at {}", i)};
      case 3: return {text.insert(i, "\xFF\xFE"), fmt::format("invalid UTF-8 at {}", i)};
      case 4: return {"\xEF\xBB\xBF" + text, "byte-order mark"};
      default: {
        std::string junk;
        for (size_t k = pick(40); k > 0; --k) junk.push_back(static_cast<char>(pick(256)));
        return {junk, "random bytes"};
      }
    }
  }
  std::mt19937_64 rng_;
};

// ---------------------------------------------------------------------------
// The fuzz world: a corpus large enough for every real config's first batch
// and its evaluation, the real configs pointed at it, an output folder and a working directory
// that must stay empty.

struct World {
  fs::path root, data, out, work;

  World() : root(scratch_dir("fuzz")), data(root / "data"), out(root / "out"), work(root / "work") {
    for (const auto& d : {data, out, work}) fs::create_directories(d);
    std::vector<uint16_t> t;
    for (int i = 0; t.size() < 70000; ++i)
      for (char c : "the cat sat on the mat " + std::to_string(i % 97) + ". ") t.push_back(static_cast<uint8_t>(c));
    qattn::write_shard((data / "f_train_000001.bin").string(), t.data(), t.size());
    // The val split holds every real config's evaluation (at most 20 batches
    // of 64 sequences of 1024 + 1 tokens: 1,310,721 tokens).
    std::vector<uint16_t> val;
    while (val.size() < 1400000) val.insert(val.end(), t.begin(), t.end());
    qattn::write_shard((data / "f_val_000000.bin").string(), val.data(), val.size());
  }

  // A real config, its data and output moved into the world, by paths
  // relative to the working directory: the text, and so what the mutator
  // does to it, is the same in every scratch folder.
  json config(const fs::path& file, const fs::path& shards) const {
    json j = qattn::read_json_file(file.string(), "config file");
    j["data"]["train"] = (fs::relative(shards, work) / "*_train_*.bin").string();
    j["data"]["val"] = (fs::relative(shards, work) / "*_val_*.bin").string();
    j["log"]["out"] = fs::relative(out, work).string();
    return j;
  }

  // The configs under configs/ (not the sweeps), as the world's.
  std::vector<json> real_configs() const {
    std::vector<json> out_configs;
    for (const auto& dir : {fs::path(QATTN_SOURCE_DIR) / "configs", fs::path(QATTN_SOURCE_DIR) / "configs/repro"})
      for (const auto& e : fs::directory_iterator(dir))
        if (e.path().extension() == ".json") out_configs.push_back(config(e.path(), data));
    std::sort(out_configs.begin(), out_configs.end());  // directory order is not fixed
    return out_configs;
  }

  // Nothing may stay behind a failed command.
  void check_untouched(const std::string& what) const {
    INFO(what);
    CHECK(listing(work).empty());
    CHECK(listing(out).empty());
    fs::remove_all(work);
    fs::remove_all(out);
    fs::create_directories(work);
    fs::create_directories(out);
  }
};

}  // namespace

TEST_CASE("fuzz: mutated configs get a documented answer from validate and train", "[fuzz]") {
  World w;
  Mutator m(fuzz_seed());
  const auto configs = w.real_configs();
  REQUIRE(configs.size() >= 4);
  for (const auto& c : configs) {  // the unmutated configs are valid on the world's data
    const fs::path file = w.root / "good.json";
    write_json(file, c);
    check_run(run_in(w.work, {"validate", file.string()}), "validate " + c.dump(), {0}, {});
  }
  int refused = 0, accepted = 0;
  for (int i = 0; i < 300; ++i) {
    const auto [text, what] = m.mutate(m.pick(configs));
    const fs::path file = w.root / fmt::format("config_{:03d}.json", i);
    std::ofstream(file, std::ios::binary) << text;
    const std::string label = fmt::format("mutation {} ({}), seed {}", i, what, fuzz_seed());
    const Run v = run_in(w.work, {"validate", file.string()});
    check_run(v, "validate: " + label, {0, 2}, {file.string()});
    if (v.code == 0) {
      ++accepted;
      continue;
    }
    ++refused;
    // train refuses the same config with the same code, before it writes anything.
    const Run t = run_in(w.work, {"train", file.string()});
    check_run(t, "train: " + label, {2}, {file.string()});
    w.check_untouched("train: " + label);
  }
  WARN(fmt::format("configs: {} mutations refused, {} accepted (seed {})", refused, accepted, fuzz_seed()));
  CHECK(refused > 200);
}

TEST_CASE("fuzz: mutated sweep files get a documented answer from sweep --dry-run", "[fuzz]") {
  World w;
  Mutator m(fuzz_seed() + 1);
  const fs::path base = write_json(w.root / "base.json", w.config(fs::path(QATTN_SOURCE_DIR) / "configs/quickstart.json", w.data));
  json sweep = qattn::read_json_file(QATTN_SOURCE_DIR "/configs/sweeps/quickstart_smoke.json", "sweep file");
  sweep["base"] = base.filename().string();  // beside the sweep file
  sweep["out"] = fs::relative(w.out, w.work).string();
  for (int i = 0; i < 60; ++i) {
    const auto [text, what] = m.mutate(sweep);
    const fs::path file = w.root / fmt::format("sweep_{:03d}.json", i);
    std::ofstream(file, std::ios::binary) << text;
    const Run r = run_in(w.work, {"sweep", file.string(), "--dry-run"});
    check_run(r, fmt::format("sweep --dry-run: mutation {} ({})", i, what), {0, 2}, {file.string(), "run "});
    w.check_untouched(what);
  }
}

TEST_CASE("fuzz: damaged shards are refused naming the shard, before anything is written", "[fuzz]") {
  World w;
  Mutator m(fuzz_seed() + 2);
  const std::string good = read_text(w.data / "f_train_000001.bin");
  const json base = w.config(fs::path(QATTN_SOURCE_DIR) / "configs/quickstart.json", w.root / "shards");
  const fs::path cfg = write_json(w.root / "shards.json", base);
  const fs::path shard = w.root / "shards" / "f_train_000001.bin";
  int refused = 0;
  for (int i = 0; i < 90; ++i) {
    fs::remove_all(w.root / "shards");
    fs::create_directories(w.root / "shards");
    fs::copy_file(w.data / "f_val_000000.bin", w.root / "shards" / "f_val_000000.bin");
    std::string what;
    if (i < 60) {  // bit flips in the header's magic, version and count; anything anywhere
      std::string bytes;
      std::tie(bytes, what) = i % 3 == 0 ? m.flip(good, 0, 12) : m.damage(good);
      std::ofstream(shard, std::ios::binary) << bytes;
    } else if (i < 80) {  // a header whose count lies about the size
      std::string bytes = good;
      const int32_t lie = static_cast<int32_t>(70000 + static_cast<int>(m.pick(41)) - 20 + (i % 2 ? 1 << 30 : 0));
      std::memcpy(bytes.data() + 8, &lie, 4);
      std::ofstream(shard, std::ios::binary) << bytes;
      what = fmt::format("header count {}", lie);
    } else if (i == 80) {
      fs::create_directories(shard);
      what = "a directory";
    } else if (i == 81) {
      fs::create_symlink(w.root / "nowhere.bin", shard);
      what = "a dangling symlink";
    } else if (i == 82) {
      std::ofstream(shard, std::ios::binary);
      what = "empty";
    } else {
      std::vector<uint16_t> t(100, static_cast<uint16_t>(257 + m.pick(65000)));  // ids beyond model.vocab
      qattn::write_shard(shard.string(), t.data(), t.size());
      what = fmt::format("token id {}", t[0]);
    }
    const std::string label = fmt::format("shard {} ({}), seed {}", i, what, fuzz_seed() + 2);
    // The shard, or the glob when the shards hold too few tokens.
    const std::vector<std::string> names = {(w.root / "shards").string()};
    const Run v = run_in(w.work, {"validate", cfg.string()});
    check_run(v, "validate: " + label, {0, 2}, names);
    if (v.code == 0) continue;
    ++refused;
    CHECK_THAT(v.output, Catch::Contains("data.train"));
    const Run t = run_in(w.work, {"train", cfg.string()});
    check_run(t, "train: " + label, {2}, names);
    w.check_untouched("train: " + label);
  }
  CHECK(refused > 60);
}

TEST_CASE("fuzz: damaged checkpoints are refused naming the checkpoint, leaving nothing", "[fuzz]") {
  World w;
  Mutator m(fuzz_seed() + 3);
  // A tiny run with one checkpoint at its last step.
  json j = tiny_config(w.data, "ck", 4);
  j["data"]["train"] = "../data/*_train_*.bin";  // relative to the working directory: the same bytes in every scratch folder
  j["data"]["val"] = "../data/*_val_*.bin";
  j["log"]["out"] = "../runs";
  const fs::path cfg = write_json(w.root / "ck.json", j);
  REQUIRE(run_in(w.work, {"train", cfg.string()}).code == 0);
  const fs::path run = w.root / "runs" / "ck";
  const std::vector<std::string> files = {"params.bin", "adam_m.bin", "adam_v.bin", "state.json", "config.json",
                                          "manifest.json"};
  for (int i = 0; i < 45; ++i) {
    const fs::path copy = w.root / "copy";
    fs::remove_all(copy);
    fs::copy(run, copy, fs::copy_options::recursive);
    const fs::path ck = copy / "checkpoints" / "step_00000004";
    const std::string file = files[static_cast<size_t>(i) % files.size()];
    std::string what;
    if (i < 36) {
      std::string bytes;
      std::tie(bytes, what) = m.damage(read_text(ck / file));
      std::ofstream(ck / file, std::ios::binary | std::ios::trunc) << bytes;
    } else if (i < 39) {
      fs::remove(ck / file);
      what = "deleted";
    } else if (i < 42) {
      fs::remove(ck / file);
      fs::create_directories(ck / file);
      what = "a directory";
    } else {  // a manifest that parses but lies or has the wrong types
      json manifest = json::parse(read_text(ck / "manifest.json"));
      const std::vector<std::pair<std::string, json>> lies = {
          {"/files/params.bin/bytes", 12}, {"/files/params.bin/fnv1a64", 5}, {"/files", "none"}};
      const auto& [pointer, value] = lies[static_cast<size_t>(i - 42)];
      manifest[json::json_pointer(pointer)] = value;
      write_json(ck / "manifest.json", manifest);
      what = pointer + " = " + value.dump();
    }
    const std::string label = fmt::format("checkpoint {}: {} {}, seed {}", i, file, what, fuzz_seed() + 3);
    const auto before = listing(copy);
    for (const std::string format : {"llmc", "hf"}) {
      const Run e = run_in(w.work, {"export", "--checkpoint", copy.string(), "--format", format, "--out",
                                    (w.work / "model").string()});
      check_run(e, "export --format " + format + ": " + label, {0, 1}, {copy.string()});
      if (e.code != 0) w.check_untouched("export: " + label);
      fs::remove_all(w.work);
      fs::create_directories(w.work);
    }
    const Run s = run_in(w.work, {"sample", "--checkpoint", copy.string(), "--tokens", "2"});
    check_run(s, "sample: " + label, {0, 1}, {copy.string()});
    const Run r = run_in(w.work, {"train", cfg.string(), "--resume", "--out", copy.string()});
    check_run(r, "train --resume: " + label, {0, 2}, {copy.string()});
    if (r.code != 0) CHECK(listing(copy) == before);
    w.check_untouched(label);
  }
}

TEST_CASE("fuzz: numeric options refuse what they cannot take, naming the option", "[fuzz]") {
  World w;
  Mutator m(fuzz_seed() + 4);
  const fs::path cfg = write_json(w.root / "c.json", w.config(fs::path(QATTN_SOURCE_DIR) / "configs/quickstart.json", w.data));
  const std::vector<std::vector<std::string>> commands = {
      {"sample", "--checkpoint", w.root.string(), "--temperature"},
      {"sample", "--checkpoint", w.root.string(), "--tokens"},
      {"sample", "--checkpoint", w.root.string(), "--top-k"},
      {"sample", "--checkpoint", w.root.string(), "--seed"},
      {"train", cfg.string(), "--nproc"},
      {"validate", cfg.string(), "--nproc"},
      {"sweep", cfg.string(), "--jobs"},
      {"tokenize", "--tokenizer", "bytes", cfg.string(), "--out", w.out.string(), "--val-fraction"},
      {"tokenize", "--tokenizer", "bytes", cfg.string(), "--out", w.out.string(), "--shard-tokens"},
      {"tokenize", "--tokenizer", "bytes", cfg.string(), "--out", w.out.string(), "--threads"},
      {"tokenize", "--tokenizer", "bytes", cfg.string(), "--out", w.out.string(), "--val-docs"},
      {"probe", "causality", cfg.string(), "--sigma"},
      {"probe", "causality", cfg.string(), "--heads"},
      {"probe", "causality", cfg.string(), "--from"},
      {"bench", "attention", "--shape", "1,1,64,64", "--reps"},
      {"bench", "attention", "--shape", "1,1,64,64", "--K"},
      {"bench", "attention", "--shape", "1,1,64,64", "--window"},
  };
  // None is a valid --nproc (1..64): a valid one would start training processes.
  const std::vector<std::string> values = {"nan", "-nan", "inf", "-inf", "1e400", "-1", "0", "-0",
                                           "9223372036854775808", "18446744073709551616", "", "abc", "1.5",
                                           "0x10", " 5", "1e3", "100000000", "-2147483649"};
  for (const auto& command : commands)
    for (int k = 0; k < 4; ++k) {
      std::vector<std::string> args = command;
      args.push_back(m.pick(values));
      const std::string label = fmt::format("{}", fmt::join(args, " "));
      const Run r = run_in(w.work, args);
      // 0 or 1: a value in range, then the command ran (or ran into the world's other inputs).
      check_run(r, label, {0, 1, 2}, {command.back(), w.root.string(), "bench attention", "tokenize:"});
      fs::remove_all(w.out);
      fs::create_directories(w.out);
      fs::remove_all(w.work);
      fs::create_directories(w.work);
    }
}
