#include "qattn/stop_request.hpp"

namespace qattn {

void StopRequest::set_listener(std::function<void(bool)> listener) {
  const std::lock_guard<std::mutex> lock(mutex_);  // waits for a call in flight
  listener_ = std::move(listener);
}

bool StopRequest::notify(bool now) {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (!listener_) return false;
  listener_(now);
  return true;
}

}  // namespace qattn
