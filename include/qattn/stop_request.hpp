// A request to stop, shared by whoever receives it (the command line's
// SIGINT/SIGTERM handling) and the loops that poll it (training steps,
// evaluation batches, sweeps). A first request asks the loop to stop at its
// next safe point; a second one means now: the listener records what it must
// (the trainer writes its final status.json), then the process exits.
#pragma once
#include <atomic>
#include <functional>
#include <mutex>

namespace qattn {

class StopRequest {
 public:
  bool requested() const { return requested_.load(); }
  void request() { requested_.store(true); }
  void clear() { requested_.store(false); }

  // The listener is told of each request as it arrives (now = false: the
  // first, now = true: a second one, just before the process exits); it runs
  // on the thread that received the request. Replaces the previous listener;
  // nullptr removes it, after which it is never called again.
  void set_listener(std::function<void(bool now)> listener);
  // Calls the listener; false when there is none.
  bool notify(bool now);

 private:
  std::atomic<bool> requested_{false};
  std::mutex mutex_;
  std::function<void(bool)> listener_;
};

// Sets a listener for the lifetime of a scope.
class StopListener {
 public:
  StopListener(StopRequest* stop, std::function<void(bool now)> listener) : stop_(stop) {
    if (stop_) stop_->set_listener(std::move(listener));
  }
  ~StopListener() {
    if (stop_) stop_->set_listener(nullptr);
  }
  StopListener(const StopListener&) = delete;
  StopListener& operator=(const StopListener&) = delete;

 private:
  StopRequest* stop_;
};

}  // namespace qattn
