// qattn sweep SWEEP.json [--dry-run] [--summary] [--gpus LIST | --jobs N] [--start-until EPOCH_S]
// Runs every run of a sweep as a child `qattn train` process (stdout and
// stderr to <run>/console.log): one per GPU with CUDA_VISIBLE_DEVICES when
// --gpus is given, else N at a time on the CPU. Finished and diverged runs are
// skipped, the others (re)started; `qattn train` resumes from their checkpoints.
// --start-until starts no run after that time and lets the running ones
// finish: a machine lent for a fixed time runs only runs that can end on it.
// Exit codes: 0 all runs finished or diverged, 1 some failed or were busy
// (another process holds their run directory), 2 bad sweep or config, 4
// stopped by SIGINT/SIGTERM (running children checkpoint first) or runs left
// unstarted by --start-until.
#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "checks.hpp"
#include "commands.hpp"
#include "qattn/atomic_file.hpp"
#include "qattn/checkpoint.hpp"
#include "qattn/config.hpp"
#include "qattn/sweep.hpp"
#include "qattn/trainer.hpp"
#include "stop_signal.hpp"

namespace qattn::cli {

namespace {

namespace fs = std::filesystem;

bool done(const RunOutcome& o) { return o.status == "finished" || o.status == "diverged"; }

std::vector<std::string> parse_gpus(const std::string& list) {
  std::vector<std::string> gpus;
  std::stringstream ss(list);
  for (std::string g; std::getline(ss, g, ',');) {
    if (g.empty() || g.find_first_not_of("0123456789") != std::string::npos)
      throw CLI::ValidationError("--gpus", "'" + list + "' is not allowed; allowed: device indices like 0,1,2");
    gpus.push_back(g);
  }
  return gpus;
}

// Why a run's directory is busy ("" when it is free): a `qattn train` still
// holds its lock, for instance one a killed sweep left behind.
std::string run_in_use(const Sweep& s, const SweepRun& r) {
  const fs::path dir = fs::path(s.dir()) / r.id;
  if (!fs::exists(dir)) return "";
  try {
    const DirLock probe(dir.string());
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// Starts `qattn train` for one run; returns the child's pid.
pid_t launch(const Sweep& s, const SweepRun& r, const std::string& gpu, int omp_threads) {
  const fs::path dir = fs::path(s.dir()) / r.id;
  fs::create_directories(dir);
  std::vector<std::string> argv = {"/proc/self/exe", "train", s.base};
  for (const auto& a : train_assignments(s, r)) argv.insert(argv.end(), {"--set", a});
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error(std::string("sweep: fork failed: ") + std::strerror(errno));
  if (pid > 0) return pid;
  // Child: output to console.log, the device or thread count through the environment.
  const int fd = ::open((dir / "console.log").c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::close(fd);
  }
  if (!gpu.empty()) ::setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1);
  if (omp_threads > 0) ::setenv("OMP_NUM_THREADS", std::to_string(omp_threads).c_str(), 1);
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  ::execv(cargv[0], cargv.data());
  std::perror("sweep: exec of qattn failed");
  ::_exit(127);
}

std::string describe_exit(int wstatus) {
  if (WIFSIGNALED(wstatus)) return "killed by signal " + std::to_string(WTERMSIG(wstatus));
  return "exit code " + std::to_string(WEXITSTATUS(wstatus));
}

// Records a child that ended without a status of its own (config error, crash).
void mark_failed(const std::string& run_dir, const std::string& why) {
  // Atomic like the trainer's own status writes: a reader never sees half a file.
  write_file_atomically((fs::path(run_dir) / "status.json").string(), [&](std::ostream& f) {
    f << nlohmann::json{{"status", "failed"}, {"reason", why + "; see console.log"}}.dump(2) << '\n';
  });
}

// What check_run_inputs finds wrong with a run's data and model.init_from ("" when nothing).
std::string input_problem(const Config& cfg) {
  try {
    check_run_inputs(cfg, 1);
  } catch (const std::runtime_error& e) {
    if (!is_input_error(e)) throw;
    return e.what();
  }
  return "";
}

void print_plan(const Sweep& s, const std::vector<RunOutcome>& outcomes) {
  std::cout << "sweep " << s.name << ": " << s.runs.size() << " runs in " << s.dir() << " (base " << s.base << ")\n";
  for (size_t i = 0; i < s.runs.size(); ++i) {
    const auto& r = s.runs[i];
    const std::string action = done(outcomes[i]) ? "skip (" + outcomes[i].status + ")"
                               : outcomes[i].status == "pending" ? "run"
                                                                 : "resume (" + outcomes[i].status + ")";
    std::cout << "  " << r.id << (r.is_baseline ? "  [baseline]" : "") << "  -> " << action << "\n     ";
    for (const auto& a : train_assignments(s, r)) std::cout << " --set " << a;
    std::cout << '\n';
  }
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  struct Args {
    std::string sweep, gpus;
    int jobs = 1;
    int64_t start_until = 0;
    bool dry_run = false, summary_only = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("sweep", "Run a grid of configs (resumable, parallel) and summarise it");
  cmd->add_option("sweep", args->sweep, "sweep file (JSON)")->required()->check(nonempty_path());
  cmd->add_flag("--dry-run", args->dry_run, "validate every run's config and list the runs; start nothing");
  cmd->add_flag("--summary", args->summary_only, "only regenerate summary.csv and summary.md");
  auto* gpus = cmd->add_option("--gpus", args->gpus, "GPUs to use, one run per GPU at a time: 0,1,2,3");
  cmd->add_option("--jobs", args->jobs, "CPU runs at a time (without --gpus)")
      ->check(integer_range(1, 1024))
      ->excludes(gpus)
      ->capture_default_str();
  cmd->add_option("--start-until", args->start_until,
                  "start no run after this time (seconds since the epoch, `date +%s`); running runs finish")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->callback([args] {
    Sweep s;
    try {
      s = load_sweep(args->sweep);
    } catch (const SweepError& e) {
      spdlog::error("{}", e.what());
      throw CLI::RuntimeError(kExitBadInput);
    }
    auto outcomes = [&] {
      std::vector<RunOutcome> o;
      for (const auto& r : s.runs) o.push_back(read_outcome((fs::path(s.dir()) / r.id).string(), s.eval_last));
      return o;
    };
    if (args->summary_only) {
      std::cout << write_summary(s, outcomes());
      return;
    }
    // Every config, and the data it names, is validated before anything starts;
    // runs that name the same data, shapes and evaluation length share one check.
    std::vector<std::string> errors;
    std::map<std::string, std::string> input_problems;  // data, model, batch sizes -> error ("" when none)
    for (const auto& r : s.runs) {
      try {
        const Config cfg = load_config(s.base, train_assignments(s, r));
        const std::string inputs = cfg.effective["data"].dump() + cfg.effective["model"].dump() +
                                   std::to_string(cfg.train.micro_batch) + " " + std::to_string(cfg.eval.batches);
        const auto [it, fresh] = input_problems.try_emplace(inputs);
        if (fresh) it->second = input_problem(cfg);
        if (!it->second.empty()) errors.push_back("run " + r.id + ": " + it->second);
      } catch (const std::exception& e) {
        errors.push_back("run " + r.id + ": " + e.what());
      }
    }
    for (const auto& e : errors) spdlog::error("{}", e);
    if (!errors.empty()) throw CLI::RuntimeError(kExitBadInput);
    if (args->dry_run) {
      print_plan(s, outcomes());
      return;
    }

    fs::create_directories(s.dir());
    const DirLock lock(s.dir());  // a second `qattn sweep` of this sweep would start the same runs
    const std::vector<std::string> slots = args->gpus.empty() ? std::vector<std::string>(args->jobs, "")
                                                              : parse_gpus(args->gpus);
    const char* omp_env = std::getenv("OMP_NUM_THREADS");
    const int omp_threads = (args->gpus.empty() && !omp_env && args->jobs > 1)
                                ? std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / args->jobs)
                                : 0;
    std::vector<size_t> queue;
    const auto before = outcomes();
    for (size_t i = 0; i < s.runs.size(); ++i)
      if (!done(before[i])) queue.push_back(i);
    spdlog::info("sweep {}: {} runs, {} to run, {} at a time{}", s.name, s.runs.size(), queue.size(), slots.size(),
                 args->gpus.empty() ? "" : " (GPUs " + args->gpus + ")");

    StopRequest& stop = install_stop_handlers();
    std::map<pid_t, std::pair<size_t, size_t>> running;  // pid -> (run, slot)
    std::mutex running_mutex;                            // the signal thread reads `running` on a second signal
    // A first signal is forwarded by the loop below; a second one reaches the
    // running runs at once too, which then stop without a final checkpoint.
    const StopListener listener(&stop, [&](bool now) {
      if (!now) return;
      const std::lock_guard<std::mutex> lock(running_mutex);
      for (const auto& [pid, unused] : running) ::kill(pid, SIGTERM);
      spdlog::warn("second stop signal: {} running runs asked to stop at once; exiting", running.size());
    });
    std::vector<bool> busy(slots.size(), false);
    size_t next = 0, failed = 0, finished_count = 0, busy_runs = 0;
    bool forwarded = false;
    const auto may_start = [&] {
      return !stop.requested() && (args->start_until == 0 ||
                       std::chrono::system_clock::now() < std::chrono::system_clock::time_point(
                                                              std::chrono::seconds(args->start_until)));
    };
    while ((may_start() && next < queue.size()) || !running.empty()) {
      while (may_start() && next < queue.size() && running.size() < slots.size()) {
        const size_t slot = std::find(busy.begin(), busy.end(), false) - busy.begin();
        const SweepRun& r = s.runs[queue[next]];
        if (const std::string owner = run_in_use(s, r); !owner.empty()) {
          spdlog::warn("skip {}: {}", r.id, owner);  // e.g. left running by a sweep that was killed
          ++busy_runs;
          ++next;
          continue;
        }
        const std::lock_guard<std::mutex> lock(running_mutex);
        const pid_t pid = launch(s, r, slots[slot], omp_threads);
        busy[slot] = true;
        running[pid] = {queue[next++], slot};
        spdlog::info("start {}{} (pid {})", r.id, slots[slot].empty() ? "" : " on GPU " + slots[slot], pid);
      }
      if (stop.requested() && !forwarded) {  // children of a terminal's Ctrl-C got SIGINT already; a second request is harmless
        for (const auto& [pid, unused] : running) ::kill(pid, SIGTERM);
        forwarded = true;
        spdlog::warn("stop requested: waiting for {} running runs to checkpoint", running.size());
      }
      // Poll: the stop handler restarts system calls (SA_RESTART), so a
      // blocking wait would not see a stop request until a run ended.
      int wstatus = 0;
      const pid_t pid = ::waitpid(-1, &wstatus, WNOHANG);
      if (pid == 0) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      if (pid < 0) {
        if (errno == EINTR) continue;
        break;
      }
      std::unique_lock<std::mutex> lock(running_mutex);
      const auto it = running.find(pid);
      if (it == running.end()) continue;
      const auto [run, slot] = it->second;
      running.erase(it);
      lock.unlock();
      busy[slot] = false;
      const std::string dir = (fs::path(s.dir()) / s.runs[run].id).string();
      const int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
      if (code != 0 && code != kExitDiverged && code != kExitInterrupted) {
        mark_failed(dir, describe_exit(wstatus));
        ++failed;
      }
      const RunOutcome o = read_outcome(dir, s.eval_last);
      ++finished_count;
      spdlog::info("[{}/{}] {}: {}{}{}", finished_count, queue.size(), s.runs[run].id, o.status,
                   std::isfinite(o.final_val_loss) ? fmt::format(", val loss {:.4f}", o.final_val_loss) : "",
                   o.reason.empty() ? "" : " (" + o.reason + ")");
    }
    const std::string md = write_summary(s, outcomes());
    std::cout << md.substr(0, md.find("\n## Runs")) << '\n';
    spdlog::info("summary: {}/summary.md, {}/summary.csv", s.dir(), s.dir());
    if (stop.requested()) throw CLI::RuntimeError(kExitInterrupted);
    if (next < queue.size()) {
      spdlog::warn("--start-until passed: {} runs not started; run the sweep again to start them", queue.size() - next);
      throw CLI::RuntimeError(kExitInterrupted);
    }
    if (failed || busy_runs) {
      if (failed) spdlog::error("{} runs failed; see their console.log", failed);
      if (busy_runs) spdlog::error("{} runs are in use by other processes; run the sweep again when they end", busy_runs);
      throw CLI::RuntimeError(1);
    }
  });
}

}  // namespace qattn::cli
