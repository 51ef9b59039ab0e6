#include "stop_signal.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

#include "qattn/trainer.hpp"

namespace qattn::cli {

namespace {

int g_pipe[2] = {-1, -1};

// Async-signal-safe: one byte into the pipe, errno kept.
extern "C" void on_stop_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_pipe[1], &byte, 1);
  errno = saved;
}

void watch_signals(StopRequest* stop) {
  for (int count = 0;;) {
    unsigned char sig = 0;
    const ssize_t n = ::read(g_pipe[0], &sig, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    const char* name = sig == SIGINT ? "SIGINT" : "SIGTERM";
    if (++count == 1) {
      stop->request();
      if (!stop->notify(false))
        spdlog::warn("{}: stopping at the next safe point; a second signal stops at once", name);
      continue;
    }
    if (!stop->notify(true)) spdlog::warn("{} again: stopping at once", name);
    std::fflush(nullptr);
    ::_exit(kExitInterrupted);
  }
}

}  // namespace

StopRequest& install_stop_handlers() {
  static StopRequest stop;
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_pipe, O_CLOEXEC) != 0)
      throw std::runtime_error(std::string("cannot create the signal pipe: ") + std::strerror(errno));
    struct sigaction sa{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGINT, &sa, nullptr);
    ::sigaction(SIGTERM, &sa, nullptr);
    std::thread(watch_signals, &stop).detach();
  });
  return stop;
}

}  // namespace qattn::cli
