// SIGINT / SIGTERM -> a flag the training loop and the sweep poll, so that a
// stop request ends in a final checkpoint instead of lost work. A second
// signal of the same kind acts as usual (the handler is one-shot).
#pragma once
#include <atomic>

namespace qattn::cli {

// Installs the one-shot handlers; returns the flag they set.
const std::atomic<bool>& install_stop_handlers();

}  // namespace qattn::cli
