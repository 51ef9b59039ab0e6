// Helpers for the run-level tests (checkpoints, sweeps, model files): a tiny
// corpus and config, and `qattn` as a child process with extra environment.
#pragma once
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "qattn/data.hpp"
#include "qattn/model.hpp"

namespace qattn::test {

namespace fs = std::filesystem;

// A fresh scratch directory per test and process.
inline fs::path scratch_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("qattn_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Every parameter of model m drawn from N(0, sigma²) (model-file round trips).
inline std::vector<float> random_params(const ModelConfig& m, float sigma, unsigned seed = 5) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> p(ParamLayout(m).total);
  for (float& x : p) x = normal(rng);
  return p;
}

// Byte-level text with some structure: shards s_val_000000.bin and s_train_000001.bin in d.
inline void make_corpus(const fs::path& d) {
  std::vector<uint16_t> t;
  for (int i = 0; t.size() < 12000; ++i)
    for (char c : "the cat sat on the mat " + std::to_string(i % 5) + ". ") t.push_back(static_cast<uint8_t>(c));
  write_shard((d / "s_val_000000.bin").string(), t.data(), 3000);
  write_shard((d / "s_train_000001.bin").string(), t.data() + 3000, t.size() - 3000);
}

// A model small enough that a step takes a few milliseconds.
inline nlohmann::json tiny_config(const fs::path& d, const std::string& name, int steps) {
  return {{"model", {{"vocab", 257}, {"layers", 1}, {"heads", 2}, {"dim", 16}, {"seq_len", 16}}},
          {"data", {{"train", (d / "s_train_*.bin").string()}, {"val", (d / "s_val_*.bin").string()}}},
          {"train", {{"tokens_per_step", 128}, {"micro_batch", 4}, {"steps", steps}, {"lr", 1e-2},
                     {"warmup", 2}, {"device", "cpu"}, {"checkpoint_every", 4}, {"keep_checkpoints", 3}}},
          {"eval", {{"every", 4}, {"batches", 2}}},
          {"log", {{"out", (d / "runs").string()}, {"name", name}, {"every", 1000}}}};
}

inline fs::path write_json(const fs::path& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
  return path;
}

// step,tokens,lr,train_loss,val_loss,grad_norm of every metrics row: the
// columns that must not change when a run is interrupted and resumed.
inline std::vector<std::string> loss_columns(const fs::path& csv) {
  std::ifstream f(csv);
  std::string line;
  std::vector<std::string> out;
  std::getline(f, line);
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    std::string field, kept;
    for (int c = 0; c < 6 && std::getline(ss, field, ','); ++c) kept += field + ",";
    out.push_back(kept);
  }
  return out;
}

// Starts `qattn ARGS...` with extra environment variables, output appended to
// log, in the folder cwd (this process's when empty).
inline pid_t spawn_qattn(const std::vector<std::string>& args,
                         const std::vector<std::pair<std::string, std::string>>& env, const fs::path& log,
                         const fs::path& cwd = {}) {
  std::fflush(nullptr);  // else the child's freopen writes the parent's buffered output again
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
  FILE* out = std::freopen(log.c_str(), "a", stdout);
  if (out) ::dup2(::fileno(stdout), STDERR_FILENO);
  for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
  ::setenv("OMP_NUM_THREADS", "1", 1);
  std::vector<std::string> argv = {QATTN_BINARY};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execv(cargv[0], cargv.data());
  ::_exit(127);
}

// Runs qattn to the end; returns the raw wait status.
inline int run_qattn(const std::vector<std::string>& args,
                     const std::vector<std::pair<std::string, std::string>>& env, const fs::path& log) {
  int status = 0;
  ::waitpid(spawn_qattn(args, env, log), &status, 0);
  return status;
}

inline int exit_code(int wait_status) { return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1; }

// What `qattn ARGS...` printed (stdout and stderr) and its exit code (-1 when killed).
struct Outcome {
  int code;
  std::string output;
};
inline Outcome qattn_outcome(const std::vector<std::string>& args, const fs::path& log,
                             const std::vector<std::pair<std::string, std::string>>& env = {}) {
  fs::remove(log);
  const int status = run_qattn(args, env, log);
  std::ifstream f(log);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(std::istreambuf_iterator<char>(f), {})};
}

// Text that only a library or the OS writes, never a message of qattn's own:
// it means an exception reached the user without saying which file, key or
// argument it was about.
inline std::string raw_library_text(const std::string& output) {
  for (const char* raw : {"json.exception", "filesystem error", "basic_filebuf", "basic_ios", "std::", "stoi",
                          "stol", "stod", "bad_alloc", "vector::", "terminate called", "what():", "Could not convert"})
    if (output.find(raw) != std::string::npos) return raw;
  return "";
}

inline std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// The names in a folder, sorted (what a failed command must not have added to).
inline std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  if (fs::is_directory(dir))
    for (const auto& e : fs::recursive_directory_iterator(dir)) names.push_back(fs::relative(e.path(), dir).string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace qattn::test
