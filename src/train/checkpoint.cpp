// Checkpoint directories: crash-safe writing (temporary directory, fsync,
// manifest last, rename), verification against the manifest, pruning, and the
// config comparison behind automatic resume.
#include "qattn/checkpoint.hpp"
#include "qattn/json_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <spdlog/spdlog.h>

namespace qattn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kFormat = "qattn-checkpoint";
constexpr int kFormatVersion = 1;
constexpr const char* kStepPrefix = "step_";
const char* const kFiles[] = {"config.json", "state.json", "params.bin", "adam_m.bin", "adam_v.bin"};

// FNV-1a's 64-bit offset basis and prime over 64-bit little-endian words (then
// the bytes of the tail): fast enough to hash a GPT-2 124M checkpoint (1.5 GB)
// in about a second. Not byte-wise FNV-1a-64: docs/runs.md gives the exact rule.
class Fnv1a64 {
 public:
  void update(const unsigned char* p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    for (; i < n; ++i) mix(p[i]);
  }
  std::string hex() const { return fmt_hex(h_); }

 private:
  void mix(uint64_t w) { h_ = (h_ ^ w) * 0x100000001b3ull; }
  static std::string fmt_hex(uint64_t x) {
    char s[17];
    std::snprintf(s, sizeof s, "%016llx", static_cast<unsigned long long>(x));
    return s;
  }
  uint64_t h_ = 0xcbf29ce484222325ull;
};

struct FileSum {
  uint64_t bytes = 0;
  std::string hash;
};

FileSum sum_of(const void* data, uint64_t bytes) {
  Fnv1a64 h;
  h.update(static_cast<const unsigned char*>(data), bytes);
  return {bytes, h.hex()};
}

[[noreturn]] void fail_errno(const std::string& what, const std::string& path) {
  throw CheckpointError(what + " " + path + ": " + std::strerror(errno));
}

// Writes bytes to path and fsyncs it, so the data is on disk before the manifest is.
FileSum write_synced(const fs::path& path, const void* data, size_t bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) fail_errno("cannot create", path);
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::write(fd, p + done, std::min<size_t>(bytes - done, 1 << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int write_errno = errno;  // the reason, not close's
      ::close(fd);
      errno = write_errno;
      fail_errno("cannot write", path);
    }
    done += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  if (::close(fd) != 0 || !synced) {  // the descriptor is closed either way
    if (!synced) errno = sync_errno;
    fail_errno("cannot sync", path);
  }
  return sum_of(data, bytes);
}

FileSum write_synced(const fs::path& path, const std::string& text) {
  return write_synced(path, text.data(), text.size());
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) fail_errno("cannot open directory", dir);
  ::fsync(fd);
  ::close(fd);
}

FileSum sum_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw CheckpointError(path.filename().string() + " is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CheckpointError("cannot read " + path.string() + ": " + std::strerror(errno));
  FileSum s;
  Fnv1a64 h;
  std::vector<unsigned char> buf(1 << 20);
  // Whole 8-byte words per chunk keep the hash equal to the one-shot hash.
  while (f.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(buf.size())) ||
         f.gcount() > 0) {
    const size_t n = static_cast<size_t>(f.gcount());
    h.update(buf.data(), n);
    s.bytes += n;
  }
  s.hash = h.hex();
  return s;
}

std::string read_text(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw CheckpointError(path.filename().string() + " is a directory, not a file");
  std::ifstream f(path, std::ios::binary);
  if (!f) throw CheckpointError("cannot read " + path.string() + ": " + std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Reads a whole file into elements of T (a size not a multiple of sizeof(T)
// keeps its tail bytes out, which the manifest's byte count then reports).
template <class T>
std::vector<T> read_whole(const fs::path& path, uint64_t& bytes) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw CheckpointError(path.filename().string() + " is a directory, not a file");
  bytes = fs::file_size(path, ec);
  if (ec) throw CheckpointError("cannot read " + path.string() + ": " + ec.message());
  std::vector<T> v(bytes / sizeof(T));
  std::ifstream f(path, std::ios::binary);
  if (!f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T))))
    throw CheckpointError("cannot read " + path.string() + ": " + std::strerror(errno));
  return v;
}

// What is wrong with a file against its manifest entry ("" when nothing).
std::string mismatch(const char* file, const FileSum& got, const json& want) {
  if (got.bytes != want.at("bytes").get<uint64_t>())
    return std::string(file) + " holds " + std::to_string(got.bytes) + " bytes; the manifest says " +
           std::to_string(want.at("bytes").get<uint64_t>());
  if (got.hash != want.at("fnv1a64").get<std::string>())
    return std::string(file) + ": checksum " + got.hash + " does not match the manifest's " +
           want.at("fnv1a64").get<std::string>();
  return "";
}

// The manifest of the checkpoint in d, checked for format and the list of
// files; throws CheckpointError or json::exception with what is wrong.
json read_manifest(const fs::path& d) {
  if (!fs::exists(d / "manifest.json")) throw CheckpointError("no manifest.json (the write did not finish)");
  json manifest = json::parse(read_text(d / "manifest.json"));
  if (manifest.at("format") != kFormat || manifest.at("version") != kFormatVersion)
    throw CheckpointError("manifest.json: not a " + std::string(kFormat) + " version " +
                          std::to_string(kFormatVersion) + " manifest");
  for (const char* file : kFiles) {
    if (!manifest.at("files").contains(file))
      throw CheckpointError("manifest.json does not list " + std::string(file));
    if (!fs::exists(d / file)) throw CheckpointError(std::string(file) + " is missing");
  }
  return manifest;
}

json state_to_json(const TrainState& s) {
  return {{"step", s.step},
          {"adam_t", s.adam_t},
          {"data", {{"epoch", s.data_epoch}, {"cursor", s.data_cursor}}},
          {"rng", {{"data_seed", s.data_seed}}},
          {"spike", {{"skipped", s.skipped}, {"mean", s.spike_mean}, {"var", s.spike_var},
                     {"count", s.spike_count}}},
          {"last_val_loss", s.last_val_loss},
          {"eval_pending", s.eval_pending},
          {"train_seconds", s.train_seconds},
          {"wall_seconds", s.wall_seconds}};
}

TrainState state_from_json(const json& j) {
  TrainState s;
  s.step = j.at("step");
  s.adam_t = j.at("adam_t");
  s.data_epoch = j.at("data").at("epoch");
  s.data_cursor = j.at("data").at("cursor");
  s.data_seed = j.at("rng").at("data_seed");
  s.skipped = j.at("spike").at("skipped");
  s.spike_mean = j.at("spike").at("mean");
  s.spike_var = j.at("spike").at("var");
  s.spike_count = j.at("spike").at("count");
  s.last_val_loss = j.at("last_val_loss");
  s.eval_pending = j.value("eval_pending", false);  // a checkpoint without the key has no cut evaluation
  s.train_seconds = j.at("train_seconds");
  s.wall_seconds = j.at("wall_seconds");
  return s;
}

// step_00001200 -> 1200; -1 for any other name.
int64_t step_of(const std::string& name) {
  const std::string p = kStepPrefix;
  if (name.size() <= p.size() || name.compare(0, p.size(), p) != 0) return -1;
  int64_t step = 0;
  for (size_t i = p.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

bool is_temporary(const std::string& name) {
  return name.size() > 5 && name[0] == '.' && name.compare(name.size() - 4, 4, ".tmp") == 0;
}

// The test hook behind the kill-during-write test: QATTN_TEST_KILL_IN_CHECKPOINT=N
// makes the process SIGKILL itself while writing the checkpoint of step N,
// after the tensors and before the manifest.
void maybe_die_mid_write(int64_t step) {
  const char* s = std::getenv("QATTN_TEST_KILL_IN_CHECKPOINT");
  if (s && std::strtoll(s, nullptr, 10) == step) std::raise(SIGKILL);
}

void flatten(const json& j, const std::string& path, std::map<std::string, std::string>& out) {
  if (j.is_object() && !j.empty()) {
    for (const auto& [k, v] : j.items()) flatten(v, path.empty() ? k : path + "." + k, out);
  } else {
    out[path] = j.dump();
  }
}

bool ignored_in_comparison(const std::string& path) {
  for (const char* p : {"log.", "eval.every", "train.checkpoint_every", "train.keep_checkpoints",
                        "train.device"})
    if (path.rfind(p, 0) == 0) return true;
  return false;
}

}  // namespace

std::string checkpoint_root(const std::string& run_dir) { return (fs::path(run_dir) / "checkpoints").string(); }

std::string save_checkpoint(const std::string& run_dir, const Checkpoint& ck, int keep) {
  const size_t n = ck.params.size();
  if (ck.adam_m.size() != n || ck.adam_v.size() != n)
    throw CheckpointError("save_checkpoint: params, adam_m and adam_v differ in size");
  const fs::path root = checkpoint_root(run_dir);
  char name[32];
  std::snprintf(name, sizeof name, "%s%08lld", kStepPrefix, static_cast<long long>(ck.state.step));
  const fs::path tmp = root / (std::string(".") + name + ".tmp"), final_dir = root / name;
  std::error_code ec;
  if (fs::create_directories(root, ec); ec) throw CheckpointError("cannot create " + root.string() + ": " + ec.message());
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw CheckpointError("cannot create " + tmp.string() + ": " + (ec ? ec.message() : "it exists"));
  // A write that fails (disk full) removes its temporary directory: nothing of it stays.
  try {
    json files = json::object();
    auto record = [&](const char* file, const FileSum& s) {
      files[file] = {{"bytes", s.bytes}, {"fnv1a64", s.hash}};
    };
    record("config.json", write_synced(tmp / "config.json", ck.config.dump(2) + "\n"));
    record("state.json", write_synced(tmp / "state.json", state_to_json(ck.state).dump(2) + "\n"));
    const size_t bytes = n * sizeof(float);
    record("params.bin", write_synced(tmp / "params.bin", ck.params.data(), bytes));
    record("adam_m.bin", write_synced(tmp / "adam_m.bin", ck.adam_m.data(), bytes));
    record("adam_v.bin", write_synced(tmp / "adam_v.bin", ck.adam_v.data(), bytes));
    maybe_die_mid_write(ck.state.step);
    const json manifest = {{"format", kFormat}, {"version", kFormatVersion}, {"step", ck.state.step},
                           {"files", files}};
    write_synced(tmp / "manifest.json", manifest.dump(2) + "\n");
    sync_directory(tmp);

    fs::remove_all(final_dir, ec);  // the same step saved again (a finished run re-invoked)
    if (fs::rename(tmp, final_dir, ec); ec)
      throw CheckpointError("cannot rename " + tmp.string() + " to " + final_dir.string() + ": " + ec.message());
    sync_directory(root);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }

  // Keep the newest `keep` checkpoints by step (no re-hashing: every one was
  // written by this function); drop older ones and the temporaries of killed writers.
  const auto all = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i) fs::remove_all(all[i]);
  for (const auto& e : fs::directory_iterator(root))
    if (e.is_directory() && is_temporary(e.path().filename().string())) fs::remove_all(e.path());
  return final_dir.string();
}

std::string checkpoint_problem(const std::string& dir) {
  const fs::path d(dir);
  try {
    const json manifest = read_manifest(d);
    for (const char* file : kFiles)  // streamed: a scan over many checkpoints holds none in memory
      if (std::string why = mismatch(file, sum_file(d / file), manifest["files"][file]); !why.empty())
        return why;
  } catch (const json::exception& e) {
    return "manifest.json: " + json_error_text(e);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

Checkpoint load_checkpoint(const std::string& dir) {
  const fs::path d(dir);
  const auto invalid = [&dir](const std::string& why) {
    return CheckpointError("checkpoint " + dir + " is not valid: " + why);
  };
  // Each file is read once, checked against the manifest in memory, then used.
  Checkpoint ck;
  std::vector<char> config_text, state_text;
  try {
    const json manifest = read_manifest(d);
    const auto check = [&](const char* file, const auto& data, uint64_t bytes) {
      if (std::string why = mismatch(file, sum_of(data.data(), bytes), manifest["files"][file]); !why.empty())
        throw CheckpointError(why);
    };
    uint64_t bytes = 0;
    config_text = read_whole<char>(d / "config.json", bytes);
    check("config.json", config_text, bytes);
    state_text = read_whole<char>(d / "state.json", bytes);
    check("state.json", state_text, bytes);
    ck.params = read_whole<float>(d / "params.bin", bytes);
    check("params.bin", ck.params, bytes);
    ck.adam_m = read_whole<float>(d / "adam_m.bin", bytes);
    check("adam_m.bin", ck.adam_m, bytes);
    ck.adam_v = read_whole<float>(d / "adam_v.bin", bytes);
    check("adam_v.bin", ck.adam_v, bytes);
  } catch (const json::exception& e) {
    throw invalid("manifest.json: " + json_error_text(e));
  } catch (const CheckpointError& e) {
    throw invalid(e.what());
  }
  try {
    ck.config = json::parse(config_text.begin(), config_text.end());
    ck.state = state_from_json(json::parse(state_text.begin(), state_text.end()));
  } catch (const json::exception& e) {
    throw CheckpointError("checkpoint " + dir + ": config.json or state.json: " + json_error_text(e));
  }
  if (ck.adam_m.size() != ck.params.size() || ck.adam_v.size() != ck.params.size())
    throw CheckpointError("checkpoint " + dir + ": adam_m.bin / adam_v.bin differ in size from params.bin");
  return ck;
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  const fs::path root = checkpoint_root(run_dir);
  if (!fs::is_directory(root)) return {};
  for (const auto& e : fs::directory_iterator(root)) {
    const int64_t step = step_of(e.path().filename().string());
    if (e.is_directory() && step >= 0) found.emplace_back(step, e.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

std::string latest_checkpoint(const std::string& run_dir, std::vector<std::string>* passed_over) {
  const auto all = list_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const std::string why = checkpoint_problem(*it);
    if (why.empty()) return *it;
    if (passed_over) passed_over->push_back(*it + ": " + why);
  }
  return "";
}

DirLock::DirLock(const std::string& dir) {
  const fs::path path = fs::path(dir) / ".lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_errno("cannot open lock file", path);
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string owner = read_text(path);
    ::close(fd_);
    throw CheckpointError(dir + " is in use by another qattn process (pid " +
                          (owner.empty() ? std::string("unknown") : owner) +
                          "); wait for it to end or stop it first");
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) fail_errno("cannot write", path);
}

DirLock::~DirLock() { ::close(fd_); }  // closing releases the flock

std::string resolve_checkpoint(const std::string& path) {
  if (fs::exists(fs::path(path) / "manifest.json")) return path;
  if (fs::is_directory(checkpoint_root(path))) {
    std::vector<std::string> passed_over;
    const std::string latest = latest_checkpoint(path, &passed_over);
    if (latest.empty()) {
      std::string msg = path + ": the run has no valid checkpoint";
      for (const auto& p : passed_over) msg += "\n  passed over " + p;
      throw CheckpointError(msg);
    }
    // An older checkpoint than the run's newest is used: say so, and why.
    for (const auto& p : passed_over) spdlog::warn("passed over invalid checkpoint {}; using {}", p, latest);
    return latest;
  }
  throw CheckpointError(path + ": neither a checkpoint directory (with manifest.json) nor a run "
                               "directory (with checkpoints/)");
}

std::vector<std::string> config_differences(const json& saved, const json& current) {
  std::map<std::string, std::string> a, b;
  flatten(saved, "", a);
  flatten(current, "", b);
  std::vector<std::string> diffs;
  auto value = [](const std::map<std::string, std::string>& m, const std::string& k) {
    const auto it = m.find(k);
    return it == m.end() ? std::string("(absent)") : it->second;
  };
  std::map<std::string, bool> keys;
  for (const auto& [k, v] : a) keys[k] = true;
  for (const auto& [k, v] : b) keys[k] = true;
  for (const auto& [k, unused] : keys) {
    if (ignored_in_comparison(k)) continue;
    const std::string x = value(a, k), y = value(b, k);
    if (x != y) diffs.push_back(k + ": " + x + " -> " + y);
  }
  return diffs;
}

Config config_of_checkpoint(const json& effective) {
  json j = effective;
  json& t = j["train"];
  t.erase("grad_accum");
  // derive() filled whichever of steps / tokens the user did not give.
  if (t.value("tokens", int64_t{0}) > 0)
    t.erase("steps");
  else
    t.erase("tokens");
  return config_from_json(j);
}

}  // namespace qattn
