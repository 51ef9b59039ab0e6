// Shard validation and the data loader.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "qattn/atomic_file.hpp"
#include "qattn/data.hpp"

namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("qattn_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_raw(const fs::path& p, std::vector<int32_t> header, size_t n_tokens) {
  header.resize(256, 0);
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(header.data()), 1024);
  std::vector<uint16_t> t(n_tokens, 7);
  f.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(2 * n_tokens));
}

}  // namespace

TEST_CASE("shards round-trip through write_shard/read_shard", "[data]") {
  const auto d = temp_dir("roundtrip");
  std::vector<uint16_t> tokens(1000);
  std::iota(tokens.begin(), tokens.end(), 0);
  qattn::write_shard((d / "a.bin").string(), tokens.data(), tokens.size());
  CHECK(qattn::read_shard((d / "a.bin").string()) == tokens);
  CHECK(!fs::exists(d / ".a.bin.tmp"));
}

TEST_CASE("an atomic write that fails leaves the old file and no temporary", "[data]") {
  const auto d = temp_dir("atomic");
  const std::string path = (d / "f.txt").string();
  qattn::write_file_atomically(path, [](std::ostream& f) { f << "old"; });
  CHECK_THROWS_WITH(qattn::write_file_atomically(path, [](std::ostream& f) {
                      f << "half";
                      f.setstate(std::ios::badbit);  // what a full disk does to the stream
                    }),
                    Catch::Contains("f.txt") && Catch::Contains("write failed"));
  std::ifstream in(path);
  std::string text;
  in >> text;
  CHECK(text == "old");
  CHECK(!fs::exists(d / ".f.txt.tmp"));
}

TEST_CASE("an atomic write that cannot finish names the reason and leaves no temporary", "[data]") {
  const auto d = temp_dir("atomic_fail");
  const auto no_temporaries = [](const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().ends_with(".tmp")) return false;
    return true;
  };
  const auto write_text = [](std::ostream& f) { f << "text"; };
  // The target is a directory: refused before anything is written.
  fs::create_directories(d / "taken");
  CHECK_THROWS_WITH(qattn::write_file_atomically((d / "taken").string(), write_text),
                    Catch::Contains("taken: is a directory"));
  CHECK(fs::is_directory(d / "taken"));
  // The folder is missing, or is a file: the OS's reason.
  CHECK_THROWS_WITH(qattn::write_file_atomically((d / "missing" / "f.txt").string(), write_text),
                    Catch::Contains("f.txt: cannot create a file in") && Catch::Contains("No such file or directory"));
  { std::ofstream(d / "plain") << "x"; }
  CHECK_THROWS_WITH(qattn::write_file_atomically((d / "plain" / "f.txt").string(), write_text),
                    Catch::Contains("Not a directory"));
  // The writer throws: its exception goes through, the temporary does not stay.
  CHECK_THROWS_WITH(qattn::write_file_atomically((d / "g.txt").string(),
                                                 [](std::ostream& f) {
                                                   f << "half";
                                                   throw std::runtime_error("writer gave up");
                                                 }),
                    "writer gave up");
  CHECK(!fs::exists(d / "g.txt"));
  CHECK(no_temporaries(d));
}

TEST_CASE("bad shards stop with their path and what is wrong", "[data]") {
  const auto d = temp_dir("bad");
  write_raw(d / "magic.bin", {12345, 1, 10}, 10);
  write_raw(d / "version.bin", {20240520, 2, 10}, 10);
  write_raw(d / "short.bin", {20240520, 1, 10}, 9);
  { std::ofstream f(d / "tiny.bin", std::ios::binary); f << "abc"; }
  CHECK_THROWS_WITH(qattn::read_shard((d / "magic.bin").string()),
                    Catch::Contains("magic.bin") && Catch::Contains("bad magic 12345"));
  CHECK_THROWS_WITH(qattn::read_shard((d / "version.bin").string()),
                    Catch::Contains("version.bin") && Catch::Contains("unsupported version 2"));
  CHECK_THROWS_WITH(qattn::read_shard((d / "short.bin").string()),
                    Catch::Contains("short.bin") && Catch::Contains("does not match its header"));
  CHECK_THROWS_WITH(qattn::read_shard((d / "tiny.bin").string()), Catch::Contains("truncated header"));
  CHECK_THROWS_WITH(qattn::expand_glob((d / "none_*.bin").string()), Catch::Contains("no shard matches"));
}

TEST_CASE("the loader is deterministic, shuffles per epoch and splits ranks", "[data]") {
  const auto d = temp_dir("loader");
  std::vector<uint16_t> tokens(8 * 16 + 1);  // 8 windows of 16 + 1
  std::iota(tokens.begin(), tokens.end(), 0);
  qattn::write_shard((d / "x_train_000001.bin").string(), tokens.data(), tokens.size());
  const std::string glob = (d / "x_train_*.bin").string();
  qattn::DataLoader a(glob, 4, 16, true, 7), b(glob, 4, 16, true, 7);
  std::vector<int32_t> ia, ta, ib, tb;
  for (int i = 0; i < 5; ++i) {  // past one epoch (8 windows = 2 batches)
    a.next(ia, ta);
    b.next(ib, tb);
    CHECK(ia == ib);
    for (size_t k = 0; k < ia.size(); ++k) CHECK(ta[k] == ia[k] + 1);  // targets shifted by one
  }
  CHECK(a.epoch() == 2);
  // Two ranks see disjoint halves of each global batch of 2 x 2 sequences.
  qattn::DataLoader r0(glob, 2, 16, true, 7, 0, 2), r1(glob, 2, 16, true, 7, 1, 2), whole(glob, 4, 16, true, 7);
  std::vector<int32_t> i0, t0, i1, t1, iw, tw;
  r0.next(i0, t0);
  r1.next(i1, t1);
  whole.next(iw, tw);
  i0.insert(i0.end(), i1.begin(), i1.end());
  CHECK(i0 == iw);
}
