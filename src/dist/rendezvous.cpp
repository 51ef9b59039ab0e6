// The TCP rendezvous: rank 0 serves, every other rank connects once.
// Wire format (integers in network byte order):
//   rank -> rank 0: magic, rank, world           (3 x uint32)
//   rank 0 -> rank: status (0 ok, 1 error), n    (2 x uint32), then n bytes:
//                   the payload, or the error message.
// Every blocking call is bounded by the deadline: poll() before each read,
// accept and non-blocking connect.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "qattn/dist.hpp"

namespace qattn {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x71617474;  // "qatt"
constexpr uint32_t kOk = 0, kFailed = 1;

// Closes the descriptor when it goes out of scope.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

std::string errno_text() { return std::strerror(errno); }

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", s);
  return buf;
}

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

// Waits until fd is ready for `events`; false when the deadline passed.
bool wait_ready(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

// Reads exactly n bytes; the error names `what` when the peer closes or the
// deadline passes.
void read_exact(int fd, void* buf, size_t n, Clock::time_point deadline, const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_ready(fd, POLLIN, deadline)) throw DistError(what + ": timed out");
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) throw DistError(what + ": the connection closed");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw DistError(what + ": " + errno_text());
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
}

void write_all(int fd, const void* buf, size_t n, const std::string& what) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw DistError(what + ": " + errno_text());
    }
    p += put;
    n -= static_cast<size_t>(put);
  }
}

void send_reply(int fd, uint32_t status, const std::string& body, const std::string& what) {
  const std::array<uint32_t, 2> head{htonl(status), htonl(static_cast<uint32_t>(body.size()))};
  write_all(fd, head.data(), sizeof(head), what);
  write_all(fd, body.data(), body.size(), what);
}

std::string address(const DistEnv& env) {
  return env.master_addr + ":" + std::to_string(env.master_port);
}

// Rank 0: a listening socket on every interface, retrying while the port is
// still held (a previous job's socket lingering) until the deadline.
Fd listen_socket(const DistEnv& env, Clock::time_point deadline) {
  std::string last;
  do {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) throw DistError("rank 0: socket(): " + errno_text());
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<uint16_t>(env.master_port));
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
        ::listen(fd.get(), env.world) == 0)
      return fd;
    last = errno_text();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (Clock::now() < deadline);
  throw DistError("rank 0: cannot listen on MASTER_PORT " + std::to_string(env.master_port) + ": " +
                  last + " (another job on this port? set MASTER_PORT to a free one)");
}

std::string serve(const DistEnv& env, const std::string& payload, double timeout_s,
                  Clock::time_point deadline) {
  Fd listener = listen_socket(env, deadline);
  std::vector<Fd> peers(env.world);  // by rank; peers[0] unused
  int joined = 1;
  auto fail_all = [&](const std::string& msg) {
    for (auto& p : peers)
      if (p.get() >= 0) {
        try {
          send_reply(p.get(), kFailed, msg, "");
        } catch (const DistError&) {  // that peer is gone already; the others still hear
        }
      }
    throw DistError(msg);
  };
  while (joined < env.world) {
    if (!wait_ready(listener.get(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < env.world; ++r)
        if (peers[r].get() < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail_all("rank 0: rendezvous on port " + std::to_string(env.master_port) + ": rank(s) " +
               missing + " did not join within " + seconds_text(timeout_s));
    }
    Fd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.get() < 0) continue;
    std::array<uint32_t, 3> hello{};
    try {
      read_exact(conn.get(), hello.data(), sizeof(hello), deadline, "rank 0: reading a rank's hello");
    } catch (const DistError&) {
      continue;  // not one of ours (a port scan, a dead client): keep waiting
    }
    const uint32_t magic = ntohl(hello[0]);
    const int rank = static_cast<int>(ntohl(hello[1])), world = static_cast<int>(ntohl(hello[2]));
    if (magic != kMagic) continue;
    if (world != env.world) {
      peers.push_back(std::move(conn));
      fail_all("rank 0: rank " + std::to_string(rank) + " says the world size is " +
               std::to_string(world) + ", rank 0 says " + std::to_string(env.world));
    }
    if (rank <= 0 || rank >= env.world || peers[rank].get() >= 0) {
      peers.push_back(std::move(conn));
      fail_all("rank 0: a second process joined as rank " + std::to_string(rank) +
               " (every rank must be distinct and in [0, " + std::to_string(env.world) + "))");
    }
    peers[rank] = std::move(conn);
    ++joined;
  }
  for (int r = 1; r < env.world; ++r)
    send_reply(peers[r].get(), kOk, payload, "rank 0: sending the rendezvous payload to rank " + std::to_string(r));
  return payload;
}

// A connected socket to rank 0, or an invalid Fd with `error` set.
Fd try_connect(const DistEnv& env, Clock::time_point deadline, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(env.master_port);
  if (const int rc = ::getaddrinfo(env.master_addr.c_str(), port.c_str(), &hints, &found)) {
    error = std::string("cannot resolve MASTER_ADDR: ") + gai_strerror(rc);
    return Fd();
  }
  Fd result;
  for (addrinfo* a = found; a && result.get() < 0; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (fd.get() < 0) continue;
    if (::connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      error = errno_text();
      continue;
    }
    // Bounded connect: at most a second per try so a retry follows.
    const auto slice = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    int so_error = ETIMEDOUT;
    socklen_t len = sizeof(so_error);
    if (wait_ready(fd.get(), POLLOUT, slice))
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      error = std::strerror(so_error);
      continue;
    }
    ::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK);
    result = std::move(fd);
  }
  ::freeaddrinfo(found);
  return result;
}

std::string join(const DistEnv& env, double timeout_s, Clock::time_point deadline) {
  const std::string who = "rank " + std::to_string(env.rank);
  std::string error = "no attempt";
  Fd fd;
  auto pause = std::chrono::milliseconds(50);
  while ((fd = try_connect(env, deadline, error)).get() < 0) {
    if (Clock::now() + pause >= deadline)
      throw DistError(who + ": could not reach rank 0's rendezvous at " + address(env) + " within " +
                      seconds_text(timeout_s) + " (last error: " + error +
                      "); is rank 0 running, and are MASTER_ADDR/MASTER_PORT the same on every rank?");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
  const std::string what = who + ": rendezvous with " + address(env);
  const std::array<uint32_t, 3> hello{htonl(kMagic), htonl(static_cast<uint32_t>(env.rank)),
                                      htonl(static_cast<uint32_t>(env.world))};
  write_all(fd.get(), hello.data(), sizeof(hello), what);
  std::array<uint32_t, 2> head{};
  read_exact(fd.get(), head.data(), sizeof(head), deadline,
             what + " (waiting for every rank to join within " + seconds_text(timeout_s) + ")");
  std::string body(ntohl(head[1]), '\0');
  read_exact(fd.get(), body.data(), body.size(), deadline, what);
  if (ntohl(head[0]) != kOk) throw DistError(who + ": rendezvous failed: " + body);
  return body;
}

}  // namespace

std::string rendezvous(const DistEnv& env, const std::string& payload, double timeout_s) {
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (env.world == 1) return payload;
  return env.rank == 0 ? serve(env, payload, timeout_s, deadline) : join(env, timeout_s, deadline);
}

int free_tcp_port() {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd.get() < 0 || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw DistError("cannot find a free TCP port on 127.0.0.1: " + errno_text());
  return ntohs(a.sin_port);
}

}  // namespace qattn
