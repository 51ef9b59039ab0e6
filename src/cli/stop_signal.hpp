// SIGINT / SIGTERM -> a StopRequest that the training loop, the evaluation
// and the sweep poll, so that a stop request ends in a final checkpoint
// instead of lost work. The handler only writes the signal into a pipe; a
// thread reads it and, on the first signal, sets the request and has it
// acknowledged at once (the listener's words, or a line of its own); on a
// second signal it lets the listener record what it must and exits with
// code 4 at once.
#pragma once
#include "qattn/stop_request.hpp"

namespace qattn::cli {

// Installs the handlers and starts the thread (once per process); returns the request they set.
StopRequest& install_stop_handlers();

}  // namespace qattn::cli
