// The local launcher: N worker processes on this node, their exit codes, the
// signals the user sends, and no survivors once one of them failed.
#include <spdlog/spdlog.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "qattn/dist.hpp"

extern char** environ;

namespace qattn {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<int> g_signal{0};  // the last SIGINT/SIGTERM the launcher received, 0 when none
static_assert(std::atomic<int>::is_always_lock_free, "set from a signal handler");

extern "C" void remember_signal(int sig) { g_signal.store(sig); }

// Installs the forwarding handlers for the launcher's lifetime.
class SignalForwarding {
 public:
  SignalForwarding() {
    struct sigaction sa{};
    sa.sa_handler = remember_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    g_signal.store(0);
  }
  ~SignalForwarding() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  int take() { return g_signal.exchange(0); }

 private:
  struct sigaction old_int_{}, old_term_{};
};

// The parent's environment with the rank variables replaced.
std::vector<std::string> worker_environment(const LaunchOptions& o, int port, int rank) {
  const std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(rank)},        {"LOCAL_RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(o.nproc)}, {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
      {"MASTER_ADDR", o.master_addr},       {"MASTER_PORT", std::to_string(port)}};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    const std::string kv(*e);
    bool replaced = false;
    for (const auto& [k, v] : set) replaced = replaced || kv.rfind(k + "=", 0) == 0;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> out;
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// fork + execvpe; everything the child needs is prepared before the fork, so
// the child calls only async-signal-safe functions.
pid_t spawn(std::vector<std::string> argv, std::vector<std::string> env) {
  std::vector<char*> cargv = c_strings(argv), cenv = c_strings(env);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw DistError(std::string("launcher: fork(): ") + std::strerror(errno));
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl took effect
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execvpe(cargv[0], cargv.data(), cenv.data());
    const char msg[] = "launcher: cannot execute the worker program\n";
    [[maybe_unused]] const auto n = ::write(2, msg, sizeof(msg) - 1);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so the group exists before the first kill
  return pid;
}

int exit_code(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

}  // namespace

int launch_workers(const LaunchOptions& o) {
  if (o.nproc < 1) throw DistError("--nproc " + std::to_string(o.nproc) + ": allowed: an integer >= 1");
  if (o.argv.empty()) throw DistError("launcher: no worker command");
  const int port = o.master_port > 0 ? o.master_port : free_tcp_port();
  SignalForwarding signals;
  std::vector<pid_t> pids(o.nproc, -1);  // -1 once reaped
  for (int r = 0; r < o.nproc; ++r) pids[r] = spawn(o.argv, worker_environment(o, port, r));
  spdlog::info("launcher: {} workers on {}:{} ({})", o.nproc, o.master_addr, port, o.argv[0]);

  int live = o.nproc, failure = 0;
  bool stopping = false;  // the user's signal was forwarded: workers are ending on their own
  Clock::time_point kill_at = Clock::time_point::max();
  auto signal_live = [&](int sig) {
    for (pid_t p : pids)
      if (p > 0) ::kill(-p, sig);
  };
  while (live > 0) {
    if (const int sig = signals.take()) {
      spdlog::warn("launcher: forwarding signal {} to the workers", sig);
      signal_live(sig);
      stopping = true;
    }
    for (int r = 0; r < o.nproc; ++r) {
      int status = 0;
      if (pids[r] <= 0 || ::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      pids[r] = -1;
      --live;
      const int code = exit_code(status);
      if (code == 0 || failure != 0) continue;
      failure = code;
      // After a forwarded signal the others are writing their last state:
      // leave them be (another signal from the user still reaches them).
      if (live > 0 && !stopping) {
        spdlog::error("launcher: rank {} {} {}; stopping the other {} worker(s) (SIGTERM, SIGKILL after {} s)",
                      r, WIFSIGNALED(status) ? "was killed by signal" : "exited with code",
                      WIFSIGNALED(status) ? WTERMSIG(status) : code, live, o.grace_s);
        signal_live(SIGTERM);
        kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(o.grace_s));
      }
    }
    if (Clock::now() >= kill_at) {
      spdlog::error("launcher: {} worker(s) still running {} s after SIGTERM; sending SIGKILL", live, o.grace_s);
      signal_live(SIGKILL);
      kill_at = Clock::time_point::max();
    }
    if (live > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return failure;
}

}  // namespace qattn
