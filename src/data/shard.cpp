// llm.c token shards: read, validate, write (atomically).
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "qattn/atomic_file.hpp"
#include "qattn/data.hpp"

namespace qattn {

namespace {

struct ShardHeader {
  int32_t words[256];
};

// An open shard file (closed on scope exit).
class ShardFile {
 public:
  explicit ShardFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open");
    struct stat st{};
    if (::fstat(fd_, &st) != 0) fail("cannot stat");
    if (S_ISDIR(st.st_mode))
      throw DataError("shard " + path + ": is a directory; allowed: llm.c token shard files (make the data glob "
                                        "match files only)");
    if (!S_ISREG(st.st_mode)) throw DataError("shard " + path + ": not a regular file");
    bytes_ = static_cast<int64_t>(st.st_size);
  }
  ~ShardFile() { ::close(fd_); }
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  int64_t bytes() const { return bytes_; }
  // Reads exactly n bytes (fewer only at the end of the file); returns how many.
  size_t read(void* out, size_t n) {
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::read(fd_, static_cast<char*>(out) + done, std::min<size_t>(n - done, 1 << 30));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) fail("cannot read");
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw DataError("shard " + path_ + ": " + what + ": " + std::strerror(errno));
  }
  std::string path_;
  int fd_ = -1;
  int64_t bytes_ = 0;
};

// Reads the header and checks magic, version and file size; returns the count.
int64_t check_header(ShardFile& f, const std::string& path) {
  const int64_t file_bytes = f.bytes();
  ShardHeader h{};
  if (f.read(&h, sizeof h) != sizeof h)
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
  ShardFile f(path);
  return check_header(f, path);
}

std::vector<uint16_t> read_shard(const std::string& path) {
  ShardFile f(path);
  const int64_t count = check_header(f, path);
  std::vector<uint16_t> tokens(static_cast<size_t>(count));
  if (f.read(tokens.data(), static_cast<size_t>(2 * count)) != static_cast<size_t>(2 * count))
    throw DataError("shard " + path + ": short read of its tokens (the file shrank while it was read)");
  return tokens;
}

ShardInfo scan_shard(const std::string& path) {
  ShardFile f(path);
  ShardInfo info{path, check_header(f, path), 0};
  std::vector<uint16_t> chunk(1 << 20);
  for (int64_t left = info.tokens; left > 0;) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(left, static_cast<int64_t>(chunk.size())));
    if (f.read(chunk.data(), 2 * want) != 2 * want)
      throw DataError("shard " + path + ": short read of its tokens (the file shrank while it was read)");
    info.max_token = std::max<int>(info.max_token, *std::max_element(chunk.begin(), chunk.begin() + want));
    left -= static_cast<int64_t>(want);
  }
  return info;
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
