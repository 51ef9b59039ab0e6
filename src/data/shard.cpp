// llm.c token shards: read, validate, write (atomically).
#include <glob.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "qattn/atomic_file.hpp"
#include "qattn/data.hpp"

namespace qattn {

namespace {

struct ShardHeader {
  int32_t words[256];
};

// Reads the header and checks magic, version and file size; returns the count.
int64_t check_header(std::ifstream& f, const std::string& path) {
  if (!f) throw DataError("shard " + path + ": cannot open");
  const auto file_bytes = static_cast<int64_t>(std::filesystem::file_size(path));
  ShardHeader h{};
  f.read(reinterpret_cast<char*>(&h), sizeof h);
  if (f.gcount() != static_cast<std::streamsize>(sizeof h))
    throw DataError("shard " + path + ": truncated header (" + std::to_string(file_bytes) +
                    " bytes, a header is 1024)");
  if (h.words[0] != kShardMagic)
    throw DataError("shard " + path + ": bad magic " + std::to_string(h.words[0]) +
                    " (expected " + std::to_string(kShardMagic) + ", an llm.c token shard)");
  if (h.words[1] != kShardVersion)
    throw DataError("shard " + path + ": unsupported version " + std::to_string(h.words[1]) +
                    " (expected 1: uint16 tokens)");
  const int64_t count = static_cast<uint32_t>(h.words[2]);
  const int64_t expected = static_cast<int64_t>(kShardHeaderBytes) + 2 * count;
  if (file_bytes != expected)
    throw DataError("shard " + path + ": size " + std::to_string(file_bytes) +
                    " bytes does not match its header (" + std::to_string(count) +
                    " tokens -> " + std::to_string(expected) + " bytes); truncated or corrupt");
  return count;
}

}  // namespace

int64_t validate_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return check_header(f, path);
}

std::vector<uint16_t> read_shard(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  const int64_t count = check_header(f, path);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  f.read(reinterpret_cast<char*>(tokens.data()), static_cast<std::streamsize>(2 * count));
  if (f.gcount() != static_cast<std::streamsize>(2 * count))
    throw DataError("shard " + path + ": short read of its tokens");
  return tokens;
}

void write_shard(const std::string& path, const uint16_t* tokens, size_t count) {
  if (count > 0xFFFFFFFFull)
    throw DataError("shard " + path + ": " + std::to_string(count) +
                    " tokens exceed the header's 32-bit count; use smaller shards");
  ShardHeader h{};
  h.words[0] = kShardMagic;
  h.words[1] = kShardVersion;
  h.words[2] = static_cast<int32_t>(static_cast<uint32_t>(count));
  try {
    write_file_atomically(path, [&](std::ostream& f) {
      f.write(reinterpret_cast<const char*>(&h), sizeof h);
      f.write(reinterpret_cast<const char*>(tokens), static_cast<std::streamsize>(2 * count));
    }, /*binary=*/true);
  } catch (const std::runtime_error& e) {
    throw DataError(std::string("shard ") + e.what());
  }
}

std::vector<std::string> expand_glob(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  globfree(&g);
  if (out.empty())
    throw DataError("no shard matches '" + pattern +
                    "' (did you run data/prepare.sh? paths are relative to the working directory)");
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace qattn
